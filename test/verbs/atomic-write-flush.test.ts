// ATOMIC WRITE and RDMA FLUSH (IBV_WR_ATOMIC_WRITE, IBV_WR_FLUSH), as rdma-core's ODP suite
// runs RC operations: 100 iterations of the operation with both sides' buffers evicted before
// each, the data checked at the responder, every status success and wc.odp showing the faults;
// then the error paths rdma_rxe gives them (alignment, length, access, placement type).
import { afterEach, describe, expect, test } from 'vitest';
import { Access, FlushLevel, FlushType, OdpTransportCaps, SendFlags, WcOpcode, WcStatus, WrOpcode, type SendWr } from '../../lib/index.js';
import { allBytes, closeAll, createPlayers, MSG, next, ODP_ACCESS, P, pollOk, region, setU64, thrown, u64, type Player } from './helpers.js';

afterEach(closeAll);

const FLUSH_ACCESS = ODP_ACCESS | Access.FLUSH_GLOBAL;
const QP_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC | Access.FLUSH_GLOBAL;

const atomicWrite = (req: Player, resp: Player, wrId: number, o: { at?: number; remote?: number; length?: number } = {}): SendWr => ({
  wrId,
  opcode: WrOpcode.ATOMIC_WRITE,
  sgList: [req.sge(o.at ?? 0, o.length ?? 8)],
  sendFlags: SendFlags.SIGNALED,
  rdma: { remoteAddr: resp.at(o.remote ?? 0), rkey: resp.mr.rkey },
});

const flush = (resp: Player, wrId: number, o: { at?: number; length?: number; type?: number; level?: number } = {}): SendWr => ({
  wrId,
  opcode: WrOpcode.FLUSH,
  sgList: [],
  sendFlags: SendFlags.SIGNALED,
  flush: {
    remoteAddr: resp.at(o.at ?? 0),
    rkey: resp.mr.rkey,
    length: o.length ?? MSG,
    type: o.type ?? FlushType.GLOBAL,
    level: o.level ?? FlushLevel.RANGE,
  },
});

describe('ATOMIC WRITE with ODP', () => {
  test('100 iterations, both sides evicted each time: the word lands whole, every status success, the destination fault in wc.odp', async () => {
    const { client, server } = createPlayers();
    const caps = client.ctx.queryDevice().odpCaps.rcOdpCaps;
    expect(caps & (OdpTransportCaps.ATOMIC_WRITE | OdpTransportCaps.FLUSH)).toBe(OdpTransportCaps.ATOMIC_WRITE | OdpTransportCaps.FLUSH);
    for (let i = 0; i < 100; i++) {
      for (const [req, resp] of [
        [client, server],
        [server, client],
      ] as const) {
        req.region.evict();
        resp.region.evict();
        const v = BigInt.asUintN(64, 0x0123_4567_89ab_cdefn * BigInt(i + 1));
        setU64(req, v); // the CPU's write makes the source page resident again
        req.qp.postSend(atomicWrite(req, resp, i));
        const wc = await pollOk(req.cq);
        expect([wc.opcode, wc.byteLen]).toEqual([WcOpcode.ATOMIC_WRITE, 8]);
        expect(u64(resp)).toBe(v);
        expect(wc.odp!.faults).toEqual({ source: 0, destination: 1 });
      }
    }
  });

  test('a source word on an unmapped page (memfd, contents kept) faults at the source and still lands', async () => {
    const { client, server } = createPlayers({ shared: true });
    for (let i = 0; i < 10; i++) {
      const v = 0xfeed_0000_0000_0000n + BigInt(i);
      setU64(client, v);
      client.region.unmapPages();
      server.region.evict();
      client.qp.postSend(atomicWrite(client, server, i));
      const wc = await pollOk(client.cq);
      expect(u64(server)).toBe(v);
      expect(wc.odp!.faults).toEqual({ source: 1, destination: 1 });
    }
  });
});

