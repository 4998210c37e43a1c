// The READ and ATOMIC part of a QP's responder (rdma_rxe's rxe_resp): it answers the
// request headers that reach its QP, and checks each on its own node: that the sender is the
// QP it is connected to, its own QP access flags (0 refuses every remote operation), the rkey
// in its own device's table, the MR's PD, bounds and access flags; then it carries the
// operation out by posting on its own node's engine, the bytes going back as READ responses
// that the requester's node checks against the sinks it expects. WRITE and SEND never come
// here: their packets are checked and written by the node's engine (kernel-sim/pldma/rc.ts).
import { type DmaCompletion, RcOp, type RcQp } from '../../kernel-sim/index.js';
import { Access, QpState, WcStatus } from './constants.js';
import { done, fail, type Outcome, statusOf } from './completer.js';
import type { MemoryRegion } from './mr.js';
import { offsetOf, prefaultIfAsked, type QpCore } from './qp-core.js';
import type { Request, Response } from './wire.js';

export class Responder {
  #qp: QpCore;
  #rc: RcQp;

  constructor(qp: QpCore, rc: RcQp) {
    this.#qp = qp;
    this.#rc = rc;
  }

  onRequest(m: Request, from: number): void {
    const q = this.#qp;
    const answer = (status: WcStatus, extra: Partial<Response> = {}) =>
      q.device.send(from, { kind: 'response', srcQpn: q.qpNum, dstQpn: m.srcQpn, psn: m.psn, status, ...extra });
    // Only the connected QP is heard, and only in a state that receives: anything else is
    // dropped, and the sender's transport retries run out.
    const receives = q.state === QpState.RTR || q.state === QpState.RTS || q.state === QpState.SQD;
    if (q.destroyed || !receives || from !== q.attr.destNode || m.srcQpn !== q.attr.destQpNum) {
      answer(WcStatus.RETRY_EXC_ERR);
      return;
    }
    // A READ or atomic is a message of this QP's receive side: the next one's PSN follows it.
    this.#rc.resp.epsn = (m.psn + 1) & 0xff_ffff;
    switch (m.op) {
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
            psn: m.psn,
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
      [{ fromVa: scratch.address, dstNode: from, toVa: sink.addr, length: 8, dstPd: m.pd!, key: sink.lkey, dstQp: m.srcQpn, psn: m.psn }],
      m.rnrRetry,
    );
    const results = [...read, ...back];
    if (statusOf(back) !== WcStatus.SUCCESS || next === undefined) return done(statusOf(results), 8, results);
    if (q.destroyed) return fail(WcStatus.RETRY_EXC_ERR);
    view.setBigUint64(8, next, true);
    const write = await this.#move(
      // This node's own write into its own memory (no QP: the engine's raw transfer; the key
      // only tags the copy, so deregistering the MR waits for it).
      [{ fromVa: scratch.address + 8n, dstNode: here, toVa: m.addr!, length: 8, dstPd: q.pd.handle, key: m.rkey! }],
      m.rnrRetry,
    );
    return done(statusOf(write), 8, [...results, ...write]);
  }

  #move(
    pieces: Array<{ fromVa: bigint; dstNode: number; toVa: bigint; length: number; dstPd: number; key?: number; dstQp?: number; psn?: number }>,
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
          if (p.dstQp !== undefined) {
            // The answer's bytes, as RC's READ response: checked at the requester against the sinks it expects.
            desc.dstQp = p.dstQp;
            desc.opcode = RcOp.READ_RESPONSE;
            if (p.psn !== undefined) desc.psn = p.psn;
          }
          return sim.post(desc);
        }),
    );
  }
}
