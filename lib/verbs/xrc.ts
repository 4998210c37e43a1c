// XRC domains (struct ibv_xrcd): the scope of XRC SRQs and XRC target QPs. An XRC send QP
// (IBV_QPT_XRC_SEND) is connected to one XRC target QP (IBV_QPT_XRC_RECV) on the peer, like
// RC; each of its requests names an XRC SRQ by number (XRCETH, `wr.xrc.remoteSrqn`), and the
// target takes the receive from that SRQ of its own domain, its completion going to the SRQ's
// CQ. So any number of QP pairs can share one XRC SRQ, as rdma-core's XRC tests do. The
// device finds the SRQ by that number in its own tables and checks it names this domain's
// handle; the domain object itself is the provider's.
import { verbsError } from './errors.js';

/** Handles of XRC domains, unique in the process: what a device's SRQ and QP records name their domain by. */
let nextXrcd = 1;

/** An XRC domain (struct ibv_xrcd): `Context.openXrcd()`; XRC SRQs and XRC_RECV QPs are created in it. */
export class XrcDomain {
  /** @internal The domain's handle (an XRC SRQ's record and an XRC target's name it). */
  readonly handle = nextXrcd++;
  /** @internal Its XRC SRQs by number (ibv_get_srq_num: the device's handle of the SRQ). */
  readonly srqs = new Map<number, object>();
  /** @internal XRC target QPs in this domain (close fails with EBUSY while any is left). */
  readonly qps = new Set<object>();
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
