// The responder of a QP (rdma_rxe's rxe_resp): it answers the request headers that reach
// its QP, and checks each on its own node: that the sender is the QP it is connected to,
// its own QP access flags (0 refuses every remote operation), the rkey in its own device's
// table, the MR's PD, bounds and access flags. It takes receive WQEs for SEND and
// WRITE_WITH_IMM (an RNR NAK when there is none), and carries out READ and ATOMIC itself by
// posting on its own node's engine. Every write block that lands here is admitted again by
// `accepts` (per block, as rxe checks the rkey per packet).
import type { DmaCompletion } from '../../kernel-sim/index.js';
import { Access, QpState, WcOpcode, WcStatus } from './constants.js';
import { done, fail, type Outcome, statusOf } from './completer.js';
import type { MemoryRegion } from './mr.js';
import { expectLanding, expectsLanding, localSges, offsetOf, prefaultIfAsked, type QpCore, type RecvWr } from './qp-core.js';
import type { Request, Response } from './wire.js';

export class Responder {
  #qp: QpCore;
  /** SEND receives taken and waiting for the requester's word on the payload, by psn (and the end of their landing). */
  #receiving = new Map<number, { wqe: RecvWr; done: () => void }>();

  constructor(qp: QpCore) {
    this.#qp = qp;
  }

