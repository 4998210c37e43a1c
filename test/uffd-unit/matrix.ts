// The matrix the kernel's userfaultfd unit tests run over (uffd-unit-tests.c: each test per
// memory type), ported to what a Node process has: both fault deliveries of this package,
// anonymous private memory ("anon") and memfd shared memory ("shmem").
import { mapRegion, touch, Userfaultfd, type Fault, type FaultHandler, type Region, type UffdOpenOptions } from '../../lib/index.js';
import { P } from '../helpers.js';

export const DELIVERIES = ['event-loop', 'thread'] as const;
export type Delivery = (typeof DELIVERIES)[number];

export const MEMORY = [
  { memory: 'anon', shared: false },
  { memory: 'shmem', shared: true },
] as const;

/** Every delivery × every memory type, as rows for describe.each. */
export const BOTH = DELIVERIES.flatMap((delivery) => MEMORY.map((m) => ({ delivery, ...m })));
/** Every delivery on anonymous memory only (kernel tests that cover anon alone). */
export const ANON = DELIVERIES.map((delivery) => ({ delivery, memory: 'anon', shared: false }));
/** Every delivery on shmem only (minor faults). */
export const SHMEM = DELIVERIES.map((delivery) => ({ delivery, memory: 'shmem', shared: true }));

export function open(delivery: Delivery, handler?: FaultHandler, options: UffdOpenOptions = {}): Userfaultfd {
  return Userfaultfd.open({ ...options, delivery, ...(handler ? { handler } : {}) });
}

export function region(pages: number, shared: boolean): Region {
  return mapRegion(pages * P, { shared });
}

/** Offsets (in pages) of faults of a kind. */
export const pagesOf = (faults: Fault[], kind?: Fault['kind']): number[] => faults.filter((f) => !kind || f.kind === kind).map((f) => f.offset / P);

/** What touch() rejected with (or undefined if it resolved). */
export async function touchError(
  r: Region,
  options?: Parameters<typeof touch>[1],
): Promise<{ code?: string; offsets?: number[]; signal?: string } | undefined> {
  try {
    await touch(r, options);
    return undefined;
  } catch (err) {
    return err as { code?: string; offsets?: number[]; signal?: string };
  }
}
