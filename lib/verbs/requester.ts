// The requester of a QP (rdma_rxe's rxe_req): it runs the send queue in order. It checks the
// WR's own SGEs on its own device and turns each WR into RC packets on its own node's engine
// (BTH: opcode, destination QP, PSN; RETH; AtomicETH; ImmDt), which the connected QP's node
// checks and answers with an ACK or a NAK (an RNR NAK retried by the engine). A READ or an
// atomic is one request packet; the responder's node sends the bytes back as READ responses.
import { type DmaCompletion, type DmaDescriptor, RcOp } from '../../kernel-sim/index.js';
import { QP_DEFAULTS, QpState, QpType, SendFlags, UD_MTU, WcOpcode, WcStatus, WrOpcode } from './constants.js';
import { done, fail, type Outcome, statusOf } from './completer.js';
import { expectLanding, type LocalSge, localSges, offsetOf, type QpCore, type SendWr } from './qp-core.js';

export const WC_OPCODE: Record<WrOpcode, WcOpcode> = {
  [WrOpcode.RDMA_WRITE]: WcOpcode.RDMA_WRITE,
  [WrOpcode.RDMA_WRITE_WITH_IMM]: WcOpcode.RDMA_WRITE,
  [WrOpcode.SEND]: WcOpcode.SEND,
  [WrOpcode.SEND_WITH_IMM]: WcOpcode.SEND,
  [WrOpcode.RDMA_READ]: WcOpcode.RDMA_READ,
  [WrOpcode.ATOMIC_CMP_AND_SWP]: WcOpcode.COMP_SWAP,
  [WrOpcode.ATOMIC_FETCH_AND_ADD]: WcOpcode.FETCH_ADD,
  [WrOpcode.FLUSH]: WcOpcode.FLUSH,
  [WrOpcode.ATOMIC_WRITE]: WcOpcode.ATOMIC_WRITE,
};

/** The largest message (ibv_port_attr.max_msg_sz): 2^31 bytes. */
export const MAX_MSG = 2 ** 31;

/**
 * WRs that may run while the ones before them are still in flight: RDMA_WRITEs after
 * RDMA_WRITEs. Their DMA goes on one engine channel per QP, whose transfers run in posting
 * order, so the bytes land in order as RC requires; a SEND or WRITE_WITH_IMM (which takes a
 * receive), a READ or an atomic (which must see every earlier write) waits for all before it.
 */
// SendFlags.SOLICITED: BTH's SE bit on the message's packets (a SEND or WRITE with immediate).
function solicited(wr: SendWr): { solicited: true } | undefined {
  return (wr.sendFlags ?? 0) & SendFlags.SOLICITED ? { solicited: true } : undefined;
}

function overlaps(wr: SendWr): boolean {
  return wr.opcode === WrOpcode.RDMA_WRITE;
}

export class Requester {
  #qp: QpCore;
  #running = false;
  /**
   * WRs started and not yet completed, in posting order: writes only, or one WR of another
   * kind alone (see overlaps). postSend keeps them and the queue within maxSendWr.
   */
  #inflight: SendWr[] = [];
  /** Settles when the last WR started has completed: each WR's completion waits for the one before it. */
  #chain: Promise<void> = Promise.resolve();
  #psn = 0;
  /** The XRC SRQ the WR being started names (XRC_SEND QPs). */
  #srqn: number | undefined;

  constructor(qp: QpCore) {
    this.#qp = qp;
  }

  /** The QP reached RTS: its first PSN (sq_psn). */
  startPsn(psn: number): void {
    this.#psn = psn & 0xff_ffff;
  }

  /** The WRs being executed, in posting order (destroy flushes them). */
  takeCurrent(): SendWr[] {
    return this.#inflight.splice(0);
  }

  /** WRs started and not yet completed (they still take room in the send queue). */
  get inflight(): number {
    return this.#inflight.length;
  }

  /** The PSN of the next request (ibv_query_qp's sq_psn). */
  get psn(): number {
    return this.#psn;
  }

  /** True while WRs are in flight (or being started): the queue is flushed in order behind them. */
  get running(): boolean {
    return this.#running || this.#inflight.length > 0;
  }

