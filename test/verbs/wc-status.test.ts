// The completer's two small pure parts, value by value: which work completion status each DMA
// outcome becomes (the side decides between the requester's and the responder's status),
// and how the faults and times of several transfers add up into one completion's odp. Then
// the completer on the wire: a WR whose last block faults, and what lands after an error
// completion (nothing: the WRs behind it are flushed, WR_FLUSH_ERR, as libibverbs has it).
import { afterEach, describe, expect, test } from 'vitest';
import { DmaStatus, type DmaCompletion } from '../../kernel-sim/index.js';
import { QpState, SendFlags, WcOpcode, WcStatus, WrOpcode, type SendWr } from '../../lib/index.js';
import { done, emptyOdp, fail, statusOf } from '../../kernel-sim/rc/completer.js';
import { closeAll, createPlayers, next, P } from './helpers.js';

afterEach(closeAll);

/** A DMA completion with what the completer reads of it; the rest as an engine would fill it. */
function dma(status: DmaStatus, o: Partial<DmaCompletion> = {}): DmaCompletion {
  return {
    tid: 1,
    status,
    statusName: DmaStatus[status],
    descriptor: { channel: 0, srcVa: 0n, dstNode: 1, dstVa: 0n, length: 4096, pd: 1 },
    bytes: 4096,
    blocks: 1,
    faults: { source: 0, destination: 0 },
    retransmittedBlocks: 0,
    nacks: 0,
    pagesFetched: 0,
    model: { startUs: 0, endUs: 1, us: 1, label: 'model' },
    real: { us: 1, faultUs: [] },
    ...o,
  };
}

describe('statusOf: the completion status of a DMA outcome', () => {
  test.each<[string, DmaStatus, 'source' | 'destination' | undefined, WcStatus]>([
    ['SUCCESS', DmaStatus.SUCCESS, undefined, WcStatus.SUCCESS],
    ['SRC_ADDR_ERR', DmaStatus.SRC_ADDR_ERR, 'source', WcStatus.LOC_PROT_ERR],
    ['SRC_PERM_ERR', DmaStatus.SRC_PERM_ERR, 'source', WcStatus.LOC_PROT_ERR],
    ['DST_ADDR_ERR', DmaStatus.DST_ADDR_ERR, 'destination', WcStatus.REM_ACCESS_ERR],
    ['DST_PERM_ERR', DmaStatus.DST_PERM_ERR, 'destination', WcStatus.REM_ACCESS_ERR],
    ['PD_ERR', DmaStatus.PD_ERR, 'destination', WcStatus.REM_ACCESS_ERR],
    ['RETRY_EXCEEDED at the destination (RNR NAKs)', DmaStatus.RETRY_EXCEEDED, 'destination', WcStatus.RNR_RETRY_EXC_ERR],
    ['RETRY_EXCEEDED at the source', DmaStatus.RETRY_EXCEEDED, 'source', WcStatus.RETRY_EXC_ERR],
    ['FAULT_UNRESOLVED at the destination', DmaStatus.FAULT_UNRESOLVED, 'destination', WcStatus.REM_ACCESS_ERR],
    ['FAULT_UNRESOLVED at the source', DmaStatus.FAULT_UNRESOLVED, 'source', WcStatus.LOC_PROT_ERR],
    ['ABORTED (a stalled access ended)', DmaStatus.ABORTED, 'destination', WcStatus.REM_ABORT_ERR],
    ['FLUSHED (the engine closed)', DmaStatus.FLUSHED, 'source', WcStatus.WR_FLUSH_ERR],
    ['BAD_NODE', DmaStatus.BAD_NODE, undefined, WcStatus.GENERAL_ERR],
    ['BAD_CHANNEL', DmaStatus.BAD_CHANNEL, undefined, WcStatus.GENERAL_ERR],
    ['BAD_LENGTH', DmaStatus.BAD_LENGTH, undefined, WcStatus.GENERAL_ERR],
  ])('%s → %s', (_what, status, side, wc) => {
    expect(statusOf([dma(status, side ? { side } : {})])).toBe(wc);
  });

  test('the first failed transfer decides, whatever succeeded before or failed after it; none at all is a success', () => {
    const ok = dma(DmaStatus.SUCCESS);
    expect(statusOf([ok, dma(DmaStatus.FLUSHED, { side: 'source' }), dma(DmaStatus.DST_ADDR_ERR, { side: 'destination' })])).toBe(
      WcStatus.WR_FLUSH_ERR,
    );
    expect(statusOf([ok, ok])).toBe(WcStatus.SUCCESS);
    expect(statusOf([])).toBe(WcStatus.SUCCESS);
  });

  test('a fault the library could not resolve in the last transfer fails the whole WR, whatever landed before it', () => {
    const ok = dma(DmaStatus.SUCCESS);
    const last = dma(DmaStatus.FAULT_UNRESOLVED, { side: 'destination', faults: { source: 0, destination: 1 } });
    expect(statusOf([ok, ok, last])).toBe(WcStatus.REM_ACCESS_ERR);
    const out = done(statusOf([ok, ok, last]), 3 * 4096, [ok, ok, last]);
    expect(out.byteLen).toBe(0);
    expect(out.odp.faults).toEqual({ source: 0, destination: 1 });
    expect(statusOf([ok, dma(DmaStatus.FAULT_UNRESOLVED, { side: 'source' })])).toBe(WcStatus.LOC_PROT_ERR);
  });
});