describe('RDMA FLUSH with ODP', () => {
  test('100 iterations of WRITE then FLUSH (global, range) over written and evicted pages: success, data in place, the FLUSH faults in what was evicted', async () => {
    const { client, server } = createPlayers({ access: FLUSH_ACCESS, rc: { qpAccessFlags: QP_ACCESS } });
    for (let i = 0; i < 100; i++) {
      client.region.evict();
      server.region.evict();
      const byte = 0x41 + (i % 26);
      client.fill(byte, 0, MSG);
      client.qp.postSend({
        wrId: i,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [client.sge(0, MSG)],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
      });
      const w = await pollOk(client.cq);
      expect(w.odp!.faults).toEqual({ source: 0, destination: 1 });
      // The range covers the page just written and the next one, still evicted: that one faults.
      client.qp.postSend(flush(server, i, { length: 2 * P }));
      const f = await pollOk(client.cq);
      expect([f.opcode, f.byteLen]).toEqual([WcOpcode.FLUSH, 0]);
      expect(f.odp!.faults).toEqual({ source: 0, destination: 1 });
      allBytes(server.bytes(0, MSG), byte);
    }
  });

  test('selectivity MR: the whole MR, no range walked', async () => {
    const { client, server } = createPlayers({ access: FLUSH_ACCESS, rc: { qpAccessFlags: QP_ACCESS } });
    server.region.evict();
    client.qp.postSend(flush(server, 1, { level: FlushLevel.MR, length: 0 }));
    const f = await pollOk(client.cq);
    expect(f.odp!.faults).toEqual({ source: 0, destination: 0 });
  });
});

describe('error paths', () => {
  test('FLUSH on an MR registered without FLUSH_GLOBAL: REM_ACCESS_ERR, and the QP goes to ERR', async () => {
    const { client, server } = createPlayers({ rc: { qpAccessFlags: QP_ACCESS } });
    client.qp.postSend(flush(server, 1));
    client.qp.postSend(flush(server, 2));
    expect((await next(client.cq)).status).toBe(WcStatus.REM_ACCESS_ERR);
    expect((await next(client.cq)).status).toBe(WcStatus.WR_FLUSH_ERR);
  });

  test('FLUSH to a QP without FLUSH_GLOBAL in qp_access_flags, and a PERSISTENT flush: REM_ACCESS_ERR', async () => {
    const a = createPlayers({ access: FLUSH_ACCESS });
    a.client.qp.postSend(flush(a.server, 1));
    expect((await next(a.client.cq)).status).toBe(WcStatus.REM_ACCESS_ERR);
    const b = createPlayers({ access: FLUSH_ACCESS, rc: { qpAccessFlags: QP_ACCESS | Access.FLUSH_PERSISTENT } });
    b.client.qp.postSend(flush(b.server, 1, { type: FlushType.PERSISTENT }));
    expect((await next(b.client.cq)).status).toBe(WcStatus.REM_ACCESS_ERR);
  });

  test('FLUSH_PERSISTENT is refused at registration, with the reason', () => {
    const { client } = createPlayers();
    const r = region(P);
    const e = thrown(() => client.ctx.regMr(client.pd, r, 0, P, Access.LOCAL_WRITE | Access.FLUSH_PERSISTENT));
    expect(e.code).toBe('EINVAL');
    expect(e.message).toMatch(/persistent memory.*FLUSH_GLOBAL/);
  });

  test('bad FLUSH and ATOMIC_WRITE requests are refused at post time with the field', () => {
    const { client, server } = createPlayers();
    const bad = (wr: SendWr) => thrown(() => client.qp.postSend(wr)) as Error & { field?: string };
    expect(bad({ ...flush(server, 1), flush: undefined } as SendWr).field).toBe('flush');
    expect(bad(flush(server, 1, { type: 4 })).field).toBe('flush.type');
    expect(bad(flush(server, 1, { level: 2 })).field).toBe('flush.level');
    expect(bad({ ...flush(server, 1), sgList: [client.sge(0, 8)] }).field).toBe('sgList');
    expect(bad({ ...atomicWrite(client, server, 1), rdma: undefined } as SendWr).field).toBe('rdma');
  });

  test('ATOMIC WRITE: misaligned → REM_INV_REQ_ERR, not 8 bytes → LOC_LEN_ERR, MR without REMOTE_WRITE → REM_ACCESS_ERR', async () => {
    const a = createPlayers();
    a.client.qp.postSend(atomicWrite(a.client, a.server, 1, { remote: 4 }));
    expect((await next(a.client.cq)).status).toBe(WcStatus.REM_INV_REQ_ERR);
    const b = createPlayers();
    b.client.qp.postSend(atomicWrite(b.client, b.server, 1, { length: 4 }));
    expect((await next(b.client.cq)).status).toBe(WcStatus.LOC_LEN_ERR);
    const c = createPlayers({ access: Access.LOCAL_WRITE | Access.REMOTE_READ | Access.ON_DEMAND });
    setU64(c.server, 7n);
    c.client.qp.postSend(atomicWrite(c.client, c.server, 1));
    expect((await next(c.client.cq)).status).toBe(WcStatus.REM_ACCESS_ERR);
    expect(u64(c.server)).toBe(7n);
  });
});
