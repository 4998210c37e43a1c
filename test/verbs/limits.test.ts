// Limits and edges of the verbs layer that a mutation run found unasserted: the send queue's
// ENOMEM, a SEND spread over two receive SGEs moves no byte past its length,
// modify_qp names a bad state, an implicit MR's range that leaves its region, and a policy
// change that must not unpin another MR's pages.
import { afterEach, describe, expect, test } from 'vitest';
import { QpType, SendFlags, WrOpcode } from '../../lib/index.js';
import { closeAll, createPlayers, MSG, ODP_ACCESS, P, PINNED_ACCESS, pollOk, region, thrown } from './helpers.js';

afterEach(closeAll);

describe('queue pairs', () => {
  test('maxSendWr: a post past it is ENOMEM with the limit in the message, and room comes back as WRs complete', async () => {
    const { client, server } = createPlayers({ cap: { maxSendWr: 2 } });
    const write = (wrId: number) => ({
      wrId,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, MSG)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    client.qp.postSend([write(1), write(2)]);
    const e = thrown(() => client.qp.postSend(write(3)));
    expect([e.code, e.message]).toEqual(['ENOMEM', 'ibv_post_send: the send queue holds at most 2 WRs']);
    expect((await pollOk(client.cq)).wrId).toBe(1n);
    expect((await pollOk(client.cq)).wrId).toBe(2n);
    client.qp.postSend(write(3));
    expect((await pollOk(client.cq)).wrId).toBe(3n);
  });

  test('a SEND of 1000 bytes into two receive SGEs of 600: 600 + 400 land, the 200 bytes after them are untouched', async () => {
    const { client, server } = createPlayers();
    server.fill(0x11, 0, 2 * P);
    client.fill(0x77, 0, 1000);
    server.qp.postRecv({ wrId: 9, sgList: [server.sge(0, 600), server.sge(P, 600)] });
    client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [client.sge(0, 1000)], sendFlags: SendFlags.SIGNALED });
    await pollOk(client.cq);
    const wc = await pollOk(server.cq);
    expect(wc.byteLen).toBe(1000);
    expect(server.bytes(0, 600).every((b) => b === 0x77)).toBe(true);
    expect(server.bytes(600, 10).every((b) => b === 0x11)).toBe(true);
    expect(server.bytes(P, 400).every((b) => b === 0x77)).toBe(true);
    expect(server.bytes(P + 400, 200).every((b) => b === 0x11)).toBe(true);
  });

  test('modify_qp names an unknown state; createQp takes QpType.RC as well as the string', () => {
    const { client } = createPlayers({ connect: false });
    for (const [state, shown] of [
      [99, '99'],
      ['RTS', 'RTS'],
    ] as const) {
      const e = thrown(() => client.qp.modify({ qpState: state as never }));
      expect([e.code, e.syscall, e.message]).toEqual(['EINVAL', 'ibv_modify_qp', `ibv_modify_qp: unknown state ${shown}`]);
    }
    const e = thrown(() => client.qp.postRecv({ wrId: 1, sgList: [] }));
    expect([e.code, e.syscall, e.message]).toEqual(['EINVAL', 'ibv_post_recv', 'ibv_post_recv: the QP is in RESET; move it to INIT first']);
    const qp = client.ctx.createQp(client.pd, { qpType: QpType.RC, sendCq: client.cq, recvCq: client.cq });
    expect(qp.qpType).toBe(QpType.RC);
  });
});

describe('memory regions', () => {
  test("an implicit MR does not cover a range that runs past its region's end", () => {
    const { client } = createPlayers({ implicit: true });
    const end = client.region.address + BigInt(client.region.size);
    expect(client.mr.resolve(end - 10n, 10)).toEqual({ region: client.region, offset: client.region.size - 10 });
    expect(client.mr.resolve(end - 10n, 20)).toBeUndefined();
  });

  test("an ODP MR's policy change that does not involve 'pin' leaves another MR's pinned pages pinned", () => {
    const { client } = createPlayers();
    const r = region(4 * P);
    const pinned = client.ctx.regMr(client.pd, r, 0, r.size, PINNED_ACCESS);
    const odp = client.ctx.regMr(client.pd, r, 0, r.size, ODP_ACCESS, { policy: 'touch' });
    odp.setPolicy('touch-ahead');
    expect(odp.pinned).toBe(false);
    expect(thrown(() => r.evict()).code).toBe('EINVAL'); // still mlocked by the pinned MR
    pinned.dereg();
  });
});

test("the 'prefault' baseline makes exactly the pages of an unaligned transfer resident at both ends: no fault, no page more", async () => {
  const { client, server } = createPlayers({ policy: 'prefault' });
  client.region.evict();
  server.region.evict();
  client.qp.postSend({
    wrId: 1,
    opcode: WrOpcode.RDMA_WRITE,
    sgList: [client.sge(P + 100, 2 * P)],
    sendFlags: SendFlags.SIGNALED,
    rdma: { remoteAddr: server.at(P + 100), rkey: server.mr.rkey },
  });
  const wc = await pollOk(client.cq);
  expect(wc.odp!.faults).toEqual({ source: 0, destination: 0 });
  // Pages 1..3 hold the bytes [P+100, 3P+100); nothing before or after them was touched.
  for (const p of [client, server])
    expect([p.region.residentPages(0, P), p.region.residentPages(P, 3 * P), p.region.residentPages(4 * P, 12 * P)]).toEqual([0, 3, 0]);
});
