// Reliable-connected queue pairs. Work requests run in order on the modelled PLDMA: every
// byte moves through the SMMUs (faulting on real memory) and the native copy engine. A
// destination fault behaves like ODP's RNR NAK: the requester retries up to rnrRetry
// (7 = infinite), then completes with RNR_RETRY_EXC_ERR. A failed work request moves the QP
// to ERR and the rest complete with WR_FLUSH_ERR.
import { DmaStatus, type DmaCompletion } from '../../kernel-sim/index.js';
import { closedError } from '../errors.js';
import { mapRegion, type Region } from '../region.js';
import { checkInt, checkObject, invalidArg } from '../validate.js';
import { Access, QP_DEFAULTS, QpState, QpType, rnrTimerMs, SendFlags, WcFlags, WcOpcode, WcStatus, WrOpcode } from './constants.js';
import type { Context, Sge } from './cluster.js';
import type { CompletionQueue, WorkCompletion } from './cq.js';
import { verbsError } from './errors.js';
import type { MemoryRegion, ProtectionDomain } from './mr.js';

export interface QpCap {
  maxSendWr: number;
  maxRecvWr: number;
  maxSendSge: number;
  maxRecvSge: number;
}

export interface QpInitAttr {
  /** ibv_qp_init_attr.qp_type: RC only (default). `type` is accepted as a synonym. */
  qpType?: QpType | 'RC';
  type?: QpType | 'RC';
  sendCq: CompletionQueue;
  recvCq: CompletionQueue;
  cap?: Partial<QpCap>;
  /** Every send WR generates a completion (IBV_QPINITATTR sq_sig_all). */
  sqSigAll?: boolean;
}

/** struct ibv_qp_attr, the fields this model uses. */
export interface QpAttr {
  qpState: QpState;
  qpAccessFlags?: number;
  portNum?: number;
  pathMtu?: number;
  /** The remote QP (RTR): its number and the node it lives on (the address vector). */
  destQpNum?: number;
  destNode?: number;
  rqPsn?: number;
  sqPsn?: number;
  minRnrTimer?: number;
  timeout?: number;
  retryCnt?: number;
  rnrRetry?: number;
  maxRdAtomic?: number;
  maxDestRdAtomic?: number;
}

export interface SendWr {
  wrId: bigint | number;
  opcode: WrOpcode;
  sgList: Sge[];
  sendFlags?: number;
  immData?: number;
  /** RDMA_WRITE(_WITH_IMM) and RDMA_READ */
  rdma?: { remoteAddr: bigint; rkey: number };
  /** ATOMIC_CMP_AND_SWP (compareAdd = compare, swap) and ATOMIC_FETCH_AND_ADD (compareAdd = add) */
  atomic?: { remoteAddr: bigint; rkey: number; compareAdd: bigint; swap?: bigint };
}

export interface RecvWr {
  wrId: bigint | number;
  sgList: Sge[];
}

type Outcome = { status: WcStatus; byteLen: number; odp: NonNullable<WorkCompletion['odp']> };

const WC_OPCODE: Record<WrOpcode, WcOpcode> = {
  [WrOpcode.RDMA_WRITE]: WcOpcode.RDMA_WRITE,
  [WrOpcode.RDMA_WRITE_WITH_IMM]: WcOpcode.RDMA_WRITE,
  [WrOpcode.SEND]: WcOpcode.SEND,
  [WrOpcode.SEND_WITH_IMM]: WcOpcode.SEND,
  [WrOpcode.RDMA_READ]: WcOpcode.RDMA_READ,
  [WrOpcode.ATOMIC_CMP_AND_SWP]: WcOpcode.COMP_SWAP,
  [WrOpcode.ATOMIC_FETCH_AND_ADD]: WcOpcode.FETCH_ADD,
};

