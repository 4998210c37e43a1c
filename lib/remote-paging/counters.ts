// The remote pager's counters: a SharedArrayBuffer the DM-Handler's worker adds to and the
// main thread reads at any time, without a message round trip (the live summary line, and
// the fault library telling a major fault from a minor one).

export enum Counter {
  faults,
  majorFaults,
  minorFaults,
  pagesFetched,
  prefetched,
  evicted,
  writtenBack,
  droppedClean,
  bytesIn,
  bytesOut,
  resident,
  errors,
  poisoned,
  corrupt,
  lost,
  keysDeleted,
  prefetchUsed,
}

export type Counters = BigInt64Array;

export const COUNTER_NAMES = Object.keys(Counter).filter((k) => Number.isNaN(Number(k))) as (keyof typeof Counter)[];

export function newCounters(): SharedArrayBuffer {
  return new SharedArrayBuffer(COUNTER_NAMES.length * 8);
}

/** The counters as numbers. */
export function readCounters(sab: SharedArrayBuffer): Record<keyof typeof Counter, number> {
  const c = new BigInt64Array(sab);
  const out = {} as Record<keyof typeof Counter, number>;
  for (const name of COUNTER_NAMES) out[name] = Number(Atomics.load(c, Counter[name]));
  return out;
}
