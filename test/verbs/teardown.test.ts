// Teardown under load (issue 22): once qp.destroy() returns, nothing the QP started lands,
// on either side of the connection. Each test takes the destination's residency and bytes
// right after destroy() returns and again 500 ms later: both must be unchanged.
import { afterEach, describe, expect, test } from 'vitest';
import { type Packet, RcOp } from '../../kernel-sim/index.js';
import { SendFlags, WcStatus, WrOpcode } from '../../lib/index.js';
import { closeAll, createPlayers, next, P, sleep, type Player, type Players } from './helpers.js';

afterEach(closeAll);

/**
 * What a destination region looks like now: which pages are resident, and the bytes of those
 * (reading a missing page from this thread would map it, so those are only checked missing).
 */
function look(p: Player, bytes: number): { resident: Uint8Array; bytes: Buffer } {
  const resident = p.region.residency(0, bytes);
  const pages: Buffer[] = [];
  for (let i = 0; i < resident.length; i++) if (resident[i]) pages.push(Buffer.from(p.bytes(i * P, P)));
  return { resident, bytes: Buffer.concat(pages) };
}

function expectUnchanged(p: Player, bytes: number, before: { resident: Uint8Array; bytes: Buffer }): void {
  const now = look(p, bytes);
  expect(Buffer.from(now.resident).equals(Buffer.from(before.resident))).toBe(true);
  expect(now.bytes.equals(before.bytes)).toBe(true);
}

const resident = (v: Uint8Array): number => v.reduce((n, x) => n + (x ? 1 : 0), 0);

/** Turns of the event loop until `ready` holds (bounded). */
async function until(ready: () => boolean, turns = 200_000): Promise<void> {
  for (let i = 0; !ready() && i < turns; i++) await new Promise((r) => setImmediate(r));
  expect(ready()).toBe(true);
}

const LONG = 64 * 1024 * 1024;

/**
 * Runs `act` as the transport hands over the `n`th READ response packet, before the requester
 * takes it: a responder sends a READ's response runs back to back (nothing ACKs them), so the
 * requester's copies of the ones before are queued or running, and the later ones not yet sent.
 */
function onResponse(players: Players, n: number, act: () => void): void {
  const fabric = players.cluster.system.fabric;
  const deliver = fabric.deliver.bind(fabric);
  let seen = 0;
  fabric.deliver = (p: Packet) => {
    deliver(p);
    if (p.type === 'write' && p.opcode === RcOp.READ_RESPONSE && ++seen === n) act();
  };
}

function write(from: Player, to: Player, length: number): void {
  from.qp.postSend({
    wrId: 1,
    opcode: WrOpcode.RDMA_WRITE,
    sgList: [from.sge(0, length)],
    sendFlags: SendFlags.SIGNALED,
    rdma: { remoteAddr: to.at(0), rkey: to.mr.rkey },
  });
}

function read(from: Player, to: Player, length: number): void {
  from.qp.postSend({
    wrId: 1,
    opcode: WrOpcode.RDMA_READ,
    sgList: [from.sge(0, length)],
    sendFlags: SendFlags.SIGNALED,
    rdma: { remoteAddr: to.at(0), rkey: to.mr.rkey },
  });
}

/**
 * A long write into an evicted ODP destination whose QP on `side` is destroyed right after the
 * server's fault library answered its 32nd fault, before the source hears of it (it would send
 * the block again): the destination's residency and bytes must not change from then on.
 */
async function writeDestroyedBetweenFaults(side: 'client' | 'server'): Promise<{ status: WcStatus; before: ReturnType<typeof look> }> {
  const { client, server } = createPlayers({ size: LONG, policy: 'touch' });
  client.fill(0x5a, 0, LONG);
  server.region.evict();
  let resolved = 0;
  let before: ReturnType<typeof look> | undefined;
  const stop = server.ctx.faultLibrary.onResolve(() => {
    if (++resolved !== 32) return;
    (side === 'client' ? client : server).qp.destroy();
    before = look(server, LONG);
  });
  write(client, server, LONG);
  const wc = await next(client.cq);
  expect(before).toBeDefined();
  expectUnchanged(server, LONG, before!);
  await sleep(500);
  stop();
  expectUnchanged(server, LONG, before!);
  expect(resolved).toBe(32);
  return { status: wc.status, before: before! };
}

