// Trace events of the modelled hardware and kernel: what happened, where, when (modelled
// µs) and when for real (performance.now() ms). The fault library turns them into stats
// and Chrome trace-event JSON.

export type TraceKind =
  | 'post'
  | 'block'
  | 'fault'
  | 'irq'
  | 'notify'
  | 'notify-dropped'
  | 'resolved'
  | 'nack'
  | 'retransmit'
  /** A retransmitted block acknowledged: its copy is done (detail.thread: the copy thread). */
  | 'ack'
  | 'stall'
  | 'resume'
  | 'complete';

export interface TraceEvent {
  kind: TraceKind;
  node: number;
  /** Transfer id (per source node) and channel, where known. */
  tid?: number;
  channel?: number;
  side?: 'source' | 'destination';
  /** Modelled time, µs. */
  modelUs: number;
  /** Real time, performance.now() ms. */
  realMs: number;
  detail?: Record<string, unknown>;
}

export type TraceListener = (e: TraceEvent) => void;

export class Tracer {
  #listeners: TraceListener[] = [];

  on(listener: TraceListener): () => void {
    this.#listeners.push(listener);
    return () => {
      this.#listeners = this.#listeners.filter((l) => l !== listener);
    };
  }

  get active(): boolean {
    return this.#listeners.length > 0;
  }

  emit(e: Omit<TraceEvent, 'realMs'>): void {
    if (!this.#listeners.length) return;
    const ev = { ...e, realMs: performance.now() } as TraceEvent;
    for (const l of this.#listeners) l(ev);
  }
}
