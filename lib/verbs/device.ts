// One RDMA device (rdma_rxe's rxe_dev) per simulated node: its object tables, the node it
// drives through the SimNode surface, and the dispatch of what arrives for it: request and
// response headers go to the QP they name, and every incoming write block is admitted only
// if the QP and key it names still accept it. It only ever looks in its own tables.
import type { CostModel, SimNode, WireBlock, WritePacket } from '../../kernel-sim/index.js';
import type { Region } from '../region.js';
import { WcStatus } from './constants.js';
import type { DeviceTables } from './tables.js';
import { isMessage, type Request, type Response, type Message } from './wire.js';

/** What the device needs of a QP of its own. */
export interface Endpoint {
  onRequest(m: Request, from: number): void;
  onResponse(m: Response): void;
  /** Node `node` (in another process) went away. */
  peerLost(node: number): void;
  /** Whether a write block from node `from` into [va, va+length) under `key` still lands. */
  accepts(from: number, key: number | undefined, va: bigint, length: number, pd: number): boolean;
}

/** What the device needs of an MR of its own. */
export interface KeyedMr {
  readonly closed: boolean;
  readonly access: number;
  readonly pd: { readonly handle: number };
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
    sim.admit((p, block) => this.#admit(p, block));
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
    this.sim.admit(undefined);
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
    if (m.op !== 'send-fin') this.send(from, { kind: 'response', srcQpn: m.dstQpn, dstQpn: m.srcQpn, psn: m.psn, status: WcStatus.RETRY_EXC_ERR });
  }

  #admit(p: WritePacket, block: WireBlock): boolean {
    // A write that names no QP is the device's own (an atomic reading into its QP's scratch
    // buffer): only this node's engine posts one, and with no key. Another node's never lands.
    if (p.qpn === undefined) return p.src === this.node && p.key === undefined;
    const qp = this.tables.qp(p.qpn);
    return qp !== undefined && qp.accepts(p.src, p.key, block.va, block.length, p.pd);
  }
}
