// Hardware presets: one cost model and one fault-handling behaviour per design that exists,
// each calibrated to the figure its own source reports. A preset changes NO default: the
// default preset, exanest-pldma, is DEFAULT_COSTS in terminate mode exactly as before.
// Every figure here is modelled (a cost model), not measured, except rxe-odp's costs, which
// are this machine's own measured populate and copy (a measured preset, not a published one).
import { DEFAULT_COSTS, type CostModel } from './index.js';

/**
 * How a design handles a device page fault:
 * - 'terminate-nack': the access is terminated, the destination NACKs, the block is sent again
 *   when the fault library answers (ExaNeSt PLDMA).
 * - 'stall': the access waits in the SMMU; the driver answers with a page response and the
 *   access is retried (SMMUv3 stall, PCIe PRI).
 * - 'rnr-nak': a requester-side fault stalls its send queue; a receive-side fault is answered at
 *   once with an RNR NAK and the requester retries after the responder's min_rnr_timer, as many
 *   times as it takes (mlx5 ODP).
 * - 'inline': the responder resolves the fault in line and goes on: no NAK, no retransmission
 *   (rxe ODP; modelled as a stall whose notification path costs nothing).
 */
export type FaultMode = 'terminate-nack' | 'stall' | 'rnr-nak' | 'inline';

/** One published (or measured) figure a preset is calibrated to. */
export interface Headline {
  /** What the figure is. */
  what: string;
  /** The target value. */
  value: number;
  /** Its unit ('µs' or '×'). */
  unit: string;
}

/** A hardware preset: a cost model and a fault-handling behaviour, with its sources. */
export interface HardwarePreset {
  /** Its name (--hardware NAME). */
  readonly name: string;
  /** One line: the design. */
  readonly title: string;
  /** Where the figures come from (papers, code), cited. */
  readonly source: string;
  /** How it handles a device page fault. */
  readonly faultMode: FaultMode;
  /** The QP fault model the engine runs for it ('terminate' or 'stall'). */
  readonly faultModel: 'terminate' | 'stall';
  /** The cost model (DEFAULT_COSTS with the preset's figures on top). */
  readonly costs: Readonly<CostModel>;
  /** The figures its calibration test reproduces within ±10 %. */
  readonly headlines: readonly Headline[];
  /** Figures the source reports that the engine does not model separately (listed, not calibrated). */
  readonly notes?: readonly string[];
  /** True for a preset whose costs were measured on this machine. */
  readonly measured?: boolean;
}

/** The IB Architecture Specification's (vol. 1) RNR NAK timer field encoding, min_rnr_timer codes 0..31, in µs: 0 means 655.36 ms. */
export const RNR_TIMER_US: readonly number[] = Object.freeze(
  [
    655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48,
    30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52,
  ].map((ms) => Math.round(ms * 1000 * 100) / 100),
);

/** The local ACK timeout of a QP with `timeout` = t (1..31): 4.096 µs × 2^t (0 means infinite). */
export function ackTimeoutUs(timeout: number): number {
  return timeout === 0 ? Infinity : 4.096 * 2 ** timeout;
}

/** RNR/ACK-timeout parameters of the mlx5-odp preset's QPs (rdma-core's names). */
export interface RnrParams {
  /** min_rnr_timer code 0..31 of the responder (default 1: 10 µs). */
  minRnrTimer: number;
  /** RNR retries before RNR_RETRY_EXC_ERR (7 = infinite; default 7). */
  rnrRetry: number;
}

const NAMES = ['exanest-pldma', 'smmuv3-stall', 'np-rdma', 'mlx5-odp', 'rxe-odp'] as const;
/** Every preset's name, the default first. */
export type HardwareName = (typeof NAMES)[number];
/** Every preset's name, the default first. */
export const HARDWARE_NAMES: readonly HardwareName[] = NAMES;
/** The default preset: today's engine (ExaNeSt PLDMA, terminate mode). */
export const DEFAULT_HARDWARE: HardwareName = 'exanest-pldma';

const frozen = (over: Partial<CostModel>): Readonly<CostModel> => Object.freeze({ ...DEFAULT_COSTS, ...over });