  /** Start what the send queue may start now; posting, RTS and each completion call it. */
  kick(): void {
    if (this.#running) return;
    this.#running = true;
    try {
      this.#drain();
    } finally {
      this.#running = false;
    }
  }

  // WRs in flight (see overlaps), completed in posting order: each WR's completion waits for
  // the one before it. A WR that fails takes the QP to ERR; the ones after it complete
  // WR_FLUSH_ERR. Synchronous, with nothing awaited: what cannot start now is started by the
  // kick of a later post or completion (no promise per wait, no loop kept alive per QP).
  #drain(): void {
    const q = this.#qp;
    for (;;) {
      const live = q.state === QpState.RTS || q.state === QpState.ERR;
      const wr = live ? q.sq.head() : undefined;
      // A WR of another kind in flight is alone there: writes in flight are all writes.
      const writing = this.#inflight.length > 0 && overlaps(this.#inflight[0]!);
      const room = this.#inflight.length === 0 || (wr !== undefined && overlaps(wr) && writing);
      if (!wr || !room || q.state === QpState.ERR) {
        if (this.#inflight.length === 0) {
          if (!wr) return;
          // ERR with nothing in flight: flush the queue in order.
          q.sq.shift();
          q.completer.complete(q.sendCq, wr.wrId, WcStatus.WR_FLUSH_ERR, WC_OPCODE[wr.opcode], 0);
          continue;
        }
        // The WRs in flight first: their completions kick again (a write posted meanwhile
        // joins the writes in flight at its own post's kick).
        return;
      }
      q.sq.shift();
      this.#inflight.push(wr);
      const exec = this.#execute(wr).catch(() => fail(WcStatus.GENERAL_ERR));
      this.#chain = this.#chain.then(async () => {
        const result = await exec;
        // destroy() took it, and flushed it, already.
        const i = this.#inflight.indexOf(wr);
        if (i < 0) return;
        this.#inflight.splice(i, 1);
        // A WR before it failed: the QP is in ERR and this one is flushed, whatever it did.
        const out = q.state === QpState.ERR ? fail(WcStatus.WR_FLUSH_ERR) : result;
        const signaled = q.sqSigAll || ((wr.sendFlags ?? 0) & SendFlags.SIGNALED) !== 0;
        if (signaled || out.status !== WcStatus.SUCCESS)
          q.completer.complete(q.sendCq, wr.wrId, out.status, WC_OPCODE[wr.opcode], out.byteLen, undefined, out.odp);
        if (out.status !== WcStatus.SUCCESS) q.toError();
        if (!q.destroyed) this.kick();
      });
    }
  }

  async #execute(wr: SendWr): Promise<Outcome> {
    const q = this.#qp;
    // XRC: every packet of the WR names the target's XRC SRQ (read by #move before any await).
    this.#srqn = wr.xrc?.remoteSrqn;
    const total = wr.sgList.reduce((s, x) => s + x.length, 0);
    if (total > MAX_MSG) return fail(WcStatus.LOC_LEN_ERR);
    const landsHere = wr.opcode === WrOpcode.RDMA_READ || wr.opcode === WrOpcode.ATOMIC_CMP_AND_SWP || wr.opcode === WrOpcode.ATOMIC_FETCH_AND_ADD;
    const local = localSges(q, wr.sgList, landsHere);
    if (!local) return fail(WcStatus.LOC_PROT_ERR);
    switch (wr.opcode) {
      case WrOpcode.RDMA_WRITE:
      case WrOpcode.RDMA_WRITE_WITH_IMM:
        return this.#write(wr, local, total);
      case WrOpcode.SEND:
      case WrOpcode.SEND_WITH_IMM:
        if (q.qpType === QpType.UD) return this.#sendUd(wr, local[0], total);
        return this.#send(wr, local, total);
      case WrOpcode.RDMA_READ:
        return this.#read(wr, local, total);
      case WrOpcode.ATOMIC_CMP_AND_SWP:
      case WrOpcode.ATOMIC_FETCH_AND_ADD:
        return this.#atomic(wr, local);
      case WrOpcode.ATOMIC_WRITE: {
        // One packet carrying the word's 8 new bytes, read from the local SGE (it may fault here).
        if (local.length !== 1 || local[0]!.length !== 8) return fail(WcStatus.LOC_LEN_ERR);
        const { remoteAddr, rkey } = wr.rdma!;
        const results = await this.#move(RcOp.ATOMIC_WRITE, [{ fromVa: local[0]!.addr, toVa: remoteAddr, length: 8, key: rkey }], 8, undefined);
        return done(statusOf(results), 8, results);
      }
      case WrOpcode.FLUSH: {
        // One request packet: RETH (the range) and FETH (placement type, selectivity); its ACK
        // comes once the responder has made the range what the type asks.
        const f = wr.flush!;
        const results = await this.#move(RcOp.FLUSH, [{ fromVa: 0n, toVa: f.remoteAddr, length: 0, key: f.rkey }], 0, undefined, {
          dmaLength: f.length,
          flush: { type: f.type, level: f.level },
        });
        return done(statusOf(results), 0, results);
      }
    }
    return fail(WcStatus.LOC_QP_OP_ERR);
  }

  // RC packets straight away: the responder's engine checks the rkey on every packet and, for
  // the immediate, takes a receive with the last one.
  async #write(wr: SendWr, local: LocalSge[], total: number): Promise<Outcome> {
    const { remoteAddr, rkey } = wr.rdma!;
    const imm = wr.opcode === WrOpcode.RDMA_WRITE_WITH_IMM;
    const results = await this.#move(
      imm ? RcOp.WRITE_IMM : RcOp.WRITE,
      local.map((l, i) => ({ fromVa: l.addr, toVa: remoteAddr + BigInt(offsetOf(wr.sgList, i)), length: l.length, key: rkey })),
      total,
      imm ? (wr.immData ?? 0) : undefined,
      solicited(wr),
    );
    return done(statusOf(results), total, results);
  }

  // An RC SEND: the receive WQE is taken where the first packet lands; its buffers say where the bytes go.
  async #send(wr: SendWr, local: LocalSge[], total: number): Promise<Outcome> {
    const imm = wr.opcode === WrOpcode.SEND_WITH_IMM;
    const results = await this.#move(
      imm ? RcOp.SEND_IMM : RcOp.SEND,
      local.map((l) => ({ fromVa: l.addr, toVa: 0n, length: l.length })),
      total,
      imm ? (wr.immData ?? 0) : undefined,
      solicited(wr),
    );
    return done(statusOf(results), total, results);
  }

  // One READ request packet (RETH: address, rkey, DMA length); the responder's node sends the
  // bytes back as READ responses, which land here only in these sinks.
  async #read(wr: SendWr, local: LocalSge[], total: number): Promise<Outcome> {
    const { remoteAddr, rkey } = wr.rdma!;
    const landed = expectLanding(this.#qp, sinksOf(local));
    const results = await this.#move(RcOp.READ_REQUEST, [{ fromVa: 0n, toVa: remoteAddr, length: 0, key: rkey }], 0, undefined, {
      dmaLength: total,
      sinks: sinksOf(local),
      responseTimeout: this.#responseTimeout(),
    }).finally(landed);
    return done(statusOf(results), total, results);
  }

  // An atomic (AtomicETH): its original value lands in the one 8-byte local SGE.
  async #atomic(wr: SendWr, local: LocalSge[]): Promise<Outcome> {
    const a = wr.atomic!;
    if (local.length !== 1 || local[0]!.length !== 8) return fail(WcStatus.LOC_LEN_ERR);
    const landed = expectLanding(this.#qp, sinksOf(local));
    const results = await this.#move(RcOp.ATOMIC, [{ fromVa: 0n, toVa: a.remoteAddr, length: 0, key: a.rkey }], 0, undefined, {
      sinks: sinksOf(local),
      responseTimeout: this.#responseTimeout(),
      atomic: {
        fetchAdd: wr.opcode === WrOpcode.ATOMIC_FETCH_AND_ADD,
        compareAdd: BigInt.asUintN(64, a.compareAdd),
        swap: BigInt.asUintN(64, a.swap ?? 0n),
      },
    }).finally(landed);
    return done(statusOf(results), 8, results);
  }

  // A UD SEND: one packet of at most the MTU to the AH's node and the WR's QP and Q_Key. Its
  // completion says it left (the responder answers the engine even when it drops it); a fault
  // at either end is still the engine's own: resolved, and the block sent again.
  async #sendUd(wr: SendWr, l: { addr: bigint } | undefined, total: number): Promise<Outcome> {
    if (total > UD_MTU) return fail(WcStatus.LOC_LEN_ERR);
    const u = wr.ud!;
    const imm = wr.opcode === WrOpcode.SEND_WITH_IMM;
    const results = await this.#move(
      imm ? RcOp.UD_SEND_IMM : RcOp.UD_SEND,
      [{ fromVa: l?.addr ?? 0n, toVa: 0n, length: total }],
      total,
      imm ? (wr.immData ?? 0) : undefined,
      solicited(wr),
      { node: u.ah.dlid, qpn: u.remoteQpn, qkey: u.remoteQkey },
    );
    return done(statusOf(results), total, results);
  }

  /**
   * The local ACK timeout of a READ or an atomic: IB's 4.096 µs × 2^timeout a period, retry_cnt
   * retries. A period is never shorter than the engine's fault timeout (a responder holds its
   * response while its fault library answers, and tries again after that long), and timeout 0,
   * which is infinite in IB, is taken as the default (14): a response that never comes ends the
   * WR in RETRY_EXC_ERR, never in a hang.
   */
  #responseTimeout(): { periodMs: number; retries: number } {
    const a = this.#qp.attr;
    const ibMs = 0.004096 * 2 ** (a.timeout === 0 ? QP_DEFAULTS.timeout : a.timeout);
    return { periodMs: Math.max(ibMs, this.#qp.device.sim.pldma.faultTimeoutMs), retries: a.retryCnt };
  }

  #nextPsn(): number {
    const psn = this.#psn;
    this.#psn = (psn + 1) & 0xff_ffff;
    return psn;
  }

  /**
   * One WR as RC packets on this node's engine, to the connected QP: one transfer per SGE
   * (each names its byte offset in the message when there are several), all under the WR's
   * PSN; an empty message is one packet with no bytes.
   */
  #move(
    opcode: RcOp,
    pieces: Array<{ fromVa: bigint; toVa: bigint; length: number; key?: number }>,
    total: number,
    immData: number | undefined,
    request?: Pick<DmaDescriptor, 'dmaLength' | 'sinks' | 'atomic' | 'flush' | 'solicited' | 'responseTimeout'>,
    ud?: { node: number; qpn: number; qkey: number },
  ): Promise<DmaCompletion[]> {
    const q = this.#qp;
    const sim = q.device.sim;
    const rnr = q.attr.rnrRetry;
    const psn = this.#nextPsn();
    const parts = pieces.filter((p) => p.length > 0);
    if (parts.length === 0) parts.push({ ...(pieces[0] ?? { fromVa: 0n, toVa: 0n }), length: 0 });
    let offset = 0;
    const post = (p: { fromVa: bigint; toVa: bigint; length: number; key?: number }) => {
      const desc: DmaDescriptor = {
        channel: q.qpNum % sim.channels,
        srcVa: p.fromVa,
        dstNode: ud ? ud.node : q.attr.destNode,
        dstVa: p.toVa,
        length: p.length,
        pd: q.pd.handle,
        retryLimit: rnr === 7 ? Infinity : rnr,
        dstQp: ud ? ud.qpn : q.attr.destQpNum,
        srcQp: q.qpNum,
        opcode,
        psn,
      };
      if (p.key !== undefined) desc.key = p.key;
      if (immData !== undefined) desc.immData = immData;
      if (ud) desc.qkey = ud.qkey;
      if (this.#srqn !== undefined) desc.srqn = this.#srqn;
      if (parts.length > 1) desc.message = { offset, length: total };
      if (request) Object.assign(desc, request);
      offset += p.length;
      return sim.post(desc);
    };
    // The common case, one SGE: no Promise.all (one promise less per WR).
    if (parts.length === 1) return post(parts[0]!).then((c) => [c]);
    return Promise.all(parts.map(post));
  }
}

// Where a READ's or an atomic's response may land: the WR's local SGEs, as sinks.
function sinksOf(local: LocalSge[]): Array<{ addr: bigint; length: number; lkey: number }> {
  return local.map((l) => ({ addr: l.addr, length: l.length, lkey: l.lkey }));
}
