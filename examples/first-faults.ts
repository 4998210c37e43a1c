// First faults: a native thread reads 64 pages nobody has touched; every page is a genuine
// missing fault that the kernel hands to this TypeScript handler, which fills it in.
import { mapRegion, Userfaultfd, touch, PAGE_SIZE } from '../lib/index.js';

const pages = 64;
const region = mapRegion(pages * PAGE_SIZE);
const uffd = Userfaultfd.open();
uffd.register(region);
console.log(`userfaultfd opened via ${uffd.mode}; exact addresses: ${uffd.features.exactAddress}; handler thread ${uffd.handlerThreadId}`);
console.log(`resident before: ${region.residentPages()} of ${pages} pages`);

const seen: number[] = [];
uffd.onFault((fault) => {
  seen.push(fault.offset / PAGE_SIZE);
  // Fill the page with its own number, so the reader can tell who put what where.
  uffd.copy(fault.region, fault.offset, Buffer.alloc(PAGE_SIZE, fault.offset / PAGE_SIZE));
});

const result = await touch(region); // a native thread, not this one, takes the faults
const ok = result.data!.every((byte, i) => byte === Math.floor(i / PAGE_SIZE));
console.log(`toucher thread ${result.threadId} read ${result.pages} pages in ${(result.ns / 1e3).toFixed(0)} µs`);
console.log(`faults handled in TypeScript: ${seen.length} (pages ${seen.slice(0, 8).join(', ')}, …)`);
console.log(`bytes read back match what the handler placed: ${ok}`);
console.log(`resident after: ${region.residentPages()} of ${pages} pages`);

region.evict(0, 16 * PAGE_SIZE);
console.log(`after evict(16 pages): resident ${region.residentPages()}`);
seen.length = 0;
await touch(region, { length: 16 * PAGE_SIZE, probe: true });
console.log(`touching them again: ${seen.length} new faults`);
console.log('stats', uffd.stats());
uffd.close();
region.close();
