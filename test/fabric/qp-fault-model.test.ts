// Stall mode as an attribute of the verbs QP (QpInitAttr.faultModel): checked at createQp,
// the model of the PD's SMMU stream (one per PD: a PD's QPs are of one model), and what the
// engine does on a fault: a terminate QP's write to evicted pages is aborted at the SMMU and
// its fault goes to the fault library (a NACK, then the retransmission), a stall QP's copy
// thread waits in the genuine fault instead (here the kernel resolves it: the memory is on no
// userfaultfd), so nothing reaches the fault library; the bytes land either way.
import { afterEach, describe, expect, it } from 'vitest';
import { connectQps, SendFlags, WcStatus, WrOpcode, type QueuePair } from '../../lib/index.js';
import { closeAll, createPlayers, next, P, type Player } from '../verbs/helpers.js';

afterEach(() => closeAll());

async function evictedWrite(client: Player, server: Player): Promise<number> {
  client.fill(0x5c, 0, 4 * P);
  server.region.evict();
  const before = server.ctx.faultLibrary.stats().faults.destination;
  client.qp.postSend({
    wrId: 1,
    opcode: WrOpcode.RDMA_WRITE,
    sgList: [client.sge(0, 4 * P)],
    sendFlags: SendFlags.SIGNALED,
    rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
  });
  const wc = await next(client.cq);
  expect(wc.status).toBe(WcStatus.SUCCESS);
  expect(server.bytes(0, 4 * P).every((b) => b === 0x5c)).toBe(true);
  return server.ctx.faultLibrary.stats().faults.destination - before;
}

describe('QpInitAttr.faultModel', () => {
  it("is 'terminate' or 'stall', checked; a PD's QPs share one model", () => {
    const { client } = createPlayers({ connect: false });
    const create = (faultModel: unknown, pd = client.pd) =>
      client.ctx.createQp(pd, { sendCq: client.cq, recvCq: client.cq, faultModel: faultModel as 'stall' });
    expect(() => create('pause')).toThrow(
      expect.objectContaining({ code: 'ERR_INVALID_ARG_VALUE', message: expect.stringMatching(/'terminate' or 'stall', got pause/) }),
    );
    expect(client.qp.faultModel).toBe('terminate');
    expect(() => create('stall')).toThrow(expect.objectContaining({ code: 'EINVAL', message: expect.stringMatching(/allocate another PD/) }));
    const pd = client.ctx.allocPd();
    const qp: QueuePair = create('stall', pd);
    expect([qp.faultModel, pd.stream.faultModel, client.pd.stream.faultModel]).toEqual(['stall', 'stall', 'terminate']);
  });

  it("a stall QP's write waits in the destination's fault where a terminate QP's is aborted and handed to the fault library", async () => {
    const t = createPlayers();
    expect(await evictedWrite(t.client, t.server)).toBeGreaterThan(0);
    closeAll();
    const s = createPlayers({ connect: false });
    for (const p of [s.client, s.server]) {
      p.qp.destroy();
      p.qp = p.ctx.createQp(p.pd, { sendCq: p.cq, recvCq: p.cq, faultModel: 'stall' });
    }
    connectQps(s.client.qp, s.server.qp);
    expect(s.server.qp.faultModel).toBe('stall');
    expect(await evictedWrite(s.client, s.server)).toBe(0);
  });
});
