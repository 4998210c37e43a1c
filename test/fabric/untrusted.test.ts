// The responder trusts nothing it did not check. In one process: a write forged by the
// connected node under a LOCAL_WRITE-only key is refused, while READ and SEND still land in
// LOCAL_WRITE-only buffers (the QP expects them). Over libfabric: an attacker on a raw TCP
// socket (libfabric tcp's 32-byte CM request, then the provider's 16-byte message headers
// around our frames) tries what the wire allows; each try is refused and counted by the
// transport or answered with an access error by the responder, no byte lands, and the real
// client is served afterwards.
import { afterEach, describe, expect, it } from 'vitest';
import { AckResp, DmaStatus, LibfabricTransport, type AckPacket, type WritePacket } from '../../kernel-sim/index.js';
import { encodeExchange } from '../../kernel-sim/fabric/exchange-codec.js';
import { encodeBatch, encodeChunk, encodeHello, encodePing } from '../../kernel-sim/fabric/framing.js';
import { encodePacket } from '../../kernel-sim/fabric/packet-layout.js';
import { Op } from '../../kernel-sim/fabric/wire-codec.js';
import type { MemoryLike } from '../../kernel-sim/memory.js';
import { binding } from '../../native/index.js';
import { Access, Cluster, mapRegion, QpState, SendFlags, WcStatus, WrOpcode, type QueuePair, type Region } from '../../lib/index.js';
import { allBytes, closeAll, createPlayers, MSG, next, P, region, track } from '../verbs/helpers.js';
import { Raw, until } from './raw.js';

afterEach(() => closeAll());

describe('a LOCAL_WRITE-only key is no licence to write (in one process)', () => {
  it('a write forged by the connected node under it is refused; READ and SEND still land in such buffers', async () => {
    const { cluster, client, server } = createPlayers({ mixed: true });
    const local = server.pinned!;
    new Uint8Array(local.region.buffer).fill(0x33);
    const src = region(P);
    new Uint8Array(src.buffer).fill(0x66);
    const node0 = cluster.system.node(0);
    node0.map(node0.allocStream({ pid: 9000, pd: 900 }), src);
    // A forged write from node 0's engine under the server's LOCAL_WRITE-only key, named for its QP.
    const forge = () =>
      node0.post({
        channel: 0,
        srcVa: src.address,
        dstNode: 1,
        dstVa: local.region.address,
        length: 64,
        pd: 900,
        dstPd: server.pd.handle,
        retryLimit: 0,
        key: local.mr.lkey,
        dstQp: server.qp.qpNum,
      });
    const c = await forge();
    expect([c.status, c.bytes]).toEqual([DmaStatus.DST_PERM_ERR, 0]);
    expect(allBytes(Buffer.from(local.region.buffer, 0, P), 0x33)).toBe(true);
    // What the QP asked for still lands there: a READ's sink, a receive's buffer.
    const sink = client.pinned!;
    server.fill(0x44, 0, MSG);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_READ,
      sgList: [{ addr: sink.region.address, length: MSG, lkey: sink.mr.lkey }],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect((await next(client.cq)).status).toBe(WcStatus.SUCCESS);
    expect(allBytes(Buffer.from(sink.region.buffer, 0, MSG), 0x44)).toBe(true);
    server.qp.postRecv({ wrId: 2, sgList: [{ addr: local.region.address, length: MSG, lkey: local.mr.lkey }] });
    client.fill(0x55, 0, MSG);
    client.qp.postSend({ wrId: 3, opcode: WrOpcode.SEND, sgList: [client.sge(0, MSG)], sendFlags: SendFlags.SIGNALED });
    expect((await next(client.cq)).status).toBe(WcStatus.SUCCESS);
    expect((await next(server.cq)).status).toBe(WcStatus.SUCCESS);
    expect(allBytes(Buffer.from(local.region.buffer, 0, MSG), 0x55)).toBe(true);
    // Once the receive is complete, its buffer is closed to the peer again.
    const again = await forge();
    expect(again.status).toBe(DmaStatus.DST_PERM_ERR);
    expect(allBytes(Buffer.from(local.region.buffer, 0, MSG), 0x55)).toBe(true);
  });
});

/** Connect `qp` to QP `destQpNum` on node `destNode` (INIT → RTR → RTS), taking remote writes. */
function rc(qp: QueuePair, destQpNum: number, destNode: number): void {
  qp.modify({ qpState: QpState.INIT, portNum: 1, qpAccessFlags: Access.LOCAL_WRITE | Access.REMOTE_WRITE });
  qp.modify({ qpState: QpState.RTR, destQpNum, destNode });
  qp.modify({ qpState: QpState.RTS });
}

