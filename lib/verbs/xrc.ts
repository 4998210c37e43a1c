// XRC domains (struct ibv_xrcd): the scope of XRC SRQs and XRC target QPs. An XRC send QP
// (IBV_QPT_XRC_SEND) is connected to one XRC target QP (IBV_QPT_XRC_RECV) on the peer, like
// RC; each of its requests names an XRC SRQ by number (XRCETH, `wr.xrc.remoteSrqn`), and the
// target takes the receive from that SRQ of its own domain, its completion going to the SRQ's
// CQ. So any number of QP pairs can share one XRC SRQ, as rdma-core's XRC tests do.
import { verbsError } from './errors.js';
import type { RcSrq } from '../../kernel-sim/index.js';
import { IdAllocator } from './tables.js';

/** What the domain knows of an XRC SRQ (srq.ts's SharedReceiveQueue). */
interface XrcSrq extends RcSrq {
  readonly destroyed: boolean;
  readonly pd: object;
}

/** An XRC domain (struct ibv_xrcd): `Context.openXrcd()`; XRC SRQs and XRC_RECV QPs are created in it. */
export class XrcDomain {
  /** @internal Its XRC SRQs by number (ibv_get_srq_num). */
  readonly srqs = new Map<number, XrcSrq>();
  /** @internal XRC target QPs in this domain (close fails with EBUSY while any is left). */
  readonly qps = new Set<object>();
  /** @internal */
  readonly srqNumbers = new IdAllocator(1, 0xff_ffff);
  #closed = false;

  /** True once `close()` was called (or its context closed). */
  get closed(): boolean {
    return this.#closed;
  }

  /** ibv_close_xrcd: EBUSY while XRC SRQs or XRC target QPs use it. Idempotent. */
  close(): void {
    if (this.#closed) return;
    if (this.srqs.size || this.qps.size)
      throw verbsError(
        'ibv_close_xrcd',
        'EBUSY',
        `${this.srqs.size} XRC SRQ(s) and ${this.qps.size} XRC target QP(s) still use this domain; destroy them first`,
      );
    this.#closed = true;
  }

  /** Same as `close()`, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  /** @internal */
  check(verb: string): void {
    if (this.#closed) throw verbsError(verb, 'EINVAL', 'the XRC domain is closed');
  }
}
