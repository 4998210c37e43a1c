// A 3-D halo exchange, the communication shape of LAMMPS and stencil codes. The global grid
// (Float64, zero on its outer boundary) is split over the ranks as a 3-D process grid (dims3);
// each rank owns an n³ block plus one ghost layer. A step: pack the six faces of the block,
// RDMA WRITE WITH IMMEDIATE each into the facing neighbour's receive buffer (registered under
// the trial's policy: ODP unless pinned), wait for its own writes and the neighbours' (their
// immediate is the step), unpack the ghosts, then one Jacobi sweep of the 7-point heat stencil.
// The receive buffer has two halves by the step's parity: a neighbour can be one step ahead
// (it needs this rank's next faces before going further), never two. At the end every rank
// compares its block, value for value, with the same steps computed serially on the whole grid.
import { PAGE_SIZE, WrOpcode, SendFlags } from '../../lib/index.js';
import { TrialBuffers } from './buffers.js';
import { Completions, countFaults, dims3, FIRST_STEPS, faultCount, type Kernel, newOutcome } from './kernel.js';
import { exchangeBuffers } from './world.js';

/** The halo exchange's own parameters. */
export interface HaloParams {
  /** Grid points per rank along each axis (the block is n³). */
  n: number;
}

const ALPHA = 0.1;

/** The initial value at global point (x, y, z): deterministic, varied, exact in Float64. */
function initial(x: number, y: number, z: number): number {
  return ((x * 7 + y * 13 + z * 29) % 17) / 17;
}

/** One Jacobi sweep of the 7-point stencil over the interior of a (nx+2)(ny+2)(nz+2) array with ghost layers. */
function sweep(u: Float64Array, out: Float64Array, nx: number, ny: number, nz: number): void {
  const sy = nx + 2;
  const sz = sy * (ny + 2);
  for (let z = 1; z <= nz; z++)
    for (let y = 1; y <= ny; y++)
      for (let x = 1, i = z * sz + y * sy + 1; x <= nx; x++, i++)
        out[i] = u[i]! + ALPHA * (u[i - 1]! + u[i + 1]! + u[i - sy]! + u[i + sy]! + u[i - sz]! + u[i + sz]! - 6 * u[i]!);
}

/** Fill the interior of a ghosted block whose first point is global (ox, oy, oz). */
function fill(u: Float64Array, nx: number, ny: number, nz: number, ox: number, oy: number, oz: number): void {
  const sy = nx + 2;
  const sz = sy * (ny + 2);
  for (let z = 1; z <= nz; z++)
    for (let y = 1; y <= ny; y++) for (let x = 1; x <= nx; x++) u[z * sz + y * sy + x] = initial(ox + x - 1, oy + y - 1, oz + z - 1);
}

// The serial result of a global grid and step count, computed once per process (every rank of a process checks against it).
const serialCache = new Map<string, Float64Array>();

/** The whole grid after `steps` sweeps, computed serially: what every rank's block must equal. */
export function serialHalo(gx: number, gy: number, gz: number, steps: number): Float64Array {
  const key = `${gx}x${gy}x${gz}/${steps}`;
  const hit = serialCache.get(key);
  if (hit) return hit;
  let u = new Float64Array((gx + 2) * (gy + 2) * (gz + 2));
  let v = new Float64Array(u.length);
  fill(u, gx, gy, gz, 0, 0, 0);
  for (let s = 0; s < steps; s++) {
    sweep(u, v, gx, gy, gz);
    [u, v] = [v, u];
  }
  serialCache.set(key, u);
  return u;
}

/**
 * The indices, in the ghosted n³ block, of face (axis, side)'s points in packing order: side 0
 * the first layer, 1 the last; with `ghost`, the layer just outside it. Sender and receiver
 * use the same order, so a face packed by one is unpacked by the other point for point.
 */
function faceIndices(axis: number, side: number, ghost: boolean, n: number): Int32Array {
  const stride = [1, n + 2, (n + 2) * (n + 2)];
  const layer = ghost ? (side ? n + 1 : 0) : side ? n : 1;
  const [p, q] = [0, 1, 2].filter((d) => d !== axis) as [number, number];
  const out = new Int32Array(n * n);
  for (let a = 0, k = 0; a < n; a++) for (let b = 0; b < n; b++, k++) out[k] = layer * stride[axis]! + (a + 1) * stride[p]! + (b + 1) * stride[q]!;
  return out;
}

