// Completion channels (ibv_create_comp_channel, ibv_req_notify_cq, ibv_get_cq_event,
// ibv_ack_cq_events): ibv_rc_pingpong -e's loop (sleep on the channel, acknowledge, re-arm,
// poll) over rdma-core's ODP traffic pattern, and the channel's error paths.
import { afterEach, describe, expect, test } from 'vitest';
import { ackCqEvents, getCqEvent, reqNotifyCq, SendFlags, WcOpcode, WcStatus, WrOpcode, type WorkCompletion } from '../../lib/index.js';
import { allBytes, closeAll, createPlayers, MSG, P, sleep, thrown, WAIT_MS, type Player } from './helpers.js';

afterEach(closeAll);

/**
 * ibv_rc_pingpong -e: take what the CQ holds; when that is not enough, arm it and sleep on
 * the channel until its event, acknowledge it, and poll again. Returns the completions and
 * how many events it slept on.
 */
async function completions(p: Player, n: number): Promise<{ wcs: WorkCompletion[]; events: number }> {
  const wcs: WorkCompletion[] = [];
  let events = 0;
  for (;;) {
    wcs.push(...p.cq.poll(n - wcs.length));
    if (wcs.length >= n) return { wcs, events };
    reqNotifyCq(p.cq, false);
    const cq = await getCqEvent(p.channel!, { timeoutMs: WAIT_MS });
    expect(cq).toBe(p.cq);
    ackCqEvents(cq, 1);
    events++;
  }
}

describe('ibv_rc_pingpong -e over ODP memory', () => {
  test('100 × 1 KiB ping-pong, both buffers evicted every iteration: each wait sleeps on one event; data, statuses and faults hold', async () => {
    const { client, server } = createPlayers({ channel: true, policy: 'touch' });
    const RECV = 4 * P; // each side receives into its own page, evicted like the rest
    const post = (p: Player, id: number) => p.qp.postRecv({ wrId: id, sgList: [p.sge(RECV, MSG)] });
    post(client, 0);
    post(server, 0);
    let events = 0;
    for (let i = 0; i < 100; i++) {
      client.region.evict();
      server.region.evict();
      for (const [from, to, byte] of [
        [client, server, 0x63],
        [server, client, 0x73],
      ] as const) {
        from.fill(byte, 0, MSG);
        from.qp.postSend({ wrId: i, opcode: WrOpcode.SEND, sgList: [from.sge(0, MSG)], sendFlags: SendFlags.SIGNALED });
        // Both sides sleep at once, as two ibv_rc_pingpong -e processes would.
        const [sent, got] = await Promise.all([completions(from, 1), completions(to, 1)]);
        events += sent.events + got.events;
        const [s] = sent.wcs;
        const [r] = got.wcs;
        expect([s!.status, r!.status]).toEqual([WcStatus.SUCCESS, WcStatus.SUCCESS]);
        expect([s!.opcode, r!.opcode]).toEqual([WcOpcode.SEND, WcOpcode.RECV]);
        expect(r!.byteLen).toBe(MSG);
        // The receive page was evicted: one destination fault, reported on both completions.
        expect(s!.odp!.faults).toEqual({ source: 0, destination: 1 });
        expect(r!.odp!.faults.destination).toBe(1);
        allBytes(to.bytes(RECV, MSG), byte);
        post(to, i + 1);
      }
    }
    // Every completion found an empty CQ and was slept for: one event each, all acknowledged.
    expect(events).toBe(400);
    for (const p of [client, server]) {
      expect(p.channel!.pending).toBe(0);
      expect(p.cq.unackedEvents).toBe(0);
      expect(p.cq.armed).toBe(false);
      expect(p.ctx.faultLibrary.stats().faults.destination).toBe(100);
    }
  });
});

