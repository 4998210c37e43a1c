// Small shared pieces of the test suites: resource cleanup, page-sized buffers, and a
// handler that records every fault it is given.
import { readFileSync, writeFileSync } from 'node:fs';
import { afterEach } from 'vitest';
import { PAGE_SIZE, type Fault, type FaultHandler, type Userfaultfd } from '../lib/index.js';

export const P = PAGE_SIZE;

/** Closes everything handed to it after each test, newest first (uffds before their regions). */
export function closer(): <T extends { close(): void }>(resource: T) => T {
  const open: { close(): void }[] = [];
  afterEach(() => {
    for (const r of open.splice(0).reverse()) r.close();
  });
  return (resource) => {
    open.push(resource);
    return resource;
  };
}

/** `pages` pages, page i filled with the byte `base + i`. */
export function pattern(pages: number, base = 1): Buffer {
  const b = Buffer.alloc(pages * P);
  for (let i = 0; i < pages; i++) b.fill((base + i) & 0xff, i * P, (i + 1) * P);
  return b;
}

export interface Deferred<T> {
  promise: Promise<T>;
  resolve(value: T): void;
}

export function deferred<T = void>(): Deferred<T> {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Wait (generously) until `cond` holds; fails the test with `what` instead of hanging. */
export async function until(what: string, cond: () => boolean, timeoutMs = 10_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

/** A handler that records each fault, then runs `resolve` on it. `first` settles on the first fault. */
export function recording(resolve: (fault: Fault, uffd: Userfaultfd) => unknown): {
  faults: Fault[];
  first: Promise<Fault>;
  handler: FaultHandler;
} {
  const faults: Fault[] = [];
  const first = deferred<Fault>();
  return {
    faults,
    first: first.promise,
    handler: (fault, uffd) => {
      faults.push(fault);
      if (faults.length === 1) first.resolve(fault);
      return resolve(fault, uffd) as void | Promise<void>; // the library awaits thenables only
    },
  };
}

/** The error code of whatever `fn` throws (undefined if it does not throw). */
export function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return (err as { code?: string }).code;
  }
  return undefined;
}

/** Free 2 MiB pages in the hugetlb pool now. */
export function freeHugePages(): number {
  return Number(/HugePages_Free:\s+(\d+)/.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1] ?? 0);
}

/**
 * Make at least `want` 2 MiB pages free in the hugetlb pool (as root, as the kernel's
 * run_vmtests.sh does); `release` takes back only what this call added. The pool is the
 * machine's, and test files run side by side: each raises and lowers it by its own share, never
 * writes back a value it read earlier (which would take another file's pages away mid-test).
 * Throws if the pool cannot be raised (not root).
 */
export function reserveHugePages(want: number): { release(): void } {
  const pool = '/proc/sys/vm/nr_hugepages';
  const added = Math.max(0, want - freeHugePages());
  if (added > 0) writeFileSync(pool, String(Number(readFileSync(pool, 'utf8')) + added));
  let released = false;
  return {
    release() {
      if (released || added === 0) return;
      released = true;
      writeFileSync(pool, String(Math.max(0, Number(readFileSync(pool, 'utf8')) - added)));
    },
  };
}
