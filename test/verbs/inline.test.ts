// IBV_SEND_INLINE: the WR's bytes are copied into the WQE at post (rxe's dma.inline_data), so
// the buffers may be reused as soon as postSend returns and their lkeys are not used; the
// device sends them from its own copy. More than max_inline_data is refused at post.
import { afterEach, describe, expect, test } from 'vitest';
import { SendFlags, WcStatus, WrOpcode } from '../../lib/index.js';
import { closeAll, createPlayers, next, thrown } from './helpers.js';

afterEach(closeAll);

describe('INLINE sends', () => {
  test('an INLINE RDMA_WRITE lands the bytes of the post, not those written into the buffer after it', async () => {
    const { client, server } = createPlayers();
    client.fill(0x5a, 0, 32);
    server.fill(0, 0, 64);
    const flags = SendFlags.SIGNALED | SendFlags.INLINE;
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: flags,
      sgList: [client.sge(0, 32)],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    // Reused at once, as INLINE allows.
    client.fill(0xee, 0, 32);
    const wc = await next(client.cq);
    expect(wc.status).toBe(WcStatus.SUCCESS);
    expect(wc.byteLen).toBe(32);
    expect([...server.bytes(0, 32)].every((b) => b === 0x5a)).toBe(true);
    expect([...server.bytes(32, 32)].every((b) => b === 0)).toBe(true);
  });

  test('an INLINE SEND gathers its SGEs at post and needs no valid lkey', async () => {
    const { client, server } = createPlayers();
    client.fill(0x11, 0, 16);
    client.fill(0x22, 100, 16);
    server.qp.postRecv({ wrId: 9, sgList: [server.sge(0, 64)] });
    const sgList = [
      { addr: client.at(0), length: 16, lkey: 0xdead },
      { addr: client.at(100), length: 16, lkey: 0xdead },
    ];
    client.qp.postSend({ wrId: 2, opcode: WrOpcode.SEND, sendFlags: SendFlags.SIGNALED | SendFlags.INLINE, sgList });
    client.fill(0, 0, 128);
    expect((await next(client.cq)).status).toBe(WcStatus.SUCCESS);
    const rwc = await next(server.cq);
    expect(rwc).toMatchObject({ wrId: 9n, status: WcStatus.SUCCESS, byteLen: 32 });
    expect([...server.bytes(0, 16)].every((b) => b === 0x11)).toBe(true);
    expect([...server.bytes(16, 16)].every((b) => b === 0x22)).toBe(true);
  });

  test('more than max_inline_data, or memory no region holds, is refused at post and nothing is queued', async () => {
    const { client, server } = createPlayers();
    const rdma = { remoteAddr: server.at(0), rkey: server.mr.rkey };
    const big = thrown(() =>
      client.qp.postSend({ wrId: 3, opcode: WrOpcode.RDMA_WRITE, sendFlags: SendFlags.INLINE, sgList: [client.sge(0, 4096)], rdma }),
    );
    expect(big).toMatchObject({ code: 'EINVAL' });
    expect(big.message).toMatch(/^ibv_post_send: wr\[0\]: an INLINE WR carries at most \d+ bytes \(max_inline_data\), got 4096$/);
    const nowhere = thrown(() =>
      client.qp.postSend({ wrId: 4, opcode: WrOpcode.RDMA_WRITE, sendFlags: SendFlags.INLINE, sgList: [{ addr: 0x10n, length: 8, lkey: 1 }], rdma }),
    );
    expect(nowhere).toMatchObject({ code: 'EFAULT', message: 'ibv_post_send: wr[0].sgList[0]: 0x10+8 is in no mapped region of this process' });
    // Nothing of either was queued: the next WR's completion is the first.
    client.qp.postSend({ wrId: 5, opcode: WrOpcode.RDMA_WRITE, sendFlags: SendFlags.SIGNALED, sgList: [client.sge(0, 8)], rdma });
    expect(await next(client.cq)).toMatchObject({ wrId: 5n, status: WcStatus.SUCCESS });
    expect(client.cq.poll(4)).toEqual([]);
  });
});