describe('events: once per arming, only for what comes after it', () => {
  test('completions queued before reqNotify raise no event; the next one raises exactly one; re-arming is needed for another', async () => {
    const { client, server } = createPlayers({ channel: true });
    const ch = client.channel!;
    const write = (id: number) =>
      client.qp.postSend({
        wrId: id,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [client.sge(0, MSG)],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
      });
    write(1);
    await sleep(50);
    expect(client.cq.length).toBe(1);
    expect(ch.pending).toBe(0); // not armed: no event
    client.cq.reqNotify();
    expect(ch.pending).toBe(0); // armed after it was queued: still none
    write(2);
    write(3);
    const cq = await ch.getCqEvent({ timeoutMs: WAIT_MS });
    expect(cq).toBe(client.cq);
    await sleep(50);
    expect(client.cq.length).toBe(3);
    expect(ch.pending).toBe(0); // one arming, one event, though two completions came
    expect(client.cq.unackedEvents).toBe(1);
    client.cq.ackEvents(1);
    expect(client.cq.poll(3).map((w) => w.wrId)).toEqual([1n, 2n, 3n]);
  });

  test('a completion handed to a waiting next() still raises the armed event', async () => {
    const { client, server } = createPlayers({ channel: true });
    client.cq.reqNotify();
    const waiting = client.cq.next({ timeoutMs: WAIT_MS });
    client.qp.postSend({
      wrId: 9,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, MSG)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect((await waiting).wrId).toBe(9n);
    expect(await client.channel!.getCqEvent({ timeoutMs: WAIT_MS })).toBe(client.cq);
    client.cq.ackEvents(1);
  });

  test('solicitedOnly: a successful send completion or an unsolicited receive raises none; a solicited receive or an error completion does', async () => {
    const { client, server } = createPlayers({ channel: true });
    client.cq.reqNotify(true);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, MSG)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    await expect(client.channel!.getCqEvent({ timeoutMs: 200 })).rejects.toMatchObject({ code: 'ETIMEDOUT' });
    expect(client.cq.poll(1)[0]!.status).toBe(WcStatus.SUCCESS);
    expect(client.cq.armed).toBe(true);
    // A receive of a SEND without the solicited flag (BTH SE clear): no event.
    client.qp.postRecv({ wrId: 20, sgList: [client.sge(0, MSG)] });
    server.qp.postSend({ wrId: 30, opcode: WrOpcode.SEND, sgList: [server.sge(0, MSG)] });
    await expect(client.channel!.getCqEvent({ timeoutMs: 200 })).rejects.toMatchObject({ code: 'ETIMEDOUT' });
    expect(client.cq.poll(1)[0]!).toMatchObject({ wrId: 20n, opcode: WcOpcode.RECV, status: WcStatus.SUCCESS });
    expect(client.cq.armed).toBe(true);
    // A receive of a SEND with SendFlags.SOLICITED (carried as BTH SE).
    client.qp.postRecv({ wrId: 2, sgList: [client.sge(0, MSG)] });
    server.qp.postSend({ wrId: 3, opcode: WrOpcode.SEND, sgList: [server.sge(0, MSG)], sendFlags: SendFlags.SOLICITED });
    expect(await client.channel!.getCqEvent({ timeoutMs: WAIT_MS })).toBe(client.cq);
    client.cq.ackEvents(1);
    expect(client.cq.poll(1)[0]!.opcode).toBe(WcOpcode.RECV);
    // An error completion: a write under a bad rkey.
    client.cq.reqNotify(true);
    client.qp.postSend({
      wrId: 4,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, MSG)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey ^ 0x5a5a },
    });
    expect(await client.channel!.getCqEvent({ timeoutMs: WAIT_MS })).toBe(client.cq);
    client.cq.ackEvents(1);
    expect(client.cq.poll(1)[0]!.status).toBe(WcStatus.REM_ACCESS_ERR);
  });
});

describe('waits end: timeout, abort, close', () => {
  test('no event within timeoutMs: ETIMEDOUT naming the arming; an aborted wait: ABORT_ERR', async () => {
    const { client } = createPlayers({ channel: true });
    const t0 = performance.now();
    const e = await client.channel!.getCqEvent({ timeoutMs: 100 }).catch((x: Error & { code?: string }) => x);
    expect(e).toMatchObject({ code: 'ETIMEDOUT' });
    expect((e as Error).message).toMatch(/reqNotify/);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(90);
    const ac = new AbortController();
    const w = client.channel!.getCqEvent({ timeoutMs: WAIT_MS, signal: ac.signal });
    ac.abort();
    await expect(w).rejects.toMatchObject({ code: 'ABORT_ERR' });
  });

  test('closing the channel rejects a pending wait; EBUSY while a CQ uses it; the context closes everything', async () => {
    const { client } = createPlayers({ channel: true });
    const ch = client.channel!;
    const e = thrown(() => ch.close());
    expect(e.code).toBe('EBUSY');
    expect(e.message).toMatch(/destroy them/);
    const lone = client.ctx.createCompChannel();
    const w = lone.getCqEvent({ timeoutMs: WAIT_MS });
    lone.close();
    await expect(w).rejects.toMatchObject({ code: 'ERR_PFR_CLOSED' });
    expect(lone.closed).toBe(true);
    const w2 = ch.getCqEvent({ timeoutMs: WAIT_MS });
    client.ctx.close();
    await expect(w2).rejects.toMatchObject({ code: 'ERR_PFR_CLOSED' });
    expect(ch.closed).toBe(true);
  });
});

describe('bad use: libibverbs errnos with the fix', () => {
  test('reqNotify without a channel, over-acknowledging, destroying a CQ with unacknowledged events, a foreign channel', async () => {
    const { client, server } = createPlayers({ channel: true });
    const plain = client.ctx.createCq(4);
    expect(thrown(() => plain.reqNotify()).message).toMatch(/createCq\(depth, \{ channel \}\)/);
    expect(thrown(() => client.cq.reqNotify('yes' as unknown as boolean)).code).toBe('EINVAL');
    expect(thrown(() => client.cq.ackEvents(1)).code).toBe('EINVAL');
    expect(thrown(() => client.ctx.createCq(4, { channel: server.channel! })).code).toBe('EINVAL');
    // One event taken, not acknowledged: destroying the CQ is EBUSY (libibverbs would block).
    client.cq.reqNotify();
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, 8)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    await client.channel!.getCqEvent({ timeoutMs: WAIT_MS });
    const busy = thrown(() => client.cq.close());
    expect(busy.code).toBe('EBUSY');
    expect(busy.message).toMatch(/ackEvents\(1\)/);
    client.cq.ackEvents(1);
    client.qp.destroy();
    client.cq.close();
    expect(client.cq.closed).toBe(true);
    client.channel!.close();
    expect(client.channel!.closed).toBe(true);
  });
});
