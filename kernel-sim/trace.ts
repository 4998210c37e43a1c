// Trace events of the modelled hardware and kernel: what happened, where, when (modelled
// µs) and when for real (performance.now() ms). The fault library turns them into stats
// and Chrome trace-event JSON.

/** What happened, in the order of a fault's life: issued, faulted, notified, resolved, retransmitted, completed…. */
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

/** One model event. */
export interface TraceEvent {
  /** What happened. */
  kind: TraceKind;
  /** Node it happened on. */
  node: number;
  /** Transfer id (per source node) and channel, where known. */
  tid?: number;
  /** Engine channel, where known. */
  channel?: number;
  /** Side of the transfer, where it applies. */
  side?: 'source' | 'destination';
  /** Modelled time, µs. */
  modelUs: number;
  /** Real time, performance.now() ms. */
  realMs: number;
  /** Extra fields of the event. */
  detail?: Record<string, unknown>;
}

/** Receives every model event. */
export type TraceListener = (e: TraceEvent) => void;

/** Fans model events out to listeners; costs nothing while none listens. */
export class Tracer {
  #listeners: TraceListener[] = [];

  /** Listen to every event; returns the function that stops listening. */
  on(listener: TraceListener): () => void {
    this.#listeners.push(listener);
    return () => {
      this.#listeners = this.#listeners.filter((l) => l !== listener);
    };
  }

  /** True while someone listens. */
  get active(): boolean {
    return this.#listeners.length > 0;
  }

  /** Send an event to every listener (stamped with the real time). */
  emit(e: Omit<TraceEvent, 'realMs'>): void {
    if (!this.#listeners.length) return;
    const ev = { ...e, realMs: performance.now() } as TraceEvent;
    for (const l of this.#listeners) l(ev);
  }
}
