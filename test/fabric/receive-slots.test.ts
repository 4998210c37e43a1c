// An incoming write's payload is read by the destination's copy engine straight from the
// native receive slot it arrived in (the slot held until the write's answer goes out), not
// copied to a staging mapping first. Two transports in one process over libfabric tcp on
// loopback, a node each: writes of 64 B and 1 MiB (and a window of them, more than the
// posted slots) land byte for byte, each counted in place; the slots come back (later writes
// are in place too).
import { afterEach, describe, expect, it } from 'vitest';
import { LibfabricTransport } from '../../kernel-sim/index.js';
import { Access, Cluster, connectQps, mapRegion, SendFlags, WcStatus, WrOpcode } from '../../lib/index.js';
import { closeAll, next, track } from '../verbs/helpers.js';
import { built, ci } from './spawn.js';

afterEach(() => closeAll());

const MIB = 1 << 20;

describe.skipIf(!built && !ci)('receive slots', () => {
  it('writes are placed from their receive slot, none through a staging copy', async () => {
    const server = track(LibfabricTransport.listen({ port: 0, localNodes: [1] }));
    const client = track(await LibfabricTransport.connect({ host: '127.0.0.1', port: server.port, localNodes: [0] }));
    await server.waitForPeer(5000);
    const sides = [0, 1].map((node) => {
      const cluster = track(Cluster.create({ nodes: 2, transport: node === 0 ? client : server }));
      const ctx = cluster.openDevice(node);
      const pd = ctx.allocPd();
      const cq = ctx.createCq(64);
      const qp = ctx.createQp(pd, { sendCq: cq, recvCq: cq, cap: { maxSendWr: 64 } });
      const buf = track(mapRegion(8 * MIB));
      const mr = ctx.regMr(pd, buf, 0, buf.size, Access.LOCAL_WRITE | Access.REMOTE_WRITE);
      return { ctx, cq, qp, buf, mr };
    });
    const [c, s] = sides as [(typeof sides)[0], (typeof sides)[0]];
    connectQps(c.qp, s.qp);
    const write = (wrId: number, offset: number, length: number) =>
      c.qp.postSend({
        wrId,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [{ addr: c.buf.address + BigInt(offset), length, lkey: c.mr.lkey }],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: s.buf.address + BigInt(offset), rkey: s.mr.rkey },
      });
    const src = new Uint8Array(c.buf.buffer);
    for (let i = 0; i < src.length; i++) src[i] = (i * 7 + (i >> 12)) & 0xff;
    // One small write, one large, then a window of 12 (more than the 8 posted slots).
    const batches = [[[0, 64]], [[MIB, MIB]], Array.from({ length: 12 }, (_, k) => [(k % 8) * MIB + 4096 * k, 256 * 1024])];
    let id = 0;
    for (const batch of batches) {
      for (const [offset, length] of batch) write(id++, offset!, length!);
      for (const _ of batch) expect((await next(c.cq, 20_000)).status).toBe(WcStatus.SUCCESS);
      const dst = new Uint8Array(s.buf.buffer);
      for (const [offset, length] of batch)
        expect(Buffer.compare(dst.subarray(offset!, offset! + length!), src.subarray(offset!, offset! + length!))).toBe(0);
    }
    const st = server.stats();
    expect(st.writesStaged).toBe(0);
    expect(st.writesInPlace).toBeGreaterThanOrEqual(14);
    expect(st.refused).toBe(0);
  }, 60_000);
});
