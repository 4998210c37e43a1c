// Address handles (struct ibv_ah): where a UD SEND goes. On this fabric a port is a node, and
// a node's LID is its node number (there is no subnet manager to hand LIDs out): an AH names
// the destination node; the WR names the QP there and its Q_Key.
import { closedError } from '../errors.js';
import { checkInt, checkObject, known } from '../validate.js';
import type { Device } from './device.js';
import { verbsError } from './errors.js';
import type { ProtectionDomain } from './mr.js';

const AH_KEYS = known<AhAttr>({ dlid: true, sl: true, portNum: true });

/** struct ibv_ah_attr, the fields this model uses, as `Context.createAh` takes them. */
export interface AhAttr {
  /** The destination port's LID: here the destination node's number. */
  dlid: number;
  /** Service level (0..15; carried nowhere, checked only). */
  sl?: number;
  /** The local port (1; one port per device). */
  portNum?: number;
}

/** An address handle (struct ibv_ah): the destination of UD SENDs (`wr.ud.ah`). */
export class AddressHandle {
  /** The AH's protection domain: only QPs of the same PD may send with it. */
  readonly pd: ProtectionDomain;
  /** The destination node (its LID). */
  readonly dlid: number;
  /** Service level. */
  readonly sl: number;
  #destroyed = false;

  /** @internal use Context.createAh */
  constructor(pd: ProtectionDomain, device: Device, attr: AhAttr) {
    checkObject('createAh: attr', attr, AH_KEYS);
    const dlid = checkInt('createAh: dlid', attr.dlid, 0, 0xffff);
    if (!device.sim.hasPeer(dlid))
      throw verbsError('ibv_create_ah', 'EINVAL', `dlid ${dlid} names no node on the fabric (a node's LID is its number)`);
    if (attr.portNum !== undefined && attr.portNum !== 1)
      throw verbsError('ibv_create_ah', 'EINVAL', `portNum ${attr.portNum}: the device has one port, 1`);
    this.pd = pd;
    this.dlid = dlid;
    this.sl = checkInt('createAh: sl', attr.sl ?? 0, 0, 15);
    pd.users.add(this);
  }

  /** True once `destroy()` was called (or its context closed). */
  get destroyed(): boolean {
    return this.#destroyed;
  }

  /** ibv_destroy_ah. Idempotent; a WR posted with it afterwards is refused. */
  destroy(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    this.pd.users.delete(this);
  }

  /** Same as `destroy()`, for `using`. */
  [Symbol.dispose](): void {
    this.destroy();
  }

  /** @internal */
  check(): void {
    if (this.#destroyed) throw closedError('AddressHandle');
  }
}
