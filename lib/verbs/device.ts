// One RDMA device (rdma_rxe's rxe_dev) per simulated node: its object tables and the node it
// drives through the SimNode surface. Every packet for its QPs is checked and carried out by
// the node's engine against the node's own tables (SimNode.tables), where the device keeps
// the records of its MRs and QPs; nothing comes up to the verbs but completions.
import type { CostModel, RcEvent, RcMr, RcQp, SimNode } from '../../kernel-sim/index.js';
import type { Region } from '../region.js';
import type { DeviceTables } from './tables.js';

/** What the device needs of a QP of its own. */
export interface Endpoint {
  /** What the node's engine responder reads of the QP. */
  readonly rc: RcQp;
  /** The device moved the QP to ERR on its own (the provider's side of ERR follows). */
  deviceError?(): void;
}

/** What the device needs of an SRQ of its own. */
export interface SrqEndpoint {
  /** The device raised SRQ_LIMIT_REACHED for it. */
  limitReached(): void;
}

/** What the provider keeps of an MR of its own: its device record, and where its range lies (for its own SGEs). */
export interface KeyedMr {
  /** The MR's record in the node's tables (what the engine reads). */
  readonly rc: RcMr;
  resolve(addr: bigint, length: number): { region: Region; offset: number } | undefined;
}

export class Device {
  readonly node: number;
  readonly sim: SimNode;
  readonly costs: CostModel;
  readonly tables: DeviceTables<KeyedMr, Endpoint, SrqEndpoint>;

  constructor(sim: SimNode, costs: CostModel, tables: DeviceTables<KeyedMr, Endpoint, SrqEndpoint>) {
    this.node = sim.id;
    this.sim = sim;
    this.costs = costs;
    this.tables = tables;
    // A packet naming no QP lands only from this node's own engine from now on.
    sim.tables.strict = true;
    // The node's event line (async events): each names the object by its handle in the tables.
    sim.tables.events = (e) => this.#event(e);
  }

  #event(e: RcEvent): void {
    if (e.type === 'srq-limit') this.tables.srq(e.handle)?.limitReached();
    else this.tables.qp(e.handle)?.deviceError?.();
  }
}