const built = binding.fabricListen !== undefined;
const ci = !!process.env.CI && !/^(0|false)$/i.test(process.env.CI);

describe.skipIf(!built && !ci)('an attacker on the server port (libfabric tcp, raw socket)', () => {
  it('every forgery is refused and counted, no byte lands, and the real client is served after', async () => {
    const server = track(LibfabricTransport.listen({ port: 0, localNodes: [1], peerTimeoutMs: 4000, limits: { helloTimeoutMs: 4000 } }));
    const lost: number[] = [];
    server.onPeerLost((n) => lost.push(n));
    const cluster = track(Cluster.create({ nodes: 2, transport: server }));
    const ctx = cluster.openDevice(1);
    const pd = ctx.allocPd();
    const cq = ctx.createCq(16);
    const qp = ctx.createQp(pd, { sendCq: cq, recvCq: cq });
    // Pages 0-3 take RDMA WRITEs, 4-7 are LOCAL_WRITE only, 8-15 are registered by no MR.
    const buf: Region = track(mapRegion(16 * P));
    new Uint8Array(buf.buffer).fill(0x33);
    const remote = ctx.regMr(pd, buf, 0, 4 * P, Access.LOCAL_WRITE | Access.REMOTE_WRITE);
    const localOnly = ctx.regMr(pd, buf, 4 * P, 4 * P, Access.LOCAL_WRITE);
    const refused = (reason?: string) => {
      const s = server.stats();
      return reason === undefined ? s.refused : (Object.entries(s.refusedBy).find(([k]) => k.startsWith(reason))?.[1] ?? 0);
    };
    const untouched = () => allBytes(Buffer.from(buf.buffer, 4 * P, 12 * P), 0x33);

    // Closed before its hello: refused, and the server listens on.
    (await Raw.open(server.port)).close();
    await until('the early close', () => refused('a connection closed before its hello') === 1);
    // A frame that is not a valid packet, before any hello: refused, the connection cut.
    const garbage = await Raw.open(server.port);
    garbage.send(Uint8Array.of(0xff, 1, 2, 3));
    await garbage.closed;
    expect(refused('a malformed frame (unknown opcode 0xff)')).toBe(1);
    // Nor is a slice of a large frame joined for a connection that has not said who it is.
    const slicer = await Raw.open(server.port);
    slicer.send(encodeChunk(1 << 20, 0, new Uint8Array(1000)));
    await slicer.closed;
    expect(refused('a frame before the hello')).toBe(1);
    // A hello claiming the server's own node: refused, cut.
    const claim = await Raw.open(server.port);
    claim.send(encodeHello([1]));
    await claim.closed;
    expect(refused('a hello naming a node that is hosted here')).toBe(1);
    // A peer that says hello as node 0, then forges.
    const evil = await Raw.open(server.port);
    evil.send(encodeHello([0]));
    await until("the attacker's hello", () => server.hasNode(0));
    rc(qp, 0x77, 0);
    const forged = (o: Partial<WritePacket>) => {
      const p: WritePacket = {
        type: 'write',
        src: 0,
        dst: 1,
        pd: pd.handle,
        va: buf.address + BigInt(8 * P),
        tid: 1,
        seq: 0,
        length: 64,
        arrivesAt: 0,
        channel: 0,
        count: 1,
        blockSize: 4096,
        payload: { region: undefined as unknown as MemoryLike, offset: 0 },
        lengthHint: 64,
        issuedUs: new Float64Array(1),
        arrivals: new Float64Array(1),
        issuedMs: 0,
        sourceStall: false,
        ...o,
      };
      return encodePacket(p, new Uint8Array(64).fill(0xee));
    };
    // The server's own node as the source, no key and no QP, into a page no MR registers.
    evil.send(forged({ src: 1 }));
    // A va cut short (what a va of the wrong type amounts to in bytes), a claimed 1e9 blocks.
    const plain = forged({});
    evil.send(plain.subarray(0, 14));
    const huge = plain.slice();
    new DataView(huge.buffer).setUint16(40, 0xffff);
    evil.send(huge);
    await until('three refusals', () => refused('a packet') + refused('a malformed frame (the') + refused('a malformed frame (count') === 3);
    expect(refused('a packet from a node its connection is not bound to')).toBe(1);
    expect(refused('a malformed frame (the frame ends inside va')).toBe(1);
    expect(refused('a malformed frame (count must be an integer in 1..1024, got 65535)')).toBe(1);
    // Its own node, checked by the responder: no key and no QP, then the LOCAL_WRITE-only key.
    evil.send(forged({ tid: 2 }));
    evil.send(forged({ tid: 3, va: buf.address + BigInt(4 * P), key: localOnly.lkey, qpn: qp.qpNum }));
    const answers = () => evil.frames.filter((f): f is { op: Op.ACK; packet: AckPacket } => f.op === Op.ACK);
    await until('two answers', () => answers().length === 2);
    for (const a of answers()) expect(a.packet.verdicts?.map((v) => v.resp)).toEqual([AckResp.ACCESS_ERR]);
    // The responder's refusals are counted beside the transport's, by syndrome.
    expect([server.stats().rdmaRefused, server.stats().rdmaRefusedBy]).toEqual([2, { ACCESS_ERR: 2 }]);
    expect(untouched()).toBe(true);
    evil.close();
    await until('the attacker gone', () => lost.includes(0));

    // A connection that never says hello, open while the real client comes; then the real
    // client: its hello, the exchange (which the silent connection never sees), a write that lands.
    const silent = await Raw.open(server.port);
    const clientT = track(await LibfabricTransport.connect({ host: '127.0.0.1', port: server.port, localNodes: [0] }));
    const clientCluster = track(Cluster.create({ nodes: 2, transport: clientT }));
    const cctx = clientCluster.openDevice(0);
    const cpd = cctx.allocPd();
    const ccq = cctx.createCq(16);
    const cqp = cctx.createQp(cpd, { sendCq: ccq, recvCq: ccq });
    qp.modify({ qpState: QpState.RESET });
    rc(qp, cqp.qpNum, 0);
    rc(cqp, qp.qpNum, 1);
    server.post({ addr: remote.addr, rkey: remote.rkey });
    const got = await clientT.receive<{ addr: bigint; rkey: number }>(5000);
    expect([got.addr, got.rkey]).toEqual([remote.addr, remote.rkey]);
    expect(silent.open).toBe(true);
    const src = track(mapRegion(P));
    new Uint8Array(src.buffer).fill(0x5a);
    const smr = cctx.regMr(cpd, src, 0, P, Access.LOCAL_WRITE);
    cqp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [{ addr: src.address, length: 64, lkey: smr.lkey }],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: got.addr, rkey: got.rkey },
    });
    expect((await next(ccq)).status).toBe(WcStatus.SUCCESS);
    expect(allBytes(Buffer.from(buf.buffer, 0, 64), 0x5a)).toBe(true);
    expect(untouched()).toBe(true);
    expect(silent.frames.map((f) => f.op)).toEqual([Op.HELLO]);
    // The silent one is cut after the hello timeout, counted too.
    await silent.closed;
    expect(refused('no hello within the hello timeout')).toBe(1);
    expect(refused()).toBe(8);
  }, 60_000);
});

