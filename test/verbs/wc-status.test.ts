// The completer's two small pure parts, value by value: which work completion status each DMA
// outcome becomes (the side decides between the requester's and the responder's status),
// and how the faults and times of several transfers add up into one completion's odp.
import { describe, expect, test } from 'vitest';
import { DmaStatus, type DmaCompletion } from '../../kernel-sim/index.js';
import { WcStatus } from '../../lib/index.js';
import { done, emptyOdp, fail, statusOf } from '../../lib/verbs/completer.js';

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