describe('done: one completion of several transfers', () => {
  test('faults, major faults and retransmissions add up; real time is the longest, model time spans first start to last end', () => {
    const out = done(WcStatus.SUCCESS, 12_288, [
      dma(DmaStatus.SUCCESS, {
        faults: { source: 1, destination: 2 },
        retransmittedBlocks: 3,
        pagesFetched: 4,
        real: { us: 50, faultUs: [] },
        model: { startUs: 10, endUs: 30, us: 20, label: 'model' },
      }),
      dma(DmaStatus.SUCCESS, {
        faults: { source: 5, destination: 7 },
        retransmittedBlocks: 11,
        pagesFetched: 13,
        real: { us: 80, faultUs: [] },
        model: { startUs: 5, endUs: 25, us: 20, label: 'model' },
      }),
      dma(DmaStatus.SUCCESS, { real: { us: 20, faultUs: [] }, model: { startUs: 20, endUs: 40, us: 20, label: 'model' } }),
    ]);
    expect(out).toEqual({
      status: WcStatus.SUCCESS,
      byteLen: 12_288,
      odp: { faults: { source: 6, destination: 9 }, majorFaults: 17, retransmittedBlocks: 14, modelUs: 35, realUs: 80 },
    });
  });

  test('a failed outcome reports no bytes but keeps its faults; no transfer at all took no time', () => {
    const out = done(WcStatus.REM_ACCESS_ERR, 4096, [dma(DmaStatus.DST_ADDR_ERR, { side: 'destination', faults: { source: 0, destination: 1 } })]);
    expect(out.byteLen).toBe(0);
    expect(out.odp.faults).toEqual({ source: 0, destination: 1 });
    expect(done(WcStatus.SUCCESS, 0, [])).toEqual({ status: WcStatus.SUCCESS, byteLen: 0, odp: emptyOdp() });
    expect(emptyOdp()).toEqual({ faults: { source: 0, destination: 0 }, majorFaults: 0, retransmittedBlocks: 0, modelUs: 0, realUs: 0 });
    expect(fail(WcStatus.LOC_LEN_ERR)).toEqual({ status: WcStatus.LOC_LEN_ERR, byteLen: 0, odp: emptyOdp() });
  });
});