describe.skipIf(!built && !ci)('a batch from an attacker (libfabric tcp, raw socket)', () => {
  it('each frame of a batch is checked on its own: a bad one is refused and counted, the others served; a broken batch is refused whole', async () => {
    const server = track(LibfabricTransport.listen({ port: 0, localNodes: [1], peerTimeoutMs: 4000 }));
    const refused = (reason: string) => Object.entries(server.stats().refusedBy).find(([k]) => k.startsWith(reason))?.[1] ?? 0;
    const batch = (...frames: Uint8Array[]) => Buffer.concat(encodeBatch(frames.map((f) => [f])));
    const raw = await Raw.open(server.port);
    // Its hello, a frame of an unknown opcode, an exchange: the hello and the exchange are taken.
    raw.send(batch(encodeHello([0]), Uint8Array.of(0xff, 0), encodeExchange('after the bad one')));
    expect(await server.receive<string>(5000)).toBe('after the bad one');
    expect(refused('a malformed frame (unknown opcode 0xff)')).toBe(1);
    // The server took the hello: it says so (a PING), and now sends to it.
    await until('the ping that takes the hello', () => raw.frames.some((f) => f.op === Op.PING));
    // A batch whose second frame runs past its end: nothing of it is taken.
    raw.send(Uint8Array.of(Op.BATCH, 0, 0, 2, 0, 0, 0, 2, Op.PING, 0, 0, 0, 0, 9, Op.PING, 0));
    // A batch inside a batch, beside a good exchange.
    raw.send(batch(batch(encodePing(), encodePing()), encodeExchange('beside the nested one')));
    expect(await server.receive<string>(5000)).toBe('beside the nested one');
    expect(refused('a malformed frame (the frame ends inside batch[1] ')).toBe(1);
    expect(refused('a batch inside a batch')).toBe(1);
    expect(server.stats().refused).toBe(3);
    // The connection was proven by its hello: it is still served.
    raw.send(encodeExchange('still here'));
    expect(await server.receive<string>(5000)).toBe('still here');
    expect(server.hasNode(0) && raw.open).toBe(true);
    raw.close();
  }, 30_000);
});
