// One RDMA device (rdma_rxe's rxe_dev) per simulated node: its object tables and the node it
// drives through the SimNode surface. What the node's engine checks of every RC packet (a
// QP's state, connection and PSN, an rkey's MR, PD, bounds and access, a receive WQE) it
// reads in the node's own tables, where the device keeps its MRs and QPs; only the READ and
// atomic request headers still come up here, to the QP they name.
import type { CostModel, RcMr, RcQp, SimNode } from '../../kernel-sim/index.js';
import type { Region } from '../region.js';
import { WcStatus } from './constants.js';
import type { DeviceTables } from './tables.js';
import { isMessage, type Request, type Response, type Message } from './wire.js';

/** What the device needs of a QP of its own. */
export interface Endpoint {
  /** What the node's engine responder reads of the QP. */
  readonly rc: RcQp;
  onRequest(m: Request, from: number): void;
  onResponse(m: Response): void;
  /** Node `node` (in another process) went away. */
  peerLost(node: number): void;
}

/** What the device needs of an MR of its own. */
export interface KeyedMr extends RcMr {
  readonly pd: { readonly handle: number; readonly closed: boolean };
  resolve(addr: bigint, length: number): { region: Region; offset: number } | undefined;
}

export class Device {
  readonly node: number;
  readonly sim: SimNode;
  readonly costs: CostModel;
  readonly tables: DeviceTables<KeyedMr, Endpoint>;
  #closed = false;

  constructor(sim: SimNode, costs: CostModel, tables: DeviceTables<KeyedMr, Endpoint>) {
    this.node = sim.id;
    this.sim = sim;
    this.costs = costs;
    this.tables = tables;
    sim.onMessage((body, from) => {
      if (isMessage(body)) this.#dispatch(body, from);
    });
    // A packet naming no QP lands only from this node's own engine from now on.
    sim.tables.strict = true;
    sim.onPeerLost((node) => {
      for (const qp of this.tables.qps()) qp.peerLost(node);
    });
  }

  /** Send a header to a QP on node `dst`. */
  send(dst: number, m: Message): void {
    if (this.#closed) return;
    this.sim.sendMessage(dst, m);
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.sim.onMessage(undefined);
    this.sim.onPeerLost(undefined);
  }

  #dispatch(m: Message, from: number): void {
    const qp = this.tables.qp(m.dstQpn);
    if (m.kind === 'response') {
      qp?.onResponse(m);
      return;
    }
    if (qp) {
      qp.onRequest(m, from);
      return;
    }
    // No such QP here: its packets are dropped and the requester's retries run out.
    this.send(from, { kind: 'response', srcQpn: m.dstQpn, dstQpn: m.srcQpn, psn: m.psn, status: WcStatus.RETRY_EXC_ERR });
  }
}
