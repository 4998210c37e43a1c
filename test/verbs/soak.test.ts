// A short soak (PFR_SOAK_MS, default 3 s): RDMA writes and reads back and forth while
// timers keep dropping pages of both sides' buffers, every byte checked after every request.
// Shared (memfd) buffers keep their bytes when their page-table entries go, so each drop only
// makes the next access fault; the bytes must still be exactly what was written.
import { afterEach, expect, test } from 'vitest';
import { Access, Cluster, connectQps, mapRegion, PAGE_SIZE as P, SendFlags, WcStatus, WrOpcode, type Region } from '../../lib/index.js';

const open: Array<{ close(): void }> = [];
const timers: NodeJS.Timeout[] = [];
afterEach(() => {
  for (const t of timers.splice(0)) clearInterval(t);
  for (const r of open.splice(0).reverse()) r.close();
});

const PAGES = 64;

test('writes and reads under steady eviction on both sides: every byte verified, no error, no hang', async () => {
  const soakMs = Number(process.env.PFR_SOAK_MS ?? 3000);
  const cluster = Cluster.create({ nodes: 2 });
  open.push(cluster);
  const ends = [0, 1].map((node) => {
    const region = mapRegion(PAGES * P, { shared: true });
    open.unshift(region);
    const ctx = cluster.openDevice(node, { defaultPolicy: 'touch-ahead' });
    const pd = ctx.allocPd();
    const cq = ctx.createCq(16);
    const qp = ctx.createQp(pd, { sendCq: cq, recvCq: cq });
    const mr = ctx.regMr(pd, region, 0, region.size, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.ON_DEMAND);
    return { region, qp, cq, mr };
  });
  const [a, b] = ends as [(typeof ends)[0], (typeof ends)[0]];
  connectQps(a.qp, b.qp);
  const evictions = { count: 0 };
  let x = 1;
  const next = () => (x = (x * 1103515245 + 12345) >>> 0);
  for (const e of ends) {
    timers.push(
      setInterval(() => {
        const page = next() % PAGES;
        e.region.unmapPages(page * P, Math.min(1 + (next() % 4), PAGES - page) * P);
        evictions.count++;
      }, 1),
    );
  }
  const view = (r: Region) => new Uint8Array(r.buffer);
  const t0 = Date.now();
  let ops = 0;
  let faults = 0;
  let stamp = 1;
  while (Date.now() - t0 < soakMs) {
    const len = 1 + (next() % (8 * P));
    const off = next() % (PAGES * P - len);
    const roff = next() % (PAGES * P - len);
    // Write a fresh pattern from a to b, then read it back from b into another place of a.
    stamp = (stamp + 1) & 0xff || 1;
    const data = Buffer.alloc(len, stamp);
    for (let i = 0; i < len; i += 97) data[i] = (i * 31 + stamp) & 0xff;
    view(a.region).set(data, off);
    a.qp.postSend({
      wrId: ops,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [{ addr: a.region.address + BigInt(off), length: len, lkey: a.mr.lkey }],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: b.region.address + BigInt(roff), rkey: b.mr.rkey },
    });
    const w = await a.cq.next({ timeoutMs: 5000 });
    expect(WcStatus[w.status]).toBe('SUCCESS');
    expect(Buffer.from(b.region.buffer, roff, len).equals(data)).toBe(true);
    const back = (off + len + (next() % (PAGES * P))) % (PAGES * P - len);
    a.qp.postSend({
      wrId: ops + 1,
      opcode: WrOpcode.RDMA_READ,
      sgList: [{ addr: a.region.address + BigInt(back), length: len, lkey: a.mr.lkey }],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: b.region.address + BigInt(roff), rkey: b.mr.rkey },
    });
    const r = await a.cq.next({ timeoutMs: 5000 });
    expect(WcStatus[r.status]).toBe('SUCCESS');
    expect(Buffer.from(a.region.buffer, back, len).equals(data)).toBe(true);
    faults += (w.odp?.faults.source ?? 0) + (w.odp?.faults.destination ?? 0) + (r.odp?.faults.source ?? 0) + (r.odp?.faults.destination ?? 0);
    ops += 2;
  }
  console.log(`[soak] ${ops} requests in ${soakMs} ms, ${faults} faults, ${evictions.count} page drops`);
  expect(ops).toBeGreaterThan(20);
  expect(faults).toBeGreaterThan(10);
}, 120_000);