// Published presets. Each figure's source sits beside it.
const PUBLISHED: Record<Exclude<HardwareName, 'rxe-odp'>, HardwarePreset> = {
  'exanest-pldma': {
    name: 'exanest-pldma',
    title: 'ExaNeSt PLDMA + SMMU, terminate mode: fault NACK, block retransmission (the default)',
    source:
      'Psistakis et al., PART (NOCS 2020) and "Optimized Page Fault Handling During RDMA" (TPDS 2022); ' +
      'thesis arXiv 2511.21018: 38 µs one page with a destination fault, 2.6× 1 MB all faulting with Touch-Ahead, ' +
      '1.46× at 4 MB against pinning, < 1 µs one way fault-free',
    faultMode: 'terminate-nack',
    faultModel: 'terminate',
    costs: DEFAULT_COSTS,
    headlines: [
      { what: 'one page, minor fault at the destination (touch)', value: 38, unit: 'µs' },
      { what: '1 MB all faulting, Touch-Ahead / fault-free', value: 2.6, unit: '×' },
    ],
  },
  'smmuv3-stall': {
    name: 'smmuv3-stall',
    title: 'SMMUv3 stall mode / PCIe PRI: the access waits, the driver answers with a page response',
    source:
      'Arm SMMUv3 spec (IHI 0070) stall model, CMD_RESUME; Linux IOPF iommu_page_response ' +
      '(drivers/iommu/io-pgfault.c); costs: the exanest-pldma calibration plus CMD_RESUME (no published end-to-end figure)',
    faultMode: 'stall',
    faultModel: 'stall',
    costs: DEFAULT_COSTS,
    headlines: [{ what: 'one page stalled at the destination and resumed (the model: fault path + resume)', value: 36, unit: 'µs' }],
  },
  'np-rdma': {
    name: 'np-rdma',
    title: 'NP-RDMA: software fault handling on commodity RNICs (IOMMU + MMU notifiers)',
    source: 'NP-RDMA, arXiv 2310.11062: about +0.1 µs without faults, 3.5–5.7 µs per minor fault, about 60 µs per major fault',
    faultMode: 'terminate-nack',
    faultModel: 'terminate',
    costs: frozen({
      // +0.1 µs on every post (the paper's fault-free overhead).
      doorbellUs: 0.2,
      // The minor-fault path, 4.6 µs in all (the middle of 3.5–5.7 µs): these steps plus the
      // engine's own NACK, walk and re-send (≈ 2.9 µs of the 4.6 in this model).
      eventRecordUs: 0.1,
      irqUs: 0.3,
      driverUs: 0.4,
      netlinkUs: 0,
      wakeupUs: 0.2,
      touchPageUs: 0.5,
      requestUs: 0.2,
      gupCallUs: 0.3,
      gupPageUs: 0.2,
    }),
    headlines: [
      { what: 'fault-free 64 B post overhead over exanest-pldma', value: 0.1, unit: 'µs' },
      { what: 'one minor fault at the destination, added to the fault-free transfer', value: 4.6, unit: 'µs' },
    ],
    notes: ['major fault ≈ 60 µs (the paper): a major fault here is a real one (the region evicted to swap), its time measured, not modelled'],
  },
  'mlx5-odp': {
    name: 'mlx5-odp',
    title: 'Mellanox/NVIDIA mlx5 ODP: NIC page faults handled by the kernel driver; receive faults answered with RNR NAK',
    source:
      'Lesokhin et al., "Page Fault Support for Network Controllers" (ASPLOS 2017): about 220 µs per minor fault for a 4 KB ' +
      'message, 350 µs for 4 MB, batched (figures as quoted in a secondary note of the author PDF; the full text was not ' +
      'reachable here); behaviour: Linux drivers/infiniband/hw/mlx5/odp.c (page-fault EQ, work queue, UMR, PAGE_FAULT_RESUME), ' +
      'IB spec RNR NAK timer table',
    faultMode: 'rnr-nak',
    faultModel: 'terminate',
    costs: frozen({
      // ConnectX-4 EDR-class link: 100 Gb/s, about 0.6 µs one way.
      linkLatencyUs: 0.6,
      linkBytesPerUs: 12500,
      // Page-fault EQE, interrupt, the page-fault work item (WQE parse, hmm_range_fault set up,
      // UMR translation update): most of the ~220 µs is this software path (ASPLOS'17).
      eventRecordUs: 1,
      irqUs: 5,
      driverUs: 198,
      // In the kernel: no netlink hop, no process to wake.
      netlinkUs: 0,
      wakeupUs: 0,
      touchPageUs: 2.5,
      // hmm_range_fault: fixed per call, then per page (350 − 220 µs over 1023 more pages).
      gupCallUs: 4,
      gupPageUs: 0.127,
      // PAGE_FAULT_RESUME.
      requestUs: 10,
      resumeUs: 1,
    }),
    headlines: [
      { what: 'one minor fault, 4 KB message (batched, hmm_range_fault)', value: 220, unit: 'µs' },
      { what: 'one minor fault, 4 MB message (batched)', value: 350, unit: 'µs' },
    ],
  },
};

let measuredRxe: HardwarePreset | undefined;

/**
 * This machine's populate (per 4 KiB page, the first write to an anonymous page) and copy
 * (bytes per µs, memcpy of 4 MiB resident) in µs: measured once per process, the median of 5.
 */