describe('the completer on the wire', () => {
  const PAGES = 16;
  const pattern = (b: Buffer, seed: number): void => {
    for (let i = 0; i < b.length; i++) b[i] = (i * 13 + seed + (i >> 12)) & 0xff;
  };

  test('a WRITE whose last block faults at the destination: SUCCESS with every byte, one fault, the last block sent again', async () => {
    const { client, server } = createPlayers({ size: PAGES * P, policy: 'touch' });
    pattern(client.bytes(0, PAGES * P), 1);
    pattern(server.bytes(0, PAGES * P), 2);
    const shadow = Buffer.from(server.bytes(0, PAGES * P));
    client.bytes(0, 8 * P).copy(shadow, 0);
    // Pages 0 … 6 resident at the destination, page 7 (the WR's last block) not (and not read
    // from here again: a read would map it back).
    server.region.evict(7 * P, P);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [client.sge(0, 8 * P)],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    const wc = await next(client.cq);
    expect(wc.status, wc.statusStr).toBe(WcStatus.SUCCESS);
    expect(wc.byteLen).toBe(8 * P);
    expect(wc.odp?.faults).toEqual({ source: 0, destination: 1 });
    expect(wc.odp?.retransmittedBlocks).toBeGreaterThanOrEqual(1);
    // Pages 8 … 15 of the destination are canaries: untouched.
    expect(server.bytes(0, PAGES * P).equals(shadow)).toBe(true);
  });

  test('after an error completion nothing of the WRs behind it lands: they complete WR_FLUSH_ERR, in order, and the QP is in ERR', async () => {
    const { client, server } = createPlayers({ size: PAGES * P });
    pattern(client.bytes(0, PAGES * P), 3);
    pattern(server.bytes(0, PAGES * P), 4);
    const shadow = Buffer.from(server.bytes(0, PAGES * P));
    // Some destination pages not resident, so the later WRITEs would fault (and be slow) if they went.
    server.region.evict(4 * P, 4 * P);
    shadow.fill(0, 4 * P, 8 * P);
    const write = (wrId: number, page: number, pages: number, rkey = server.mr.rkey): SendWr => ({
      wrId,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [client.sge(page * P, pages * P)],
      rdma: { remoteAddr: server.at(page * P), rkey },
    });
    // WR 1 lands; WR 2 names no MR (REM_ACCESS_ERR); WRs 3 … 6 are behind it, one unsignaled.
    client.qp.postSend([
      write(1, 0, 1),
      write(2, 1, 1, server.mr.rkey ^ 0x5a5a00),
      write(3, 2, 2),
      { ...write(4, 4, 4), sendFlags: 0 },
      write(5, 8, 1),
      { wrId: 6, opcode: WrOpcode.SEND, sendFlags: SendFlags.SIGNALED, sgList: [client.sge(9 * P, 64)] },
    ]);
    const wcs = [];
    for (let i = 0; i < 6; i++) wcs.push(await next(client.cq));
    expect(wcs.map((w) => [w.wrId, w.statusStr])).toEqual([
      [1n, 'success'],
      [2n, 'remote access error'],
      [3n, 'Work Request Flushed Error'],
      [4n, 'Work Request Flushed Error'],
      [5n, 'Work Request Flushed Error'],
      [6n, 'Work Request Flushed Error'],
    ]);
    expect(wcs[0]!.opcode).toBe(WcOpcode.RDMA_WRITE);
    expect(wcs.slice(1).every((w) => w.byteLen === 0)).toBe(true);
    expect(client.qp.query().qpState).toBe(QpState.ERR);
    // Let anything still in flight land, then only WR 1's page changed.
    await new Promise((r) => setTimeout(r, 100));
    client.bytes(0, P).copy(shadow, 0);
    const got = server.bytes(0, PAGES * P);
    const i = got.findIndex((x, k) => x !== shadow[k]);
    expect(i, `server byte ${i} (page ${Math.floor(i / P)}) changed`).toBe(-1);
    // A WR posted to the QP in ERR is flushed too, and lands nothing.
    client.qp.postSend(write(7, 10, 1));
    const late = await next(client.cq);
    expect([late.wrId, late.status]).toEqual([7n, WcStatus.WR_FLUSH_ERR]);
    await new Promise((r) => setTimeout(r, 50));
    expect(server.bytes(0, PAGES * P).equals(shadow)).toBe(true);
  });
});
