// Fault statistics: counts by side and kind, pages made resident, retransmitted blocks, and
// time per phase (detect → notify → resolve → retransmit) as log2 histograms, real and
// modelled, in the package's one latency histogram (lib/latency.ts).
import { Histogram } from '../latency.js';

/** A phase of a fault: detected by the SMMU, notified over netlink, resolved by the library, retransmitted by the engine. */
export type Phase = 'detect' | 'notify' | 'resolve' | 'retransmit';
/** The phases in order. */
export const PHASES: readonly Phase[] = ['detect', 'notify', 'resolve', 'retransmit'];

/** A copy of FaultStats' figures at one moment. */
export interface FaultStatsSnapshot {
  /** Faults by side, and by SMMU event kind. */
  faults: {
    /** Faults at the source side. */
    source: number;
    /** Faults at the destination side. */
    destination: number;
    /** Faults by SMMU event name (e.g. F_TRANSLATION). */
    byKind: Record<string, number>;
  };
  /** Netlink notifications received. */
  notifications: number;
  /** Pages made resident. */
  pagesMadeResident: number;
  /** Pages a page store supplied while resolving (remote-paged regions): major faults. */
  majorFaults: number;
  /** Calls that made pages resident (touch runs, get_user_pages calls). */
  resolveCalls: number;
  /** Blocks retransmitted after a resolution. */
  retransmittedBlocks: number;
  /** Faults the library could not resolve. */
  unresolved: number;
  /** Real µs of each phase (measured) and modelled µs (cost model). */
  phases: {
    /** Measured time per phase. */
    real: Record<Phase, ReturnType<Histogram['summary']>>;
    /** Modelled time per phase. */
    model: Record<Phase, ReturnType<Histogram['summary']>>;
  };
}

/** Fault counters and per-phase latency histograms of one fault library or registration. */
export class FaultStats {
  /** Faults by side. */
  faults = {
    /** Faults at the source side. */
    source: 0,
    /** Faults at the destination side. */
    destination: 0,
  };
  /** Faults by SMMU event name. */
  byKind: Record<string, number> = {};
  /** Netlink notifications received. */
  notifications = 0;
  /** Pages made resident. */
  pagesMadeResident = 0;
  /** Pages a page store supplied (remote paging). */
  majorFaults = 0;
  /** Calls that made pages resident. */
  resolveCalls = 0;
  /** Blocks retransmitted after a resolution. */
  retransmittedBlocks = 0;
  /** Faults the library could not resolve. */
  unresolved = 0;
  /** Measured time per phase, µs. */
  readonly real: Record<Phase, Histogram> = {
    detect: new Histogram(),
    notify: new Histogram(),
    resolve: new Histogram(),
    retransmit: new Histogram(),
  };
  /** Modelled time per phase, µs. */
  readonly model: Record<Phase, Histogram> = {
    detect: new Histogram(),
    notify: new Histogram(),
    resolve: new Histogram(),
    retransmit: new Histogram(),
  };

  /** The figures now, as plain data. */
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