export function measureMachine(): { populatePageUs: number; copyBytesPerUs: number } {
  const pages = 1024;
  const size = pages * 4096;
  const median = (xs: number[]) => xs.sort((a, b) => a - b)[xs.length >> 1]!;
  const pop: number[] = [];
  const cp: number[] = [];
  const src = Buffer.alloc(size, 1);
  for (let i = 0; i < 5; i++) {
    // A fresh ArrayBuffer larger than the pool is its own anonymous mapping: its first write faults each page in.
    const dst = new Uint8Array(new ArrayBuffer(size));
    let t = process.hrtime.bigint();
    for (let p = 0; p < size; p += 4096) dst[p] = 1;
    pop.push(Number(process.hrtime.bigint() - t) / 1000 / pages);
    t = process.hrtime.bigint();
    dst.set(src);
    cp.push(size / (Number(process.hrtime.bigint() - t) / 1000));
  }
  return { populatePageUs: median(pop), copyBytesPerUs: median(cp) };
}

function rxePreset(): HardwarePreset {
  if (measuredRxe) return measuredRxe;
  const m = measureMachine();
  const populate = Math.round(m.populatePageUs * 1000) / 1000;
  const copy = Math.round(m.copyBytesPerUs);
  measuredRxe = {
    name: 'rxe-odp',
    title: 'Soft-RoCE (rxe) ODP: the responder resolves the fault in line (hmm_range_fault) and goes on, no NAK',
    source:
      "Linux drivers/infiniband/sw/rxe/rxe_odp.c (rxe_odp_mr_copy faults synchronously in the rxe task); costs: this machine's " +
      'own populate and copy, measured at start-up (a measured preset, not a published one)',
    faultMode: 'inline',
    faultModel: 'stall',
    measured: true,
    costs: frozen({
      // The software engine copies at memcpy speed; the "link" is the copy.
      linkBytesPerUs: copy,
      linkLatencyUs: 0,
      iotlbHitUs: 0,
      walkUs: 0,
      blockUs: 0,
      scheduleUs: 0,
      // In line: no event queue, no interrupt, no netlink, no wake-up, no request, no resume.
      eventRecordUs: 0,
      irqUs: 0,
      driverUs: 0,
      netlinkUs: 0,
      wakeupUs: 0,
      requestUs: 0,
      resumeUs: 0,
      touchPageUs: populate,
      gupCallUs: 0,
      gupPageUs: populate,
    }),
    headlines: [
      { what: "one page faulted in line: this machine's populate of one page", value: populate, unit: 'µs' },
      { what: "1 MiB fault-free: 1 MiB at this machine's copy bandwidth", value: 1048576 / copy, unit: 'µs' },
    ],
  };
  return measuredRxe;
}

function unknownHardware(name: unknown): Error {
  return Object.assign(
    new RangeError(
      `hardware must be one of ${HARDWARE_NAMES.join(', ')}, got ${typeof name === 'string' ? `'${name}'` : typeof name} ` +
        '(pagefault-rdma hardware lists them with their sources)',
    ),
    { code: 'ERR_INVALID_ARG_VALUE' },
  );
}

/** The preset called `name` (default exanest-pldma); an unknown name is refused with the list. */
export function hardwarePreset(name: string = DEFAULT_HARDWARE): HardwarePreset {
  if (typeof name !== 'string' || !(HARDWARE_NAMES as readonly string[]).includes(name)) throw unknownHardware(name);
  return name === 'rxe-odp' ? rxePreset() : PUBLISHED[name as Exclude<HardwareName, 'rxe-odp'>];
}

/** Every preset, the default first. */
export function hardwarePresets(): HardwarePreset[] {
  return HARDWARE_NAMES.map((n) => hardwarePreset(n));
}

let processDefault: HardwareName = DEFAULT_HARDWARE;

/** The preset a system gets when its options name none (`--hardware NAME` sets it for a program). */
export function defaultHardware(): HardwareName {
  return processDefault;
}

/** Set the process's default preset (the CLI's --hardware); returns the previous one. */
export function setDefaultHardware(name: string): HardwareName {
  hardwarePreset(name);
  const was = processDefault;
  processDefault = name as HardwareName;
  return was;
}

/**
 * The receive-side fault hook of 'rnr-nak': the responder NAKed at once (the NAK reaches the
 * requester at `nakAtUs`); the fault is served by `readyAtUs` at the responder. The requester
 * retries every `timerUs` until a retry arrives after the fault is served: returns when the
 * good retry leaves and how many RNR waits it took.
 */
export function rnrRetry(nakAtUs: number, readyAtUs: number, linkUs: number, timerUs: number): { atUs: number; waits: number } {
  const need = readyAtUs - linkUs - nakAtUs;
  const waits = Math.max(1, Math.ceil(need / timerUs - 1e-9));
  return { atUs: nakAtUs + waits * timerUs, waits };
}