const TRANSITIONS: Record<QpState, QpState[]> = {
  [QpState.RESET]: [QpState.INIT],
  [QpState.INIT]: [QpState.INIT, QpState.RTR],
  [QpState.RTR]: [QpState.RTS],
  [QpState.RTS]: [QpState.RTS, QpState.SQD],
  [QpState.SQD]: [QpState.RTS, QpState.SQD],
  [QpState.SQE]: [QpState.RTS],
  [QpState.ERR]: [],
};

export class QueuePair {
  readonly qpNum: number;
  readonly context: Context;
  readonly pd: ProtectionDomain;
  readonly sendCq: CompletionQueue;
  readonly recvCq: CompletionQueue;
  readonly cap: QpCap;
  readonly qpType = QpType.RC;
  readonly sqSigAll: boolean;
  #state = QpState.RESET;
  #attr: Required<Pick<QpAttr, 'qpAccessFlags' | 'minRnrTimer' | 'timeout' | 'retryCnt' | 'rnrRetry'>> & { destQpNum: number; destNode: number } = {
    qpAccessFlags: 0,
    minRnrTimer: QP_DEFAULTS.minRnrTimer,
    timeout: QP_DEFAULTS.timeout,
    retryCnt: QP_DEFAULTS.retryCnt,
    rnrRetry: QP_DEFAULTS.rnrRetry,
    destQpNum: -1,
    destNode: -1,
  };
  #sq: SendWr[] = [];
  #rq: RecvWr[] = [];
  #running = false;
  /** The send WR being executed, if any. */
  #current: SendWr | undefined;
  #destroyed = false;
  #rqWaiters: Array<() => void> = [];
  #scratch: Region | undefined;
  /** Aborted by destroy(): the engines stop this QP's transfers instead of finishing them. */
  #cancel = new AbortController();

  /** @internal use Context.createQp */
  constructor(context: Context, pd: ProtectionDomain, qpNum: number, init: QpInitAttr) {
    checkObject('createQp: init', init);
    const type = init.qpType ?? init.type;
    if (type !== undefined && type !== QpType.RC && type !== 'RC') throw verbsError('ibv_create_qp', 'EOPNOTSUPP', 'only RC queue pairs are modelled');
    if (!init.sendCq || !init.recvCq) throw invalidArg('createQp: sendCq and recvCq are required');
    this.context = context;
    this.pd = pd;
    this.qpNum = qpNum;
    this.sendCq = init.sendCq;
    this.recvCq = init.recvCq;
    this.sqSigAll = init.sqSigAll ?? false;
    const cap = init.cap ?? {};
    this.cap = {
      maxSendWr: checkInt('cap.maxSendWr', cap.maxSendWr ?? 128, 1, 1 << 16),
      maxRecvWr: checkInt('cap.maxRecvWr', cap.maxRecvWr ?? 128, 1, 1 << 16),
      maxSendSge: checkInt('cap.maxSendSge', cap.maxSendSge ?? 4, 1, 16),
      maxRecvSge: checkInt('cap.maxRecvSge', cap.maxRecvSge ?? 4, 1, 16),
    };
  }

  get state(): QpState {
    return this.#state;
  }

  /** ibv_query_qp */
  query(): QpAttr & { qpState: QpState } {
    return { qpState: this.#state, ...this.#attr };
  }

  /** ibv_modify_qp: RESET → INIT → RTR → RTS, and → ERR / → RESET from anywhere. */
  modify(attr: QpAttr): void {
    this.#checkAlive();
    checkObject('modify: attr', attr);
    const to = attr.qpState;
    if (!(to in QpState)) throw verbsError('ibv_modify_qp', 'EINVAL', `unknown state ${String(to)}`);
    if (to === QpState.ERR) return this.#toError();
    if (to === QpState.RESET) {
      this.#toError();
      this.#state = QpState.RESET;
      return;
    }
    if (!TRANSITIONS[this.#state].includes(to))
      throw verbsError('ibv_modify_qp', 'EINVAL', `cannot go from ${QpState[this.#state]} to ${QpState[to]} (RESET → INIT → RTR → RTS)`);
    if (attr.qpAccessFlags !== undefined) this.#attr.qpAccessFlags = checkInt('qpAccessFlags', attr.qpAccessFlags, 0, 0xff);
    if (to === QpState.RTR) {
      const destQp = attr.destQpNum ?? this.#attr.destQpNum;
      const destNode = attr.destNode ?? this.#attr.destNode;
      if (destQp < 0 || destNode < 0) throw verbsError('ibv_modify_qp', 'EINVAL', 'RTR needs destQpNum and destNode (the remote QP and its node)');
      checkInt('destNode', destNode, 0, this.context.cluster.nodes - 1);
      this.#attr.destQpNum = checkInt('destQpNum', destQp, 0);
      this.#attr.destNode = destNode;
      if (attr.minRnrTimer !== undefined) this.#attr.minRnrTimer = checkInt('minRnrTimer', attr.minRnrTimer, 0, 31);
    }
    if (to === QpState.RTS) {
      if (attr.timeout !== undefined) this.#attr.timeout = checkInt('timeout', attr.timeout, 0, 31);
      if (attr.retryCnt !== undefined) this.#attr.retryCnt = checkInt('retryCnt', attr.retryCnt, 0, 7);
      if (attr.rnrRetry !== undefined) this.#attr.rnrRetry = checkInt('rnrRetry', attr.rnrRetry, 0, 7);
    }
    this.#state = to;
    if (to === QpState.RTS) this.#kick();
  }

  /** ibv_post_send. Throws (EINVAL / ENOMEM) if the WR cannot be queued; errors of execution are completions. */
  postSend(wrs: SendWr | SendWr[]): void {
    this.#checkAlive();
    const list = Array.isArray(wrs) ? wrs : [wrs];
    if (this.#state !== QpState.RTS && this.#state !== QpState.ERR)
      throw verbsError('ibv_post_send', 'EINVAL', `the QP is in ${QpState[this.#state]}; move it to RTS first`);
    if (this.#sq.length + list.length > this.cap.maxSendWr) throw verbsError('ibv_post_send', 'ENOMEM', `the send queue holds at most ${this.cap.maxSendWr} WRs`);
    for (const wr of list) {
      checkObject('postSend: wr', wr);
      if (!(wr.opcode in WC_OPCODE)) throw verbsError('ibv_post_send', 'EINVAL', `unknown opcode ${String(wr.opcode)}`);
      if (!Array.isArray(wr.sgList) || wr.sgList.length > this.cap.maxSendSge)
        throw verbsError('ibv_post_send', 'EINVAL', `sgList must be an array of at most ${this.cap.maxSendSge} SGEs`);
      for (const sge of wr.sgList) checkSge(sge);
      if ((wr.opcode === WrOpcode.RDMA_WRITE || wr.opcode === WrOpcode.RDMA_WRITE_WITH_IMM || wr.opcode === WrOpcode.RDMA_READ) && !wr.rdma)
        throw verbsError('ibv_post_send', 'EINVAL', 'RDMA operations need wr.rdma = { remoteAddr, rkey }');
      if ((wr.opcode === WrOpcode.ATOMIC_CMP_AND_SWP || wr.opcode === WrOpcode.ATOMIC_FETCH_AND_ADD) && !wr.atomic)
        throw verbsError('ibv_post_send', 'EINVAL', 'atomics need wr.atomic = { remoteAddr, rkey, compareAdd, swap? }');
    }
    this.#sq.push(...list);
    this.#kick();
  }

  /** ibv_post_recv */
  postRecv(wrs: RecvWr | RecvWr[]): void {
    this.#checkAlive();
    const list = Array.isArray(wrs) ? wrs : [wrs];
    if (this.#state === QpState.RESET) throw verbsError('ibv_post_recv', 'EINVAL', 'the QP is in RESET; move it to INIT first');
    if (this.#rq.length + list.length > this.cap.maxRecvWr) throw verbsError('ibv_post_recv', 'ENOMEM', `the receive queue holds at most ${this.cap.maxRecvWr} WRs`);
    for (const wr of list) {
      checkObject('postRecv: wr', wr);
      if (!Array.isArray(wr.sgList) || wr.sgList.length > this.cap.maxRecvSge)
        throw verbsError('ibv_post_recv', 'EINVAL', `sgList must be an array of at most ${this.cap.maxRecvSge} SGEs`);
      for (const sge of wr.sgList) checkSge(sge);
    }
    if (this.#state === QpState.ERR) {
      for (const wr of list) this.#complete(this.recvCq, wr.wrId, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0);
      return;
    }
    this.#rq.push(...list);
    for (const w of this.#rqWaiters.splice(0)) w();
  }

  /** ibv_destroy_qp: outstanding work completes with WR_FLUSH_ERR. */
  destroy(): void {
    if (this.#destroyed) return;
    this.#toError();
    this.#destroyed = true;
    this.#cancel.abort();
    // Work in flight and queued behind it (left to the running loop by #toError) is flushed
    // now, in posting order; the loop drops the in-flight outcome when it arrives.
    const current = this.#current;
    this.#current = undefined;
    for (const wr of current ? [current, ...this.#sq.splice(0)] : this.#sq.splice(0)) this.#complete(this.sendCq, wr.wrId, WcStatus.WR_FLUSH_ERR, WC_OPCODE[wr.opcode], 0);
    // A peer's receive queue may be holding our SEND in an RNR wait: let it see we are gone.
    const peer = this.context.cluster.qp(this.#attr.destNode, this.#attr.destQpNum);
    if (peer) peer.#wakeRecvWaiters();
    this.#scratch?.close();
    this.context.releaseQp(this);
  }

  [Symbol.dispose](): void {
    this.destroy();
  }

  // ---- execution -----------------------------------------------------------------------

  #kick(): void {
    if (this.#running) return;
    this.#running = true;
    void this.#drain().finally(() => {
      this.#running = false;
      // Work posted while the loop was finishing.
      if (this.#sq.length && (this.#state === QpState.RTS || this.#state === QpState.ERR) && !this.#destroyed) this.#kick();
    });
  }

  async #drain(): Promise<void> {
    while (this.#sq.length && (this.#state === QpState.RTS || this.#state === QpState.ERR)) {
      const wr = this.#sq.shift()!;
      if (this.#state === QpState.ERR) {
        this.#complete(this.sendCq, wr.wrId, WcStatus.WR_FLUSH_ERR, WC_OPCODE[wr.opcode], 0);
        continue;
      }
      let out: Outcome;
      this.#current = wr;
      try {
        out = await this.#execute(wr);
      } catch {
        out = { status: WcStatus.GENERAL_ERR, byteLen: 0, odp: emptyOdp() };
      }
      if (this.#destroyed) return; // destroy() flushed it already
      this.#current = undefined;
      const signaled = this.sqSigAll || ((wr.sendFlags ?? 0) & SendFlags.SIGNALED) !== 0;
      if (signaled || out.status !== WcStatus.SUCCESS) this.#complete(this.sendCq, wr.wrId, out.status, WC_OPCODE[wr.opcode], out.byteLen, undefined, out.odp);
      if (out.status !== WcStatus.SUCCESS) this.#toError();
    }
  }

  async #execute(wr: SendWr): Promise<Outcome> {
    const needWrite = wr.opcode === WrOpcode.RDMA_READ || wr.opcode === WrOpcode.ATOMIC_CMP_AND_SWP || wr.opcode === WrOpcode.ATOMIC_FETCH_AND_ADD;
    const local: Array<{ sge: Sge; mr: MemoryRegion; region: Region; offset: number }> = [];
    for (const sge of wr.sgList) {
      const mr = this.context.cluster.mrByKey(sge.lkey);
      if (!mr || mr.closed || mr.pd !== this.pd) return fail(WcStatus.LOC_PROT_ERR);
      if (needWrite && !(mr.access & Access.LOCAL_WRITE)) return fail(WcStatus.LOC_PROT_ERR);
      const at = mr.resolve(sge.addr, sge.length);
      if (!at) return fail(WcStatus.LOC_PROT_ERR);
      this.context.simNode.smmu.map(this.pd.stream.sid, at.region);
      prefaultIfAsked(mr, at.region, at.offset, sge.length);
      local.push({ sge, mr, ...at });
    }
    const total = wr.sgList.reduce((s, x) => s + x.length, 0);
    const peer = this.context.cluster.qp(this.#attr.destNode, this.#attr.destQpNum);
    if (!peer || peer.#destroyed || (peer.#state !== QpState.RTR && peer.#state !== QpState.RTS)) return fail(WcStatus.RETRY_EXC_ERR);

    switch (wr.opcode) {
      case WrOpcode.RDMA_WRITE:
      case WrOpcode.RDMA_WRITE_WITH_IMM: {
        const remote = peer.#remote(wr.rdma!.rkey, wr.rdma!.remoteAddr, total, Access.REMOTE_WRITE);
        if (!remote) return fail(WcStatus.REM_ACCESS_ERR);
        const results = await this.#move(local.map((l, i) => ({ from: this, fromVa: l.sge.addr, to: peer, toVa: wr.rdma!.remoteAddr + BigInt(offsetOf(wr.sgList, i)), length: l.sge.length })));
        const status = statusOf(results);
        if (status !== WcStatus.SUCCESS || wr.opcode === WrOpcode.RDMA_WRITE) return done(status, total, results);
        const rwqe = await peer.#takeRecv(this.#attr.rnrRetry, this);
        if (!rwqe) return done(WcStatus.RNR_RETRY_EXC_ERR, 0, results);
        peer.#complete(peer.recvCq, rwqe.wrId, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, total, wr.immData ?? 0, undefined, this.qpNum);
        return done(WcStatus.SUCCESS, total, results);
      }
      case WrOpcode.SEND:
      case WrOpcode.SEND_WITH_IMM: {
        const rwqe = await peer.#takeRecv(this.#attr.rnrRetry, this);
        if (!rwqe) return fail(WcStatus.RNR_RETRY_EXC_ERR);
        const targets = peer.#localSges(rwqe.sgList, true);
        if (!targets) {
          peer.#complete(peer.recvCq, rwqe.wrId, WcStatus.LOC_PROT_ERR, WcOpcode.RECV, 0);
          peer.#toError();
          return fail(WcStatus.REM_OP_ERR);
        }
        const room = rwqe.sgList.reduce((s, x) => s + x.length, 0);
        if (total > room) {
          peer.#complete(peer.recvCq, rwqe.wrId, WcStatus.LOC_LEN_ERR, WcOpcode.RECV, 0);
          peer.#toError();
          return fail(WcStatus.REM_INV_REQ_ERR);
        }
        const pieces = scatter(wr.sgList, rwqe.sgList).map((p) => ({ from: this as QueuePair, fromVa: p.fromVa, to: peer, toVa: p.toVa, length: p.length }));
        const results = await this.#move(pieces);
        const status = statusOf(results);
        const imm = wr.opcode === WrOpcode.SEND_WITH_IMM ? (wr.immData ?? 0) : undefined;
        peer.#complete(peer.recvCq, rwqe.wrId, status === WcStatus.SUCCESS ? WcStatus.SUCCESS : WcStatus.LOC_PROT_ERR, WcOpcode.RECV, total, imm, undefined, this.qpNum);
        return done(status, total, results);
      }
      case WrOpcode.RDMA_READ: {
        const remote = peer.#remote(wr.rdma!.rkey, wr.rdma!.remoteAddr, total, Access.REMOTE_READ);
        if (!remote) return fail(WcStatus.REM_ACCESS_ERR);
        const results = await this.#move(local.map((l, i) => ({ from: peer, fromVa: wr.rdma!.remoteAddr + BigInt(offsetOf(wr.sgList, i)), to: this as QueuePair, toVa: l.sge.addr, length: l.sge.length })));
        return done(statusOf(results), total, results);
      }
      case WrOpcode.ATOMIC_CMP_AND_SWP:
      case WrOpcode.ATOMIC_FETCH_AND_ADD:
        return this.#atomic(wr, local, peer);
    }
  }

  // An 8-byte atomic at the responder: read the old value into the requester's buffer,
  // then write the new one. The cluster's atomic chain keeps atomics from interleaving.
  async #atomic(wr: SendWr, local: Array<{ sge: Sge; region: Region; offset: number }>, peer: QueuePair): Promise<Outcome> {
    const a = wr.atomic!;
    if (local.length !== 1 || local[0]!.sge.length !== 8) return fail(WcStatus.LOC_LEN_ERR);
    if (a.remoteAddr % 8n !== 0n) return fail(WcStatus.REM_INV_REQ_ERR);
    const remote = peer.#remote(a.rkey, a.remoteAddr, 8, Access.REMOTE_ATOMIC);
    if (!remote) return fail(WcStatus.REM_ACCESS_ERR);
    const cluster = this.context.cluster;
    const run = async (): Promise<Outcome> => {
      const read = await this.#move([{ from: peer, fromVa: a.remoteAddr, to: this, toVa: local[0]!.sge.addr, length: 8 }]);
      if (statusOf(read) !== WcStatus.SUCCESS) return done(statusOf(read), 0, read);
      const l = local[0]!;
      const old = new DataView(l.region.buffer).getBigUint64(l.offset, true);
      const next =
        wr.opcode === WrOpcode.ATOMIC_FETCH_AND_ADD ? BigInt.asUintN(64, old + a.compareAdd) : old === BigInt.asUintN(64, a.compareAdd) ? BigInt.asUintN(64, a.swap ?? 0n) : undefined;
      if (next === undefined) return done(WcStatus.SUCCESS, 8, read);
      const scratch = this.#scratchRegion();
      new DataView(scratch.buffer).setBigUint64(0, next, true);
      const write = await this.#move([{ from: this, fromVa: scratch.address, to: peer, toVa: a.remoteAddr, length: 8 }]);
      return done(statusOf(write), 8, [...read, ...write]);
    };
    const p = cluster.atomicChain.then(run, run);
    cluster.atomicChain = p.catch(() => undefined);
    return p;
  }

  #scratchRegion(): Region {
    if (!this.#scratch) {
      this.#scratch = mapRegion(4096);
      this.#scratch.populate();
      this.context.simNode.smmu.map(this.pd.stream.sid, this.#scratch);
    }
    return this.#scratch;
  }

  // Post one DMA descriptor per piece on the engine of the node that reads, and wait.
  #move(pieces: Array<{ from: QueuePair; fromVa: bigint; to: QueuePair; toVa: bigint; length: number }>): Promise<DmaCompletion[]> {
    const rnr = this.#attr.rnrRetry;
    return Promise.all(
      pieces
        .filter((p) => p.length > 0)
        .map((p) => {
          const pldma = p.from.context.simNode.pldma;
          return pldma.post(
            {
              channel: p.from.qpNum % pldma.channels,
              srcVa: p.fromVa,
              dstNode: p.to.context.node,
              dstVa: p.toVa,
              length: p.length,
              pd: p.from.pd.handle,
              dstPd: p.to.pd.handle,
              retryLimit: rnr === 7 ? Infinity : rnr,
            },
            { signal: this.#cancel.signal },
          );
        }),
    );
  }

  // Responder side: check a remote key against this QP's PD and the access wanted.
  #remote(rkey: number, addr: bigint, length: number, access: number): { mr: MemoryRegion } | undefined {
    const mr = this.context.cluster.mrByKey(rkey);
    if (!mr || mr.closed || mr.pd !== this.pd || !(mr.access & access)) return undefined;
    if (this.#attr.qpAccessFlags && !(this.#attr.qpAccessFlags & access)) return undefined;
    const at = mr.resolve(addr, length);
    if (!at) return undefined;
    this.context.simNode.smmu.map(this.pd.stream.sid, at.region);
    prefaultIfAsked(mr, at.region, at.offset, length);
    return { mr };
  }

  #localSges(sges: Sge[], write: boolean): boolean {
    for (const sge of sges) {
      const mr = this.context.cluster.mrByKey(sge.lkey);
      if (!mr || mr.closed || mr.pd !== this.pd || (write && !(mr.access & Access.LOCAL_WRITE))) return false;
      const at = mr.resolve(sge.addr, sge.length);
      if (!at) return false;
      this.context.simNode.smmu.map(this.pd.stream.sid, at.region);
      prefaultIfAsked(mr, at.region, at.offset, sge.length);
    }
    return true;
  }

  // Wait for a receive WQE like a requester retrying on RNR NAKs: min_rnr_timer apart,
  // rnrRetry times (7 = forever, until a receive is posted or the QP goes away).
  async #takeRecv(rnrRetry: number, requester: QueuePair): Promise<RecvWr | undefined> {
    for (let attempt = 0; ; attempt++) {
      // The requester stops retrying when it is destroyed or in ERR.
      if (requester.#destroyed || requester.#state === QpState.ERR) return undefined;
      if (this.#rq.length && this.#state !== QpState.ERR) return this.#rq.shift();
      if (this.#destroyed || this.#state === QpState.ERR) return undefined;
      if (rnrRetry !== 7 && attempt >= rnrRetry) return undefined;
      await new Promise<void>((resolve) => {
        const t = setTimeout(done, Math.max(1, rnrTimerMs(this.#attr.minRnrTimer)));
        function done() {
          clearTimeout(t);
          resolve();
        }
        this.#rqWaiters.push(done);
      });
    }
  }

  #wakeRecvWaiters(): void {
    for (const w of this.#rqWaiters.splice(0)) w();
  }

  #complete(cq: CompletionQueue, wrId: bigint | number, status: WcStatus, opcode: WcOpcode, byteLen: number, immData?: number, odp?: Outcome['odp'], srcQp?: number): void {
    const wc: Parameters<CompletionQueue['push']>[0] = {
      wrId: BigInt(wrId),
      status,
      opcode,
      byteLen,
      qpNum: this.qpNum,
      srcQp: srcQp ?? this.#attr.destQpNum,
      wcFlags: immData !== undefined ? WcFlags.WITH_IMM : 0,
    };
    if (immData !== undefined) wc.immData = immData >>> 0;
    if (odp) wc.odp = odp;
    cq.push(wc);
  }

  #toError(): void {
    if (this.#state === QpState.ERR) return;
    this.#state = QpState.ERR;
    for (const wr of this.#rq.splice(0)) this.#complete(this.recvCq, wr.wrId, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0);
    for (const w of this.#rqWaiters.splice(0)) w();
    if (!this.#running) for (const wr of this.#sq.splice(0)) this.#complete(this.sendCq, wr.wrId, WcStatus.WR_FLUSH_ERR, WC_OPCODE[wr.opcode], 0);
  }

  #checkAlive(): void {
    if (this.#destroyed) throw closedError('QueuePair');
  }
}

/** Move two RC QPs through INIT → RTR → RTS, each pointing at the other (rc_pingpong's defaults). */
export function connectQps(a: QueuePair, b: QueuePair, attr: Partial<QpAttr> = {}): void {
  const access = attr.qpAccessFlags ?? Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC;
  for (const [x, y] of [
    [a, b],
    [b, a],
  ] as const) {
    x.modify({ qpState: QpState.INIT, portNum: 1, qpAccessFlags: access });
    x.modify({ qpState: QpState.RTR, destQpNum: y.qpNum, destNode: y.context.node, minRnrTimer: attr.minRnrTimer ?? QP_DEFAULTS.minRnrTimer });
    x.modify({ qpState: QpState.RTS, timeout: attr.timeout ?? QP_DEFAULTS.timeout, retryCnt: attr.retryCnt ?? QP_DEFAULTS.retryCnt, rnrRetry: attr.rnrRetry ?? QP_DEFAULTS.rnrRetry });
  }
}

function checkSge(sge: Sge): void {
  if (!sge || typeof sge.addr !== 'bigint' || !Number.isInteger(sge.length) || sge.length < 0 || !Number.isInteger(sge.lkey))
    throw verbsError('ibv_post_send', 'EINVAL', 'each SGE needs { addr: bigint, length: integer >= 0, lkey: integer }');
}

function offsetOf(sges: Sge[], i: number): number {
  let o = 0;
  for (let k = 0; k < i; k++) o += sges[k]!.length;
  return o;
}

// The 'prefault' baseline: touch the whole buffer before each transfer.
function prefaultIfAsked(mr: MemoryRegion, region: Region, offset: number, length: number): void {
  if (mr.policy !== 'prefault') return;
  const ps = region.pageSize;
  const start = offset - (offset % ps);
  region.populate(start, Math.min(region.size - start, Math.ceil((length + offset - start) / ps) * ps));
}

// Split the bytes of `from` SGEs over `to` SGEs, in order.
function scatter(from: Sge[], to: Sge[]): Array<{ fromVa: bigint; toVa: bigint; length: number }> {
  const out: Array<{ fromVa: bigint; toVa: bigint; length: number }> = [];
  let ti = 0;
  let tOff = 0;
  for (const f of from) {
    let fOff = 0;
    while (fOff < f.length && ti < to.length) {
      const room = to[ti]!.length - tOff;
      const n = Math.min(room, f.length - fOff);
      if (n > 0) out.push({ fromVa: f.addr + BigInt(fOff), toVa: to[ti]!.addr + BigInt(tOff), length: n });
      fOff += n;
      tOff += n;
      if (tOff >= to[ti]!.length) {
        ti++;
        tOff = 0;
      }
    }
  }
  return out;
}

function emptyOdp(): Outcome['odp'] {
  return { faults: { source: 0, destination: 0 }, retransmittedBlocks: 0, modelUs: 0, realUs: 0 };
}

function fail(status: WcStatus): Outcome {
  return { status, byteLen: 0, odp: emptyOdp() };
}

function done(status: WcStatus, byteLen: number, results: DmaCompletion[]): Outcome {
  const odp = emptyOdp();
  let start = Infinity;
  let end = 0;
  for (const r of results) {
    odp.faults.source += r.faults.source;
    odp.faults.destination += r.faults.destination;
    odp.retransmittedBlocks += r.retransmittedBlocks;
    odp.realUs = Math.max(odp.realUs, r.real.us);
    start = Math.min(start, r.model.startUs);
    end = Math.max(end, r.model.endUs);
  }
  odp.modelUs = results.length ? end - start : 0;
  return { status, byteLen: status === WcStatus.SUCCESS ? byteLen : 0, odp };
}

// The work completion status libibverbs would report for a DMA outcome.
function statusOf(results: DmaCompletion[]): WcStatus {
  for (const r of results) {
    switch (r.status) {
      case DmaStatus.SUCCESS:
        continue;
      case DmaStatus.SRC_ADDR_ERR:
      case DmaStatus.SRC_PERM_ERR:
        return WcStatus.LOC_PROT_ERR;
      case DmaStatus.DST_ADDR_ERR:
      case DmaStatus.DST_PERM_ERR:
      case DmaStatus.PD_ERR:
        return WcStatus.REM_ACCESS_ERR;
      case DmaStatus.RETRY_EXCEEDED:
        return r.faults.destination > 0 ? WcStatus.RNR_RETRY_EXC_ERR : WcStatus.RETRY_EXC_ERR;
      case DmaStatus.FAULT_UNRESOLVED:
        return r.faults.destination > 0 ? WcStatus.REM_ACCESS_ERR : WcStatus.LOC_PROT_ERR;
      case DmaStatus.ABORTED:
        return WcStatus.REM_ABORT_ERR;
      case DmaStatus.FLUSHED:
        return WcStatus.WR_FLUSH_ERR;
      default:
        return WcStatus.GENERAL_ERR;
    }
  }
  return WcStatus.SUCCESS;
}
