// An RDMA WRITE into evicted, unpinned memory: the destination faults, its fault library makes
// the pages resident, the block is retransmitted, and the write completes. Run it after a build
// with `node dist/examples/rdma-write.js`. In your own project, import from 'pagefault-rdma'.
import { Access, Cluster, SendFlags, WrOpcode, connectQps, mapRegion } from '../lib/index.js';

const cluster = Cluster.create({ nodes: 2 });
try {
  const [a, b] = [cluster.openDevice(0), cluster.openDevice(1)];
  const [pdA, pdB] = [a.allocPd(), b.allocPd()];
  const [cqA, cqB] = [a.createCq(16), b.createCq(16)];
  const qpA = a.createQp(pdA, { sendCq: cqA, recvCq: cqA });
  const qpB = b.createQp(pdB, { sendCq: cqB, recvCq: cqB });
  connectQps(qpA, qpB);

  const src = mapRegion(16 * 4096);
  const dst = mapRegion(16 * 4096);
  new Uint8Array(src.buffer).fill(42);
  const odp = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.ON_DEMAND;
  const mrA = a.regMr(pdA, src, 0, src.size, odp);
  const mrB = b.regMr(pdB, dst, 0, dst.size, odp, { policy: 'touch-ahead' });
  dst.evict();

  qpA.postSend({
    wrId: 1n,
    opcode: WrOpcode.RDMA_WRITE,
    sendFlags: SendFlags.SIGNALED,
    sgList: [{ addr: mrA.addr, length: src.size, lkey: mrA.lkey }],
    rdma: { remoteAddr: mrB.addr, rkey: mrB.rkey },
  });
  const wc = await cqA.next();
  console.log(`status ${wc.statusStr}, faults at the destination ${wc.odp?.faults.destination}, retransmitted blocks ${wc.odp?.retransmittedBlocks}`);
  console.log(`dst[0] = ${new Uint8Array(dst.buffer)[0]}, resident pages ${dst.residentPages()} of 16`);
} finally {
  cluster.close();
}
