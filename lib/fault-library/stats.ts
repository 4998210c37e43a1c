// Fault statistics: counts by side and kind, pages made resident, retransmitted blocks, and
// time per phase (detect → notify → resolve → retransmit) as log2 histograms, real and
// modelled.

/** A log2-bucketed histogram of µs values. */
export class Histogram {
  readonly buckets: number[] = []; // bucket i: [2^(i-1), 2^i) µs, bucket 0: < 1 µs
  count = 0;
  sum = 0;
  min = Infinity;
  max = 0;
  #values: number[] = [];

  add(us: number): void {
    if (!Number.isFinite(us) || us < 0) return;
    const i = us < 1 ? 0 : Math.floor(Math.log2(us)) + 1;
    while (this.buckets.length <= i) this.buckets.push(0);
    this.buckets[i]!++;
    this.count++;
    this.sum += us;
    this.min = Math.min(this.min, us);
    this.max = Math.max(this.max, us);
    if (this.#values.length < 100_000) this.#values.push(us);
  }

  get mean(): number {
    return this.count ? this.sum / this.count : 0;
  }

  /** Quantile q in [0, 1] of the recorded values (first 100 000 kept). */
  quantile(q: number): number {
    if (!this.#values.length) return 0;
    const v = [...this.#values].sort((a, b) => a - b);
    return v[Math.min(v.length - 1, Math.floor(q * v.length))]!;
  }

  summary(): { count: number; mean: number; p50: number; p99: number; min: number; max: number } {
    return { count: this.count, mean: this.mean, p50: this.quantile(0.5), p99: this.quantile(0.99), min: this.count ? this.min : 0, max: this.max };
  }
}

export type Phase = 'detect' | 'notify' | 'resolve' | 'retransmit';
export const PHASES: readonly Phase[] = ['detect', 'notify', 'resolve', 'retransmit'];

export interface FaultStatsSnapshot {
  faults: { source: number; destination: number; byKind: Record<string, number> };
  notifications: number;
  pagesMadeResident: number;
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
  resolveCalls = 0;
  retransmittedBlocks = 0;
  unresolved = 0;
  readonly real: Record<Phase, Histogram> = { detect: new Histogram(), notify: new Histogram(), resolve: new Histogram(), retransmit: new Histogram() };
  readonly model: Record<Phase, Histogram> = { detect: new Histogram(), notify: new Histogram(), resolve: new Histogram(), retransmit: new Histogram() };

  snapshot(): FaultStatsSnapshot {
    const sum = (h: Record<Phase, Histogram>) =>
      Object.fromEntries(PHASES.map((p) => [p, h[p].summary()])) as Record<Phase, ReturnType<Histogram['summary']>>;
    return {
      faults: { ...this.faults, byKind: { ...this.byKind } },
      notifications: this.notifications,
      pagesMadeResident: this.pagesMadeResident,
      resolveCalls: this.resolveCalls,
      retransmittedBlocks: this.retransmittedBlocks,
      unresolved: this.unresolved,
      phases: { real: sum(this.real), model: sum(this.model) },
    };
  }
}