  /** Receives taken but not completed: flushed with the rest when the QP goes to ERR. */
  takeReceiving(): RecvWr[] {
    const out = [...this.#receiving.values()];
    this.#receiving.clear();
    for (const r of out) r.done();
    return out.map((r) => r.wqe);
  }

  onRequest(m: Request, from: number): void {
    const q = this.#qp;
    const answer = (status: WcStatus, extra: Partial<Response> = {}) =>
      q.device.send(from, { kind: 'response', srcQpn: q.qpNum, dstQpn: m.srcQpn, psn: m.psn, status, ...extra });
    // Only the connected QP is heard, and only in a state that receives: anything else is
    // dropped, and the sender's transport retries run out.
    const receives = q.state === QpState.RTR || q.state === QpState.RTS || q.state === QpState.SQD;
    if (q.destroyed || !receives || from !== q.attr.destNode || m.srcQpn !== q.attr.destQpNum) {
      if (m.op !== 'send-fin') answer(WcStatus.RETRY_EXC_ERR);
      return;
    }
    switch (m.op) {
      case 'write':
        if (!this.#remote(m.rkey, m.addr, m.length, Access.REMOTE_WRITE)) return answer(WcStatus.REM_ACCESS_ERR);
        return answer(WcStatus.SUCCESS, { pd: q.pd.handle });
      case 'write-imm': {
        const wqe = q.rq.shift();
        if (!wqe) return answer(WcStatus.RNR_RETRY_EXC_ERR, { rnr: q.attr.minRnrTimer });
        q.completer.complete(q.recvCq, wqe.wrId, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, m.length, m.immData ?? 0, m.odp, m.srcQpn);
        return answer(WcStatus.SUCCESS);
      }
      case 'send': {
        const wqe = q.rq.shift();
        if (!wqe) return answer(WcStatus.RNR_RETRY_EXC_ERR, { rnr: q.attr.minRnrTimer });
        if (!localSges(q, wqe.sgList, true)) {
          q.completer.complete(q.recvCq, wqe.wrId, WcStatus.LOC_PROT_ERR, WcOpcode.RECV, 0);
          q.toError();
          return answer(WcStatus.REM_OP_ERR);
        }
        const room = wqe.sgList.reduce((s, x) => s + x.length, 0);
        if (m.length > room) {
          q.completer.complete(q.recvCq, wqe.wrId, WcStatus.LOC_LEN_ERR, WcOpcode.RECV, 0);
          q.toError();
          return answer(WcStatus.REM_INV_REQ_ERR);
        }
        this.#receiving.set(m.psn, { wqe, done: expectLanding(q, wqe.sgList) });
        return answer(WcStatus.SUCCESS, { pd: q.pd.handle, targets: wqe.sgList.map((s) => ({ addr: s.addr, length: s.length, lkey: s.lkey })) });
      }
      case 'send-fin': {
        const taken = this.#receiving.get(m.psn);
        if (!taken) return;
        this.#receiving.delete(m.psn);
        taken.done();
        const wqe = taken.wqe;
        q.completer.complete(
          q.recvCq,
          wqe.wrId,
          m.ok ? WcStatus.SUCCESS : WcStatus.LOC_PROT_ERR,
          WcOpcode.RECV,
          m.length,
          m.immData,
          m.odp,
          m.srcQpn,
        );
        return;
      }
      case 'read': {
        if (!this.#remote(m.rkey, m.addr, m.length, Access.REMOTE_READ)) return answer(WcStatus.REM_ACCESS_ERR);
        const sinks = m.sinks ?? [];
        void this.#move(
          sinks.map((s, i) => ({
            fromVa: m.addr! + BigInt(offsetOf(sinks, i)),
            dstNode: from,
            toVa: s.addr,
            length: s.length,
            dstPd: m.pd!,
            key: s.lkey,
            dstQp: m.srcQpn,
          })),
          m.rnrRetry,
        ).then((results) => {
          const out = done(statusOf(results), m.length, results);
          // Destroyed meanwhile (its transfer was cancelled): as for any request it no longer hears.
          answer(q.destroyed ? WcStatus.RETRY_EXC_ERR : out.status, { odp: out.odp });
        });
        return;
      }
      case 'atomic': {
        if (m.addr! % 8n !== 0n) return answer(WcStatus.REM_INV_REQ_ERR);
        if (!this.#remote(m.rkey, m.addr, 8, Access.REMOTE_ATOMIC)) return answer(WcStatus.REM_ACCESS_ERR);
        // The device's atomic unit: one atomic at a time, read-modify-write on its own memory.
        const tables = q.device.tables;
        const run = () => this.#atomic(m, from);
        const p = tables.atomicChain.then(run, run);
        tables.atomicChain = p.catch(() => undefined);
        void p.then((out) => answer(q.destroyed ? WcStatus.RETRY_EXC_ERR : out.status, { odp: out.odp }));
        return;
      }
    }
  }

  /**
   * Whether a write block from `from` into [va, va+length) under `key` may land: checked per
   * block. From the peer, only where an RDMA WRITE may land (a REMOTE_WRITE key, a QP that
   * takes remote writes) or where this QP expects its bytes (its READ and atomic sinks, a
   * taken receive's buffers): a LOCAL_WRITE-only key is no licence to write.
   */
  accepts(from: number, key: number | undefined, va: bigint, length: number, pd: number): boolean {
    const q = this.#qp;
    if (q.destroyed || q.pd.closed || pd !== q.pd.handle) return false;
    if (from !== q.device.node && from !== q.attr.destNode) return false;
    if (key === undefined) return false;
    const mr = q.device.tables.mr(key) as MemoryRegion | undefined;
    if (!mr || mr.closed || mr.pd !== q.pd || !(mr.access & Access.LOCAL_WRITE)) return false;
    const remoteWrite = (mr.access & Access.REMOTE_WRITE) !== 0 && (q.attr.qpAccessFlags & Access.REMOTE_WRITE) !== 0;
    if (from !== q.device.node && !remoteWrite && !expectsLanding(q, key, va, length)) return false;
    return mr.resolve(va, length) !== undefined;
  }

  // Check a remote key against this QP's flags and PD and the access wanted; map its memory.
  #remote(rkey: number | undefined, addr: bigint | undefined, length: number, access: number): boolean {
    const q = this.#qp;
    if (!(q.attr.qpAccessFlags & access) || rkey === undefined || addr === undefined) return false;
    const mr = q.device.tables.mr(rkey) as MemoryRegion | undefined;
    if (!mr || mr.closed || mr.pd !== q.pd || !(mr.access & access)) return false;
    const at = mr.resolve(addr, length);
    if (!at) return false;
    q.pd.mapFor(mr, at.region);
    prefaultIfAsked(mr, at.region, at.offset, length);
    return true;
  }

  // Read the old value into the QP's own buffer, send it to the requester, write the new one.
  async #atomic(m: Request, from: number): Promise<Outcome> {
    const q = this.#qp;
    const a = m.atomic!;
    const sink = m.sinks?.[0];
    if (!sink) return fail(WcStatus.LOC_LEN_ERR);
    // Its turn at the atomic unit came after the QP was destroyed: nothing is read or written.
    if (q.destroyed) return fail(WcStatus.RETRY_EXC_ERR);
    const scratch = q.scratch();
    const here = q.device.node;
    const read = await this.#move([{ fromVa: m.addr!, dstNode: here, toVa: scratch.address, length: 8, dstPd: q.pd.handle }], m.rnrRetry);
    if (statusOf(read) !== WcStatus.SUCCESS) return done(statusOf(read), 0, read);
    // Destroyed meanwhile: its scratch buffer is gone, and nothing more is sent or written.
    if (q.destroyed) return fail(WcStatus.RETRY_EXC_ERR);
    const view = new DataView(scratch.buffer);
    const old = view.getBigUint64(0, true);
    const next = a.fetchAdd
      ? BigInt.asUintN(64, old + a.compareAdd)
      : old === BigInt.asUintN(64, a.compareAdd)
        ? BigInt.asUintN(64, a.swap)
        : undefined;
    const back = await this.#move(
      [{ fromVa: scratch.address, dstNode: from, toVa: sink.addr, length: 8, dstPd: m.pd!, key: sink.lkey, dstQp: m.srcQpn }],
      m.rnrRetry,
    );
    const results = [...read, ...back];
    if (statusOf(back) !== WcStatus.SUCCESS || next === undefined) return done(statusOf(results), 8, results);
    if (q.destroyed) return fail(WcStatus.RETRY_EXC_ERR);
    view.setBigUint64(8, next, true);
    const write = await this.#move(
      [{ fromVa: scratch.address + 8n, dstNode: here, toVa: m.addr!, length: 8, dstPd: q.pd.handle, key: m.rkey!, dstQp: q.qpNum }],
      m.rnrRetry,
    );
    return done(statusOf(write), 8, [...results, ...write]);
  }

  #move(
    pieces: Array<{ fromVa: bigint; dstNode: number; toVa: bigint; length: number; dstPd: number; key?: number; dstQp?: number }>,
    rnrRetry = 7,
  ): Promise<DmaCompletion[]> {
    const q = this.#qp;
    const sim = q.device.sim;
    return Promise.all(
      pieces
        .filter((p) => p.length > 0)
        .map((p) => {
          const desc: Parameters<typeof sim.post>[0] = {
            channel: q.qpNum % sim.channels,
            srcVa: p.fromVa,
            dstNode: p.dstNode,
            dstVa: p.toVa,
            length: p.length,
            pd: q.pd.handle,
            dstPd: p.dstPd,
            retryLimit: rnrRetry === 7 ? Infinity : rnrRetry,
            srcQp: q.qpNum,
          };
          if (p.key !== undefined) desc.key = p.key;
          if (p.dstQp !== undefined) desc.dstQp = p.dstQp;
          return sim.post(desc);
        }),
    );
  }
}
