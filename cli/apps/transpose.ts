// An all-to-all transpose, the communication of a distributed FFT: an M×M Float64 matrix
// (M = ranks × b) is split by rows, b rows per rank. To transpose it each rank cuts its rows
// into one b×b block per rank, transposes each block locally, and RDMA-WRITEs WITH IMMEDIATE
// block p into rank p's receive buffer (its own block it copies): every rank writes to every
// other. Rank p then holds the rows of Aᵀ from p·b on. The send buffer (blocks packed) and the
// receive buffer are registered under the trial's policy; the receive buffer has two halves
// by the step's parity (a rank can start the next transpose before a slower one has unpacked
// this one, never two ahead). Every element is checked against A's known values.
import { PAGE_SIZE, SendFlags, WrOpcode } from '../../lib/index.js';
import { TrialBuffers } from './buffers.js';
import { Completions, countFaults, faultCount, FIRST_STEPS, type Kernel, newOutcome } from './kernel.js';
import { exchangeBuffers } from './world.js';

/** The transpose's own parameters. */
export interface TransposeParams {
  /** Rows per rank (and the side of each block). */
  rows: number;
}

/** A's element (i, j) in transpose `it` (exact in Float64 for any grid this runs). */
function element(i: number, j: number, m: number, it: number): number {
  return i * m + j + it;
}

/** One rank of the transpose; a step is one whole transpose. */
export const transpose: Kernel<TransposeParams> = async (w, t, { rows: b }) => {
  const n = w.size;
  const m = n * b;
  const slot = Math.ceil((b * b * 8) / PAGE_SIZE) * PAGE_SIZE;
  const bufs = new TrialBuffers(w, t.policy, t.evictEachStep);
  try {
    const { region: send, mr: sendMr } = await bufs.map(n * slot);
    const { region: recv, mr: recvMr } = await bufs.map(2 * n * slot);
    const remote = await exchangeBuffers(w, recvMr);
    const done = new Completions(w);
    const peers = [...Array(n).keys()].filter((p) => p !== w.rank);
    for (const p of peers) done.arm(w.qps[p]!, t.steps);
    const a = new Float64Array(b * m); // this rank's rows of A
    const out = new Float64Array(b * m); // its rows of Aᵀ
    const s = new Float64Array(send.buffer);
    const r = new Float64Array(recv.buffer);
    const per = slot / 8;
    const me = newOutcome(w.rank);
    const before = faultCount(w);
    let steady = before;
    await w.barrier();
    for (let it = 0; it < t.steps; it++) {
      if (it === FIRST_STEPS) steady = faultCount(w);
      for (let i = 0; i < b; i++) for (let j = 0; j < m; j++) a[i * m + j] = element(w.rank * b + i, j, m, it);
      await bufs.evict();
      const t0 = performance.now();
      const half = (it % 2) * n;
      // Block p, transposed: its row x is column p·b + x of this rank's rows.
      for (let p = 0; p < n; p++) for (let x = 0; x < b; x++) for (let y = 0; y < b; y++) s[p * per + x * b + y] = a[y * m + p * b + x]!;
      for (const p of peers)
        w.qps[p]!.postSend({
          wrId: p,
          opcode: WrOpcode.RDMA_WRITE_WITH_IMM,
          immData: it,
          sgList: [{ addr: sendMr.addr + BigInt(p * slot), length: b * b * 8, lkey: sendMr.lkey }],
          sendFlags: SendFlags.SIGNALED,
          rdma: { remoteAddr: remote[p]!.addr + BigInt((half + w.rank) * slot), rkey: remote[p]!.rkey },
        });
      // This rank's own block never leaves it.
      r.set(s.subarray(w.rank * per, w.rank * per + b * b), (half + w.rank) * per);
      await done.wait(peers.length, it, peers.length);
      for (let q = 0; q < n; q++)
        for (let x = 0; x < b; x++) out.set(r.subarray((half + q) * per + x * b, (half + q) * per + (x + 1) * b), x * m + q * b);
      me.stepUs.push((performance.now() - t0) * 1000);
      for (let x = 0; x < b; x++) for (let j = 0; j < m; j++) if (out[x * m + j] !== element(j, w.rank * b + x, m, it)) me.mismatches++;
      me.bytesVerified += b * m * 8;
    }
    countFaults(w, t, me, before, steady);
    await w.barrier();
    return me;
  } finally {
    await bufs.release();
  }
};
