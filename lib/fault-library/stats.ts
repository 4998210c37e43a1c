// Fault statistics: counts by side and kind, pages made resident, retransmitted blocks, and
// time per phase (detect → notify → resolve → retransmit) as log2 histograms, real and
// modelled, in the package's one latency histogram (lib/latency.ts).
import { Histogram } from '../latency.js';

export type Phase = 'detect' | 'notify' | 'resolve' | 'retransmit';
export const PHASES: readonly Phase[] = ['detect', 'notify', 'resolve', 'retransmit'];

export interface FaultStatsSnapshot {
  faults: { source: number; destination: number; byKind: Record<string, number> };
  notifications: number;
  pagesMadeResident: number;
  /** Pages a page store supplied while resolving (remote-paged regions): major faults. */
  majorFaults: number;
  resolveCalls: number;
  retransmittedBlocks: number;
  unresolved: number;
  /** Real µs of each phase (measured) and modelled µs (cost model). */
  phases: { real: Record<Phase, ReturnType<Histogram['summary']>>; model: Record<Phase, ReturnType<Histogram['summary']>> };
}

export class FaultStats {
  faults = { source: 0, destination: 0 };
  byKind: Record<string, number> = {};
  notifications = 0;
  pagesMadeResident = 0;
  majorFaults = 0;
  resolveCalls = 0;
  retransmittedBlocks = 0;
  unresolved = 0;
  readonly real: Record<Phase, Histogram> = {
    detect: new Histogram(),
    notify: new Histogram(),
    resolve: new Histogram(),
    retransmit: new Histogram(),
  };
  readonly model: Record<Phase, Histogram> = {
    detect: new Histogram(),
    notify: new Histogram(),
    resolve: new Histogram(),
    retransmit: new Histogram(),
  };

  snapshot(): FaultStatsSnapshot {
    const sum = (h: Record<Phase, Histogram>) =>
      Object.fromEntries(PHASES.map((p) => [p, h[p].summary()])) as Record<Phase, ReturnType<Histogram['summary']>>;
    return {
      faults: { ...this.faults, byKind: { ...this.byKind } },
      notifications: this.notifications,
      pagesMadeResident: this.pagesMadeResident,
      majorFaults: this.majorFaults,
      resolveCalls: this.resolveCalls,
      retransmittedBlocks: this.retransmittedBlocks,
      unresolved: this.unresolved,
      phases: { real: sum(this.real), model: sum(this.model) },
    };
  }
}
