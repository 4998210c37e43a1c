// Two engine bugs a hand mutation put in that no other test saw (issue 35, section 6), each
// observable through the verbs:
// - a multi-packet RDMA WRITE whose last byte is one past its MR must land nothing: RC checks
//   the whole RETH range on the first packet (rc.ts keyFor, `mr.covers(va, rest)`); checked one
//   byte short, the first packets land before the last one is refused;
// - one fault answer serving a page with a source-side and a destination-side waiter on the
//   same node: each waiter goes its own side's way (faults.ts answer, `w.side`); taken from the
//   fault's side, the other waiter sits until the fault timeout.
// Byte-exact shadows of both players' whole regions: the bytes around every buffer are canaries.
import { afterEach, describe, expect, test } from 'vitest';
import { SendFlags, WcStatus, WrOpcode } from '../../lib/index.js';
import { closeAll, createPlayers, next, ODP_ACCESS, P, type Player } from './helpers.js';

afterEach(closeAll);

const PAGES = 16;

/** Fill a player's whole region with a pattern of its own and return the shadow of it. */
function pattern(p: Player, seed: number): Buffer {
  const b = p.bytes(0, PAGES * P);
  for (let i = 0; i < b.length; i++) b[i] = (i * 31 + seed + (i >> 12)) & 0xff;
  return Buffer.from(b);
}

/** Every byte of the player's region is the shadow's (the first difference named otherwise). */
function same(p: Player, shadow: Buffer): void {
  const b = p.bytes(0, PAGES * P);
  const i = b.findIndex((x, k) => x !== shadow[k]);
  if (i >= 0) expect.fail(`${p.name} byte ${i} (page ${Math.floor(i / P)}) is 0x${b[i]!.toString(16)}, the shadow says 0x${shadow[i]!.toString(16)}`);
}

describe('a multi-packet RDMA WRITE that ends one byte past its MR', () => {
  test('8 pages + 1 byte, the source partly unmapped: REM_ACCESS_ERR, byte_len 0, not one byte landed', async () => {
    // memfd memory: unmapPages keeps the source's bytes, so the shadow holds across its faults.
    const { client, server } = createPlayers({ shared: true, size: PAGES * P });
    // The destination MR: pages 2 … 9 of the server's region; pages 0-1 and 10-15 are canaries.
    const mr = server.ctx.regMr(server.pd, server.region, 2 * P, 8 * P, ODP_ACCESS);
    const src = pattern(client, 1);
    let dst = pattern(server, 2);
    const write = (wrId: number, length: number) =>
      client.qp.postSend({
        wrId,
        opcode: WrOpcode.RDMA_WRITE,
        sendFlags: SendFlags.SIGNALED,
        sgList: [client.sge(0, length)],
        rdma: { remoteAddr: server.at(2 * P), rkey: mr.rkey },
      });

    // The control: the same WRITE of exactly 8 pages goes as several packets (the source fault
    // at page 3 splits it) and lands whole.
    client.region.unmapPages(3 * P, P);
    client.region.unmapPages(6 * P, P);
    write(1, 8 * P);
    const ok = await next(client.cq);
    expect(ok.status, ok.statusStr).toBe(WcStatus.SUCCESS);
    expect(ok.odp?.faults.source).toBeGreaterThanOrEqual(1);
    src.copy(dst, 2 * P, 0, 8 * P);
    same(server, dst);
    same(client, src);

    // One byte more: past the MR. Nothing of it may land, not even the packets before the fault.
    dst = pattern(server, 3);
    client.region.unmapPages(3 * P, P);
    client.region.unmapPages(6 * P, P);
    write(2, 8 * P + 1);
    const wc = await next(client.cq);
    expect(wc.wrId).toBe(2n);
    expect(wc.status, wc.statusStr).toBe(WcStatus.REM_ACCESS_ERR);
    expect(wc.byteLen).toBe(0);
    // Let anything still in flight land before the bytes are compared.
    await new Promise((r) => setTimeout(r, 50));
    same(server, dst);
    same(client, src);
  });
});

describe('one page with a source-side and a destination-side fault waiter on one node', () => {
  test('both WRs complete well before the fault timeout, with their bytes', async () => {
    // A fault timeout far beyond the test's waits: a waiter left to it fails the test.
    const { cluster, client, server } = createPlayers({ shared: true, size: PAGES * P, cluster: { faultTimeoutMs: 30_000 } });
    const src = pattern(client, 4);
    const dst = pattern(server, 5);
    // Page 5 of the server's region not resident: the client's WRITE writes its second half (a
    // destination fault on node 1); the moment that fault is seen, the server posts a WRITE
    // that reads the page's first half (a source fault on node 1): both on the server's PD's
    // stream and the same page, both recorded before the fault library answers either, so the
    // one answer the driver passes on finds both waiting and has to serve both.
    const Q = 5 * P;
    const H = P / 2;
    for (let round = 0; round < 4; round++) {
      server.region.unmapPages(Q, P);
      const t0 = performance.now();
      let posted = false;
      const off = cluster.system.tracer.on((e) => {
        if (posted || e.kind !== 'fault' || e.node !== server.ctx.node || e.side !== 'destination') return;
        posted = true;
        server.qp.postSend({
          wrId: 10 + round,
          opcode: WrOpcode.RDMA_WRITE,
          sendFlags: SendFlags.SIGNALED,
          sgList: [server.sge(Q, H)],
          rdma: { remoteAddr: client.at(8 * P + round * H), rkey: client.mr.rkey },
        });
      });
      client.qp.postSend({
        wrId: 20 + round,
        opcode: WrOpcode.RDMA_WRITE,
        sendFlags: SendFlags.SIGNALED,
        sgList: [client.sge(round * H, H)],
        rdma: { remoteAddr: server.at(Q + H), rkey: server.mr.rkey },
      });
      const b = await next(client.cq);
      off();
      expect(posted, "the server's WRITE went out on the destination fault").toBe(true);
      const a = await next(server.cq);
      const ms = performance.now() - t0;
      expect([a.wrId, a.status, a.byteLen], a.statusStr).toEqual([BigInt(10 + round), WcStatus.SUCCESS, H]);
      expect([b.wrId, b.status, b.byteLen], b.statusStr).toEqual([BigInt(20 + round), WcStatus.SUCCESS, H]);
      expect([a.odp!.faults.source, b.odp!.faults.destination], 'both sides faulted on page 5').toEqual([1, 1]);
      expect(ms, 'no waiter was left to the fault timeout').toBeLessThan(4_000);
      // The server's first half went to the client; the client's bytes to the server's second half.
      dst.copy(src, 8 * P + round * H, Q, Q + H);
      src.copy(dst, Q + H, round * H, round * H + H);
      same(client, src);
      same(server, dst);
    }
  });
});
