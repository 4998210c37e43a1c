// The hardware cost model: every modelled step has a named cost here and nowhere else.
// These are NOT measurements. Defaults are calibrated to the published PART figures
// (NOCS'20 / TPDS'22): a one-page transfer with a minor fault at the destination ≈ 38 µs
// end to end, and a 1 MB transfer whose every page faults, resolved by Touch-Ahead on
// the first fault, ≈ 2.6× the fault-free transfer. The real time of the software path
// (fault handling on real memory) is measured separately and reported beside it.

/** Every modelled hardware cost, named and calibrated to the published figures (µs unless a name says otherwise). */
export interface CostModel {
  /** User-level descriptor post (doorbell write), µs. */
  doorbellUs: number;
  /** Firmware scheduler (Cortex-R5) picking the next channel/block, µs. */
  scheduleUs: number;
  /** SMMU translation that hits the IOTLB, µs per block. */
  iotlbHitUs: number;
  /** SMMU page-table walk on an IOTLB miss, µs per page walked. */
  walkUs: number;
  /** DMA engine fixed cost per block (AXI read/write issue), µs. */
  blockUs: number;
  /** Link one-way latency, µs. */
  linkLatencyUs: number;
  /** Link bandwidth, bytes per µs (16 Gb/s HSS links: 2000 B/µs). */
  linkBytesPerUs: number;
  /** Writing an event record into the SMMU event queue, µs. */
  eventRecordUs: number;
  /** Interrupt delivery to the SMMU driver's handler, µs. */
  irqUs: number;
  /** Driver IRQ handler: drain, decode, find the owner, µs per record. */
  driverUs: number;
  /** Netlink delivery from the driver to the process's socket, µs. */
  netlinkUs: number;
  /** Waking the fault library's thread in the process, µs. */
  wakeupUs: number;
  /** Touching one page (a minor fault taken by the CPU), µs. */
  touchPageUs: number;
  /** get_user_pages fixed cost per call (Touch-Ahead / prefetch), µs. */
  gupCallUs: number;
  /** get_user_pages per page made resident, µs. */
  gupPageUs: number;
  /** The library's request back to the engine (retransmit / resume), µs. */
  requestUs: number;
  /** Pinning a page for a transfer and unpinning it after (get_user_pages pin + unpin), µs. */
  pinPageUs: number;
  /** Stall mode: CMD_RESUME consumed and the stalled access retried, µs. */
  resumeUs: number;
}

/**
 * Calibrated defaults. Fault-free: a 64-byte transfer models to < 1 µs one way (the ExaNeSt
 * inter-node latency). One page with a destination fault: ≈ 38 µs. 1 MB all faulting with
 * Touch-Ahead: ≈ 2.6× fault-free. 4 MB pinned for the transfer: ≈ 1.46× the unpinned
 * transfer on resident memory. See test/kernel-sim/cost-model/calibration.test.ts.
 */
export const DEFAULT_COSTS: Readonly<CostModel> = Object.freeze({
  doorbellUs: 0.1,
  scheduleUs: 0.1,
  iotlbHitUs: 0.01,
  walkUs: 0.1,
  blockUs: 0.05,
  linkLatencyUs: 0.3,
  linkBytesPerUs: 2000,
  eventRecordUs: 0.5,
  irqUs: 3,
  driverUs: 4,
  netlinkUs: 7,
  wakeupUs: 10.5,
  touchPageUs: 2.5,
  gupCallUs: 2.5,
  gupPageUs: 3.15,
  requestUs: 4.5,
  // Calibrated: TPDS'22 reports a 4 MB transfer 1.46× faster than pinning its buffer for it.
  pinPageUs: 0.94,
  resumeUs: 1,
});

function costError(message: string): RangeError {
  return Object.assign(new RangeError(message), { code: 'ERR_OUT_OF_RANGE' });
}

/** A full cost model: DEFAULT_COSTS with `overrides` on top (each checked to be a finite number ≥ 0). */
export function costModel(overrides?: Partial<CostModel>): CostModel {
  const out = { ...DEFAULT_COSTS, ...overrides };
  for (const [k, v] of Object.entries(out)) {
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0)
      throw costError(`cost model: costs.${k} must be a non-negative finite number of µs, got ${v}`);
  }
  if (out.linkBytesPerUs <= 0) throw costError('cost model: costs.linkBytesPerUs must be positive');
  return out;
}

/** The label every output that shows modelled time carries. */
export const MODEL_LABEL = 'modelled (calibrated hardware cost model, not measured)';

/**
 * A resource that serves one thing at a time in modelled time (a link, an engine): a
 * reservation starts when both the request and the resource are ready.
 */
export class ModelResource {
  #freeAt = 0;
  /** Reserve `durationUs` starting no earlier than `atUs`; returns the end time. */
  reserve(atUs: number, durationUs: number): number {
    const start = Math.max(atUs, this.#freeAt);
    this.#freeAt = start + durationUs;
    return this.#freeAt;
  }
  get freeAt(): number {
    return this.#freeAt;
  }
}

/** Real (wall-clock) time in µs, for the measured software path. */
export function realNowUs(): number {
  return Number(process.hrtime.bigint()) / 1000;
}
