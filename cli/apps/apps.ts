// The application kernels `pagefault-rdma app NAME` runs, by name: each with its parameters
// from --size and its own check of the ranks and size it can run on.
import { allreduce } from './allreduce.js';
import { halo } from './halo.js';
import { kv } from './kv.js';
import type { Kernel } from './kernel.js';
import type { KvParams } from './kv.js';
import { PAGE_SIZE } from '../../lib/index.js';
import { binding } from '../../native/index.js';
import { transpose } from './transpose.js';

/** One application: its kernel and how --size and the ranks become its parameters. */
export interface App<P> {
  /** One line for the heading. */
  title: string;
  /** One rank's part of a trial. */
  kernel: Kernel<P>;
  /** --size's default. */
  defaultSize: number;
  /** The kernel's parameters from --size (and kv's --memlock, KiB; undefined: this process's RLIMIT_MEMLOCK). */
  params(size: number, memlockKiB?: number): P;
  /** Why `ranks` and `size` cannot run (a message naming the option to change), or undefined. */
  check(ranks: number, size: number): string | undefined;
}

/** Every application, by name. */
export const APPS = {
  halo: {
    title: '3-D halo exchange (7-point stencil, faces by RDMA WRITE WITH IMMEDIATE)',
    kernel: halo,
    defaultSize: 32,
    params: (n: number) => ({ n }),
    check: (_ranks: number, n: number) => (n < 2 ? `--size: the halo's block needs at least 2 points per axis, got ${n}` : undefined),
  } satisfies App<{ n: number }>,
  allreduce: {
    title: 'ring allreduce of Float64 vectors (reduce-scatter, allgather; RDMA WRITE WITH IMMEDIATE)',
    kernel: allreduce,
    defaultSize: 16384,
    params: (values: number) => ({ values }),
    check: (ranks: number, values: number) =>
      ranks < 2
        ? `--ranks: a ring allreduce needs at least 2 ranks, got ${ranks}`
        : values < ranks
          ? `--size: each of the ${ranks} ranks needs a chunk of the vector: at least ${ranks} values, got ${values}`
          : undefined,
  } satisfies App<{ values: number }>,
  transpose: {
    title: 'all-to-all transpose of a row-distributed matrix (every rank writes to every other)',
    kernel: transpose,
    defaultSize: 32,
    params: (rows: number) => ({ rows }),
    check: (ranks: number) => (ranks < 2 ? `--ranks: a transpose between ranks needs at least 2, got ${ranks}` : undefined),
  } satisfies App<{ rows: number }>,
  kv: {
    title: 'key-value server and clients (GET/SET over SEND/RECV, values read by RDMA READ), a pinned server held to RLIMIT_MEMLOCK',
    kernel: kv,
    defaultSize: 4096,
    params: (keys: number, memlockKiB?: number) => ({ keys, valueBytes: PAGE_SIZE, batch: KV_BATCH, memlockBytes: memlockBytes(memlockKiB) }),
    check: (ranks: number, keys: number) =>
      ranks < 2
        ? `--ranks: a key-value job needs a server and at least one client (2 ranks), got ${ranks}`
        : keys < ranks - 1
          ? `--size: each of the ${ranks - 1} clients needs keys of its own: at least ${ranks - 1} keys, got ${keys}`
          : undefined,
  } satisfies App<KvParams>,
};

/** Operations per kv client per step. */
const KV_BATCH = 64;

/** The pinned kv server's lock budget: --memlock, else this process's RLIMIT_MEMLOCK (soft; unlimited: no budget). */
function memlockBytes(kib?: number): number {
  if (kib !== undefined) return kib * 1024;
  const soft = binding.memlockLimit().soft;
  return soft < 0 ? Infinity : soft;
}

/** An application's name. */
export type AppName = keyof typeof APPS;