/** One rank of the halo exchange. */
export const halo: Kernel<HaloParams> = async (w, t, { n }) => {
  const d = dims3(w.size);
  const c = [w.rank % d[0], Math.floor(w.rank / d[0]) % d[1], Math.floor(w.rank / (d[0] * d[1]))];
  const rankAt = (x: number[]): number => x[0]! + d[0] * (x[1]! + d[1] * x[2]!);
  // The neighbour across face (axis, side), or -1 at the grid's outer boundary.
  const neighbours = [0, 1, 2].flatMap((axis) =>
    [0, 1].map((side) => {
      const x = [...c];
      x[axis]! += side ? 1 : -1;
      return x[axis]! < 0 || x[axis]! >= d[axis]! ? -1 : rankAt(x);
    }),
  );
  const faceBytes = n * n * 8;
  const slot = Math.ceil(faceBytes / PAGE_SIZE) * PAGE_SIZE;
  const bufs = new TrialBuffers(w, t.policy, t.evictEachStep);
  try {
    const { region: send, mr: sendMr } = await bufs.map(6 * slot);
    const { region: recv, mr: recvMr } = await bufs.map(2 * 6 * slot);
    const remote = await exchangeBuffers(w, recvMr);
    const done = new Completions(w);
    for (const p of neighbours) if (p >= 0) done.arm(w.qps[p]!, t.steps);
    const active = neighbours.filter((p) => p >= 0).length;
    let u = new Float64Array((n + 2) ** 3);
    let v = new Float64Array(u.length);
    fill(u, n, n, n, c[0]! * n, c[1]! * n, c[2]! * n);
    const sendF = new Float64Array(send.buffer);
    const recvF = new Float64Array(recv.buffer);
    const perSlot = slot / 8;
    const faces = [...Array(6).keys()].map((f) => faceIndices(f >> 1, f & 1, false, n));
    const ghosts = [...Array(6).keys()].map((f) => faceIndices(f >> 1, f & 1, true, n));
    const me = newOutcome(w.rank);
    const before = faultCount(w);
    let steady = before;
    // Receives are armed on every rank before any rank writes.
    await w.barrier();
    for (let step = 0; step < t.steps; step++) {
      if (step === FIRST_STEPS) steady = faultCount(w);
      await bufs.evict();
      const t0 = performance.now();
      const half = (step % 2) * 6;
      for (let f = 0; f < 6; f++) {
        const p = neighbours[f]!;
        if (p < 0) continue;
        const axis = f >> 1;
        const side = f & 1;
        const at = faces[f]!;
        for (let k = 0, o = f * perSlot; k < at.length; k++) sendF[o + k] = u[at[k]!]!;
        // My high face is the neighbour's low ghost: it lands in its slot for side 0 of this axis.
        const theirs = (axis << 1) | (1 - side);
        w.qps[p]!.postSend({
          wrId: f,
          opcode: WrOpcode.RDMA_WRITE_WITH_IMM,
          immData: step,
          sgList: [{ addr: sendMr.addr + BigInt(f * slot), length: faceBytes, lkey: sendMr.lkey }],
          sendFlags: SendFlags.SIGNALED,
          rdma: { remoteAddr: remote[p]!.addr + BigInt((half + theirs) * slot), rkey: remote[p]!.rkey },
        });
      }
      await done.wait(active, step, active);
      for (let f = 0; f < 6; f++) {
        if (neighbours[f]! < 0) continue;
        const at = ghosts[f]!;
        for (let k = 0, o = (half + f) * perSlot; k < at.length; k++) u[at[k]!] = recvF[o + k]!;
      }
      sweep(u, v, n, n, n);
      [u, v] = [v, u];
      me.stepUs.push((performance.now() - t0) * 1000);
    }
    countFaults(w, t, me, before, steady);
    // Every rank is done writing before any buffer goes away.
    await w.barrier();
    const [gx, gy, gz] = d.map((k) => k * n) as [number, number, number];
    const want = serialHalo(gx, gy, gz, t.steps);
    const gsy = gx + 2;
    const gsz = gsy * (gy + 2);
    const sy = n + 2;
    const sz = sy * sy;
    for (let z = 1; z <= n; z++)
      for (let y = 1; y <= n; y++)
        for (let x = 1; x <= n; x++) {
          const g = (c[2]! * n + z) * gsz + (c[1]! * n + y) * gsy + c[0]! * n + x;
          if (u[z * sz + y * sy + x] !== want[g]) me.mismatches++;
        }
    me.bytesVerified = n ** 3 * 8;
    return me;
  } finally {
    await bufs.release();
  }
};
