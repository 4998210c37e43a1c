// First faults: a native thread reads 64 pages nobody has touched; every page is a genuine
// missing fault that the kernel hands to this TypeScript handler, which fills it in. Then
// the main JS thread reads an evicted page itself: that fault cannot wait for a handler
// running on the very same thread, so native code resolves it at once (docs/threads.md).
import { mapRegion, Userfaultfd, touch, PAGE_SIZE } from '../lib/index.js';
import { heading, isMain } from './support/format.js';

export async function firstFaults(options: { pages?: number } = {}): Promise<void> {
  const pages = options.pages ?? 64;
  const region = mapRegion(pages * PAGE_SIZE);
  const uffd = Userfaultfd.open();
  try {
    uffd.register(region);
    console.log(`userfaultfd opened via ${uffd.mode}; exact addresses: ${uffd.features.exactAddress}; handler thread (this JS thread) ${uffd.handlerThreadId}`);
    console.log(`resident before: ${region.residentPages()} of ${pages} pages (mincore)`);

    const seen: number[] = [];
    uffd.onFault((fault) => {
      seen.push(fault.offset / PAGE_SIZE);
      // Fill the page with its own number, so the reader can tell who put what where.
      uffd.copy(fault.region, fault.offset, Buffer.alloc(PAGE_SIZE, fault.offset / PAGE_SIZE));
    });

    const result = await touch(region); // a native thread, not this one, takes the faults
    const ok = result.data!.every((byte, i) => byte === Math.floor(i / PAGE_SIZE) % 256);
    console.log(`toucher thread ${result.threadId} read ${result.pages} pages in ${(result.ns / 1e3).toFixed(0)} µs (measured: ${(result.ns / 1e3 / result.pages).toFixed(1)} µs per faulting page, cold)`);
    console.log(`faults handled in TypeScript: ${seen.length} (pages ${seen.slice(0, 8).join(', ')}, …), each answered with UFFDIO_COPY`);
    console.log(`bytes read back match what the handler placed: ${ok}`);
    console.log(`resident after: ${region.residentPages()} of ${pages} pages`);

    const evicted = Math.min(16, pages);
    region.evict(0, evicted * PAGE_SIZE);
    console.log(`after evict(${evicted} pages) with MADV_DONTNEED: resident ${region.residentPages()}`);
    seen.length = 0;
    const again = await touch(region, { length: evicted * PAGE_SIZE, probe: true });
    console.log(`the toucher reads them again: ${seen.length} new faults, handled in TypeScript (measured: ${(again.ns / 1e3 / again.pages).toFixed(1)} µs per page, warm)`);

    region.evict(0, PAGE_SIZE);
    const native = uffd.stats().resolvedNatively;
    const first = new Uint8Array(region.buffer)[0];
    console.log(
      `the main JS thread reads evicted page 0 itself: it sees ${first} (zero page), resolved in native code ` +
        `(resolvedNatively +${uffd.stats().resolvedNatively - native}): the JS thread never waits for its own handler`,
    );
    const s = uffd.stats();
    console.log(`uffd stats: ${Object.entries(s).map(([k, v]) => `${k} ${v}`).join(', ')}`);
  } finally {
    uffd.close();
    region.close();
  }
}

if (isMain(import.meta.url)) {
  heading('First faults: genuine userfaultfd page faults handled in TypeScript');
  await firstFaults();
}
