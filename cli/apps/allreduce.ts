// A ring allreduce (sum) of a Float64 vector per rank, as MPI libraries and NCCL run it for
// large messages: the vector is cut into one chunk per rank; N−1 reduce-scatter steps (each
// rank sends a chunk to the next rank, which adds it to its own), then N−1 allgather steps
// (each passes on a finished chunk, which the next copies). Every transfer is an RDMA WRITE
// WITH IMMEDIATE into the next rank's receive buffer (the immediate numbers the ring step);
// the vector and the receive buffer are registered under the trial's policy. In a ring a rank
// can run up to N−1 steps ahead of the one it writes to, so the receive buffer has 2(N−1)
// slots, used in turn, and N−1 receives are posted ahead. Values are small integers, so the sum
// is exact in any order: every element is checked against the sum computed here.
import { PAGE_SIZE, SendFlags, WrOpcode } from '../../lib/index.js';
import { TrialBuffers } from './buffers.js';
import { Completions, countFaults, faultCount, FIRST_STEPS, type Kernel, newOutcome } from './kernel.js';
import { exchangeBuffers } from './world.js';

/** The allreduce's own parameters. */
export interface AllreduceParams {
  /** Float64 values in each rank's vector. */
  values: number;
}

/** Element `i` of rank `rank`'s vector in allreduce `it`: an integer below 1000, so sums are exact. */
function value(rank: number, i: number, it: number): number {
  return (rank * 31 + i * 7 + it * 3) % 1000;
}

/** One rank of the ring allreduce; a step is one whole allreduce. */
export const allreduce: Kernel<AllreduceParams> = async (w, t, { values }) => {
  const n = w.size;
  const next = (w.rank + 1) % n;
  const prev = (w.rank + n - 1) % n;
  // Chunk k is values [lo(k), lo(k+1)): as even as `values` allows.
  const lo = (k: number): number => Math.floor((k * values) / n);
  const chunk = (k: number): [number, number] => [lo(k), lo(k + 1)];
  const slot = Math.ceil((Math.ceil(values / n) * 8) / PAGE_SIZE) * PAGE_SIZE;
  const slots = 2 * (n - 1);
  const ringSteps = 2 * (n - 1);
  const bufs = new TrialBuffers(w, t.policy, t.evictEachStep);
  try {
    const { region: data, mr: dataMr } = await bufs.map(Math.ceil((values * 8) / PAGE_SIZE) * PAGE_SIZE);
    const { region: recv, mr: recvMr } = await bufs.map(slots * slot);
    const remote = (await exchangeBuffers(w, recvMr))[next]!;
    const done = new Completions(w);
    done.arm(w.qps[prev]!, t.steps * ringSteps, n - 1);
    const v = new Float64Array(data.buffer, 0, values);
    const r = new Float64Array(recv.buffer);
    const me = newOutcome(w.rank);
    const before = faultCount(w);
    let steady = before;
    await w.barrier();
    let g = 0; // ring steps so far: the immediate, and (mod slots) the slot written
    for (let it = 0; it < t.steps; it++) {
      if (it === FIRST_STEPS) steady = faultCount(w);
      for (let i = 0; i < values; i++) v[i] = value(w.rank, i, it);
      await bufs.evict();
      const t0 = performance.now();
      for (let s = 0; s < ringSteps; s++, g++) {
        // Reduce-scatter sends chunk rank−s and adds chunk rank−s−1; the allgather passes on rank+1−s and keeps rank−s.
        const out = s < n - 1 ? (w.rank - s + 2 * n) % n : (w.rank + 1 - (s - n + 1) + 2 * n) % n;
        const into = s < n - 1 ? (w.rank - s - 1 + 2 * n) % n : (w.rank - (s - n + 1) + 2 * n) % n;
        const [a, b] = chunk(out);
        const at = g % slots;
        w.qps[next]!.postSend({
          wrId: g,
          opcode: WrOpcode.RDMA_WRITE_WITH_IMM,
          immData: g >>> 0,
          sgList: [{ addr: dataMr.addr + BigInt(a * 8), length: (b - a) * 8, lkey: dataMr.lkey }],
          sendFlags: SendFlags.SIGNALED,
          rdma: { remoteAddr: remote.addr + BigInt(at * slot), rkey: remote.rkey },
        });
        await done.wait(1, g >>> 0, 1);
        const [c, d] = chunk(into);
        const base = (at * slot) / 8;
        if (s < n - 1) for (let i = c; i < d; i++) v[i] = v[i]! + r[base + i - c]!;
        else for (let i = c; i < d; i++) v[i] = r[base + i - c]!;
      }
      me.stepUs.push((performance.now() - t0) * 1000);
      for (let i = 0; i < values; i++) {
        let sum = 0;
        for (let q = 0; q < n; q++) sum += value(q, i, it);
        if (v[i] !== sum) me.mismatches++;
      }
      me.bytesVerified += values * 8;
    }
    countFaults(w, t, me, before, steady);
    await w.barrier();
    return me;
  } finally {
    await bufs.release();
  }
};
