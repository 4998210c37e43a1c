// Two simulated nodes, one process on each, with a protection domain, a completion queue and
// a connected RC queue pair apiece: what ibv_rc_pingpong sets up before its first message.
import {
  Cluster,
  connectQps,
  type ClusterOptions,
  type CompletionQueue,
  type Context,
  type ProtectionDomain,
  type QueuePair,
} from '../../../lib/index.js';

export interface Pair {
  cluster: Cluster;
  /** Index 0: node 0 (the requester / client), index 1: node 1 (the responder / server). */
  ctx: [Context, Context];
  pd: [ProtectionDomain, ProtectionDomain];
  cq: [CompletionQueue, CompletionQueue];
  qp: [QueuePair, QueuePair];
}

export function connectedPair(options: ClusterOptions = {}): Pair {
  const cluster = Cluster.create({ nodes: 2, ...options });
  const ctx: Pair['ctx'] = [cluster.openDevice(0), cluster.openDevice(1)];
  const pd: Pair['pd'] = [ctx[0].allocPd(), ctx[1].allocPd()];
  const cq: Pair['cq'] = [ctx[0].createCq(256), ctx[1].createCq(256)];
  const qp: Pair['qp'] = [ctx[0].createQp(pd[0], { sendCq: cq[0], recvCq: cq[0] }), ctx[1].createQp(pd[1], { sendCq: cq[1], recvCq: cq[1] })];
  connectQps(qp[0], qp[1]);
  return { cluster, ctx, pd, cq, qp };
}
