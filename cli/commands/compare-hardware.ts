// `pagefault-rdma compare-hardware`: one workload under every hardware preset, interleaved.
import { compareHardware, comparePlot, compareTable, WORKLOADS, type Workload } from '../../examples/compare-hardware.js';
import { heading, MODEL_LABEL, parsePositiveInt } from '../../examples/support/format.js';
import { HARDWARE_NAMES } from '../../lib/index.js';
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
      .option('--workload <name...>', `workloads (${WORKLOADS.join(', ')}; default all)`)
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
    const workloads = list<Workload>('workload', o.workload ?? [...WORKLOADS], WORKLOADS);
    heading('The same workload under each hardware preset');
    console.log(`time: ${MODEL_LABEL};\nfaults: real (evicted memory, resolved by the fault library).`);
    console.log(`presets: ${presets.join(', ')} (sources: pagefault-rdma hardware).`);
    const rows = await compareHardware({
      presets,
      workloads,
      iters: o.iters,
      ...(o.minRnrTimer !== undefined ? { minRnrTimer: o.minRnrTimer } : {}),
    });
    console.log(`\n${compareTable(rows)}`);
    console.log(
      '\nresent: blocks sent again after a NACK / RNR NAK;\nRNR waits: min_rnr_timer periods waited (mlx5-odp);\n' +
        'stalls: faults the access waited out in place (smmuv3-stall, rxe-odp). pingpong: 4 KiB one way.',
    );
    console.log(`\n(run time ${((performance.now() - t) / 1000).toFixed(1)} s)`);
    return { results: { presets, workloads, rows }, plot: comparePlot(rows) };
  },
});
