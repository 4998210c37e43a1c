// First faults: a native thread reads pages nobody has touched; every page is a genuine
// missing fault that the kernel hands to this TypeScript handler, which fills it in. Then
// the main JS thread reads an evicted page itself: that fault cannot wait for a handler
// running on the very same thread, so native code resolves it at once (docs/threads.md).
import { mapRegion, Userfaultfd, touch, PAGE_SIZE, type ChromeTraceEvent, type UffdStats } from '../../lib/index.js';
import { print } from './support/format.js';
import type { TraceFile } from './support/trace-file.js';

export interface FirstFaultsOptions {
  /** Pages of fresh memory the toucher thread reads (default 64). */
  pages?: number;
  /** Where to put a trace of the faults (--trace). */
  trace?: TraceFile;
}

export interface FirstFaultsResult {
  mode: string;
  pages: number;
  faultsHandled: number;
  bytesOk: boolean;
  coldUsPerPage: number;
  warmFaults: number;
  warmUsPerPage: number;
  resolvedNatively: number;
  stats: UffdStats;
}

export async function firstFaults(options: FirstFaultsOptions = {}): Promise<FirstFaultsResult> {
  const pages = options.pages ?? 64;
  const region = mapRegion(pages * PAGE_SIZE);
  const uffd = Userfaultfd.open();
  // Trace: one 'resolve' slice per fault on the JS thread, one 'touch' slice per toucher run.
  const pid = options.trace?.nextPid() ?? 0;
  const slices: ChromeTraceEvent[] = [];
  const slice = (name: string, tid: number, startMs: number, endMs: number, args: Record<string, unknown>) =>
    slices.push({ name, cat: 'uffd', ph: 'X', ts: startMs * 1000, dur: Math.max(0, (endMs - startMs) * 1000), pid, tid, args });
  try {
    uffd.register(region);
    print(
      `userfaultfd opened via ${uffd.mode}; exact addresses: ${uffd.features.exactAddress}; handler thread (this JS thread) ${uffd.handlerThreadId}`,
    );
    print(`resident before: ${region.residentPages()} of ${pages} pages (mincore)`);

    const seen: number[] = [];
    uffd.onFault((fault) => {
      seen.push(fault.offset / PAGE_SIZE);
      // Fill the page with its own number, so the reader can tell who put what where.
      uffd.copy(fault.region, fault.offset, Buffer.alloc(PAGE_SIZE, fault.offset / PAGE_SIZE));
      if (options.trace)
        slice('resolve', uffd.handlerThreadId, fault.receivedAt, performance.now(), {
          offset: fault.offset,
          kind: fault.kind,
          thread: fault.threadId,
          by: 'UFFDIO_COPY',
        });
    });

    let t0 = performance.now();
    const result = await touch(region); // a native thread, not this one, takes the faults
    if (options.trace) slice('touch', result.threadId, t0, performance.now(), { pages: result.pages });
    const bytesOk = result.data!.every((byte, i) => byte === Math.floor(i / PAGE_SIZE) % 256);
    const coldUsPerPage = result.ns / 1e3 / result.pages;
    print(
      `toucher thread ${result.threadId} read ${result.pages} pages in ${(result.ns / 1e3).toFixed(0)} µs (measured: ${coldUsPerPage.toFixed(1)} µs per faulting page, cold)`,
    );
    print(`faults handled in TypeScript: ${seen.length} (pages ${seen.slice(0, 8).join(', ')}, …), each answered with UFFDIO_COPY`);
    print(`bytes read back match what the handler placed: ${bytesOk}`);
    print(`resident after: ${region.residentPages()} of ${pages} pages`);
    const faultsHandled = seen.length;

    const evicted = Math.min(16, pages);
    region.evict(0, evicted * PAGE_SIZE);
    print(`after evict(${evicted} pages) with MADV_DONTNEED: resident ${region.residentPages()}`);
    seen.length = 0;
    t0 = performance.now();
    const again = await touch(region, { length: evicted * PAGE_SIZE, probe: true });
    if (options.trace) slice('touch', again.threadId, t0, performance.now(), { pages: again.pages });
    const warmUsPerPage = again.ns / 1e3 / again.pages;
    print(`the toucher reads them again: ${seen.length} new faults, handled in TypeScript (measured: ${warmUsPerPage.toFixed(1)} µs per page, warm)`);
    const warmFaults = seen.length;

    region.evict(0, PAGE_SIZE);
    const native = uffd.stats().resolvedNatively;
    const first = new Uint8Array(region.buffer)[0];
    const resolvedNatively = uffd.stats().resolvedNatively - native;
    print(
      `the main JS thread reads evicted page 0 itself: it sees ${first} (zero page), resolved in native code ` +
        `(resolvedNatively +${resolvedNatively}): the JS thread never waits for its own handler`,
    );
    const stats = uffd.stats();
    print(
      `uffd stats: ${Object.entries(stats)
        .map(([k, v]) => `${k} ${v}`)
        .join(', ')}`,
    );
    if (options.trace) {
      const meta = (tid: number, name: string): ChromeTraceEvent => ({
        name: 'thread_name',
        cat: '__metadata',
        ph: 'M',
        ts: 0,
        pid,
        tid,
        args: { name },
      });
      options.trace.add(
        {
          name: 'process_name',
          cat: '__metadata',
          ph: 'M',
          ts: 0,
          pid,
          tid: 0,
          args: { name: 'this process: userfaultfd faults, measured (real time)' },
        },
        meta(uffd.handlerThreadId, `JS thread ${uffd.handlerThreadId} (fault handler)`),
        meta(result.threadId, `toucher thread ${result.threadId}`),
        ...(again.threadId !== result.threadId ? [meta(again.threadId, `toucher thread ${again.threadId}`)] : []),
        ...slices,
      );
    }
    return { mode: uffd.mode, pages, faultsHandled, bytesOk, coldUsPerPage, warmFaults, warmUsPerPage, resolvedNatively, stats };
  } finally {
    uffd.close();
    region.close();
  }
}