describe('qp.destroy() of the requester: nothing it started lands after it returns', () => {
  test('a long write into an evicted ODP destination, destroyed between two of its faults', async () => {
    const { status, before } = await writeDestroyedBetweenFaults('client');
    expect(status).toBe(WcStatus.WR_FLUSH_ERR);
    expect(resident(before.resident)).toBeGreaterThan(0);
  });

  test('a long resident write, destroyed while its blocks are being copied', async () => {
    const { client, server } = createPlayers({ size: LONG });
    client.fill(0x5a, 0, LONG);
    server.fill(0x11, 0, LONG);
    write(client, server, LONG);
    await until(() => server.bytes(0, 1)[0] === 0x5a);
    client.qp.destroy();
    const before = look(server, LONG);
    expect(client.cq.poll(1)[0]?.status).toBe(WcStatus.WR_FLUSH_ERR);
    expect(before.bytes.includes(0x11)).toBe(true);
    await sleep(500);
    expectUnchanged(server, LONG, before);
  });

  test('a long READ, destroyed while the answer is being copied into its own memory', async () => {
    const players = createPlayers({ size: LONG });
    const { client, server } = players;
    server.fill(0x5a, 0, LONG);
    client.fill(0x11, 0, LONG);
    let before: ReturnType<typeof look> | undefined;
    onResponse(players, 2, () => {
      client.qp.destroy();
      before = look(client, LONG);
    });
    read(client, server, LONG);
    expect((await next(client.cq)).status).toBe(WcStatus.WR_FLUSH_ERR);
    expect(before!.bytes.includes(0x11)).toBe(true);
    expectUnchanged(client, LONG, before!);
    await sleep(500);
    expectUnchanged(client, LONG, before!);
  });
});

describe('qp.destroy() of the responder: nothing its QP took part in lands after it returns', () => {
  test('a long write into an evicted ODP destination, destroyed between two of its faults', async () => {
    const { status } = await writeDestroyedBetweenFaults('server');
    expect(status).not.toBe(WcStatus.SUCCESS);
  });

  // RC executes an atomic where it arrives; its response not landing does not undo it (the
  // requester asks again, and the replay would answer: here the QP is gone, so nothing does).
  test('an atomic it serves, destroyed while its response waits on a fault at the requester: nothing lands, the target changed once', async () => {
    const { client, server } = createPlayers({ policy: 'touch' });
    const target = new DataView(server.region.buffer);
    target.setBigUint64(0, 41n, true);
    client.region.evict();
    let before: ReturnType<typeof look> | undefined;
    // The old value's response faults on the client's evicted sink; once the client's library
    // has answered it, the server's QP goes (before the client asks again).
    const stop = client.ctx.faultLibrary.onResolve(() => {
      if (before) return;
      server.qp.destroy();
      before = look(client, P);
    });
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.ATOMIC_FETCH_AND_ADD,
      sendFlags: SendFlags.SIGNALED,
      sgList: [client.sge(0, 8)],
      atomic: { remoteAddr: server.at(0), rkey: server.mr.rkey, compareAdd: 1n },
    });
    const wc = await next(client.cq);
    stop();
    expect(before).toBeDefined();
    expect(wc.status).not.toBe(WcStatus.SUCCESS);
    expectUnchanged(client, P, before!);
    await sleep(500);
    expectUnchanged(client, P, before!);
    expect(target.getBigUint64(0, true)).toBe(42n);
  });

  test('a long READ it serves, destroyed while the answer is being copied into the requester', async () => {
    const players = createPlayers({ size: LONG });
    const { client, server } = players;
    server.fill(0x5a, 0, LONG);
    client.fill(0x11, 0, LONG);
    let before: ReturnType<typeof look> | undefined;
    onResponse(players, 2, () => {
      server.qp.destroy();
      before = look(client, LONG);
    });
    read(client, server, LONG);
    const wc = await next(client.cq);
    expect(wc.status).not.toBe(WcStatus.SUCCESS);
    expect(before!.bytes.includes(0x11)).toBe(true);
    expectUnchanged(client, LONG, before!);
    await sleep(500);
    expectUnchanged(client, LONG, before!);
  });
});
