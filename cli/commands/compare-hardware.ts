// `pagefault-rdma compare-hardware`: one workload under every hardware preset, interleaved.
import { compareHardware, comparePlot, compareTable, WORKLOADS, type Workload } from '../programs/compare-hardware.js';
import { heading, MODEL_LABEL, parsePositiveInt } from '../programs/support/format.js';
import { HARDWARE_NAMES, hardwarePreset, setDefaultHardware } from '../../lib/index.js';
import type { CompareRow } from '../programs/compare-hardware.js';
import { halo } from '../apps/halo.js';
import { localWorlds } from '../apps/world.js';

/** The application workload: app halo, 4 ranks in this process, buffers evicted before every step. */
const APP_WORKLOADS = ['halo'] as const;
const ALL_WORKLOADS = [...WORKLOADS, ...APP_WORKLOADS] as const;

/**
 * app halo under one preset: 4 ranks, a 16³ block each, `steps` steps with the buffers evicted
 * before each. The time is the cluster's modelled clock over the trial, per step (a makespan:
 * the ranks' transfers overlap).
 */
async function haloUnder(preset: string, steps: number): Promise<CompareRow> {
  const was = setDefaultHardware(preset);
  try {
    const worlds = await localWorlds(4);
    const cluster = worlds[0]!.cluster;
    try {
      const clock0 = cluster.system.clock.now;
      const out = await Promise.all(worlds.map((w) => halo(w, { policy: 'touch-ahead', steps, evictEachStep: true }, { n: 16 })));
      const nodes = cluster.system.nodes.map((n) => n.pldma.counters());
      const h = cluster.system.hardwareCounters;
      const resent = nodes.reduce((a, c) => a + c.retransmittedBlocks, 0);
      return {
        workload: 'halo' as never,
        preset,
        faultMode: hardwarePreset(preset).faultMode,
        messages: steps,
        modelUs: (cluster.system.clock.now - clock0) / steps,
        faults: { source: out.reduce((a, o) => a + o.faults.source, 0), destination: out.reduce((a, o) => a + o.faults.destination, 0) },
        retransmissions: h.stalls > 0 ? 0 : resent,
        rnrWaits: h.rnrWaits,
        stalls: h.stalls,
        errors: out.reduce((a, o) => a + o.mismatches, 0),
      };
    } finally {
      cluster.close();
    }
  } finally {
    setDefaultHardware(was);
  }
}
import { defineProgram } from '../program.js';

interface Options {
  workload?: string[];
  presets?: string;
  iters: number;
  minRnrTimer?: number;
}

function list<T extends string>(what: string, given: string[], allowed: readonly T[]): T[] {
  for (const g of given)
    if (!(allowed as readonly string[]).includes(g))
      throw Object.assign(new RangeError(`--${what} must be among ${allowed.join(', ')}, got '${g}'`), { code: 'ERR_INVALID_ARG_VALUE' });
  return given as T[];
}

export default defineProgram<Options>({
  name: 'compare-hardware',
  summary: 'one workload under every hardware preset, side by side: time, faults, retransmissions, RNR waits, stalls',
  description:
    'Runs a ping-pong with both buffers evicted before every message and 1 MiB RDMA WRITEs into evicted memory under ' +
    'each hardware preset (pagefault-rdma hardware lists them), preset after preset so the load falls on all alike. ' +
    "The faults are real; the time is each preset's modelled time.",
  plot: 'modelled µs per message per preset and workload',
  engine: false,
  noTrace: 'it runs every preset; trace one with pingpong --hardware NAME --trace',
  options(cmd) {
    cmd
      .option('--workload <name...>', `workloads (${ALL_WORKLOADS.join(', ')}; default all)`)
      .option('--presets <list>', `comma-separated presets (default all: ${HARDWARE_NAMES.join(',')})`)
      .option('-n, --iters <n>', 'ping-pong round trips (1 MiB writes: a third as many, at least 2)', parsePositiveInt, 20)
      .option('--min-rnr-timer <code>', "mlx5-odp's min_rnr_timer code 0..31 (default 1: 10 µs)", (v) => {
        const n = Number(v);
        if (!Number.isInteger(n) || n < 0 || n > 31) throw new Error(`--min-rnr-timer must be an integer in 0..31, got ${v}`);
        return n;
      });
  },
  async run(o) {
    const t = performance.now();
    const presets = list('presets', o.presets ? o.presets.split(',') : [...HARDWARE_NAMES], HARDWARE_NAMES);
    const chosen = list('workload', o.workload ?? [...ALL_WORKLOADS], ALL_WORKLOADS);
    const workloads = chosen.filter((w): w is Workload => (WORKLOADS as readonly string[]).includes(w));
    heading('The same workload under each hardware preset');
    console.log(`time: ${MODEL_LABEL};\nfaults: real (evicted memory, resolved by the fault library).`);
    console.log(`presets: ${presets.join(', ')} (sources: pagefault-rdma hardware).`);
    const rows = workloads.length
      ? await compareHardware({ presets, workloads, iters: o.iters, ...(o.minRnrTimer !== undefined ? { minRnrTimer: o.minRnrTimer } : {}) })
      : [];
    if (chosen.includes('halo')) {
      // Interleaved: one trial of every preset per round; the rows keep the last round's figures (modelled time repeats).
      const steps = Math.max(3, Math.ceil(o.iters / 4));
      let last: CompareRow[] = [];
      for (let round = 0; round < 2; round++) {
        last = [];
        for (const p of presets) last.push(await haloUnder(p, steps));
      }
      rows.push(...last);
    }
    console.log(`\n${compareTable(rows)}`);
    console.log(
      '\nresent: blocks sent again after a NACK / RNR NAK;\nRNR waits: min_rnr_timer periods waited (mlx5-odp);\n' +
        'stalls: faults the access waited out in place (smmuv3-stall, rxe-odp). pingpong: 4 KiB one way;\n' +
        'halo: app halo, 4 ranks, 16^3 each, buffers evicted every step, modelled makespan per step.',
    );
    console.log(`\n(run time ${((performance.now() - t) / 1000).toFixed(1)} s)`);
    return { results: { presets, workloads, rows }, plot: comparePlot(rows) };
  },
});
