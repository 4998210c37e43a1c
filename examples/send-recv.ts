// A SEND into a receive the peer posted: the bytes land in its buffer and both sides get a work
// completion. Run it after a build with `node dist/examples/send-recv.js`. In your own project,
// import from 'pagefault-rdma'.
import { Access, Cluster, SendFlags, WrOpcode, connectQps, mapRegion } from '../lib/index.js';

const cluster = Cluster.create({ nodes: 2 });
try {
  const [a, b] = [cluster.openDevice(0), cluster.openDevice(1)];
  const [pdA, pdB] = [a.allocPd(), b.allocPd()];
  const [cqA, cqB] = [a.createCq(16), b.createCq(16)];
  const qpA = a.createQp(pdA, { sendCq: cqA, recvCq: cqA });
  const qpB = b.createQp(pdB, { sendCq: cqB, recvCq: cqB });
  connectQps(qpA, qpB);

  const src = mapRegion(4096);
  const dst = mapRegion(4096);
  const text = 'hello over RC';
  new TextEncoder().encodeInto(text, new Uint8Array(src.buffer));
  const mrA = a.regMr(pdA, src, 0, src.size, Access.LOCAL_WRITE | Access.ON_DEMAND);
  const mrB = b.regMr(pdB, dst, 0, dst.size, Access.LOCAL_WRITE | Access.ON_DEMAND);

  qpB.postRecv({ wrId: 7n, sgList: [{ addr: mrB.addr, length: dst.size, lkey: mrB.lkey }] });
  qpA.postSend({
    wrId: 1n,
    opcode: WrOpcode.SEND,
    sendFlags: SendFlags.SIGNALED,
    sgList: [{ addr: mrA.addr, length: text.length, lkey: mrA.lkey }],
  });
  const [sent, received] = await Promise.all([cqA.next(), cqB.next()]);
  const got = new TextDecoder().decode(new Uint8Array(dst.buffer, 0, received.byteLen));
  console.log(`send ${sent.statusStr}; receive ${received.statusStr}, ${received.byteLen} bytes: ${got}`);
} finally {
  cluster.close();
}
