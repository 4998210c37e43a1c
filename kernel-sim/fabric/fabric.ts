// The fabric: nodes joined by links with latency and bandwidth (modelled time). Packets
// carry the protection domain, the destination VA, tid and seq as ExaNet's do; ACKs carry
// a 4-bit resp. Delivery is real (a handler on the destination node runs) and the arrival
// time is modelled.
import { type CostModel, ModelResource } from '../cost-model/index.js';

/** The ACK's 4-bit resp field. */
export enum AckResp {
  OK = 0,
  /** Translation fault at the destination: retransmit later (like InfiniBand's RNR NAK). */
  FAULT = 1,
  /** The destination has no stream for this protection domain. */
  PD_ERR = 2,
  /** The destination refused the access (permission). */
  ACCESS_ERR = 3,
  /** The destination VA is in no region of that protection domain. */
  ADDR_ERR = 4,
  /** The destination's fault library resolved the fault: retransmit now. */
  RESOLVED = 5,
  /** The destination's fault library could not resolve the fault. */
  UNRESOLVED = 6,
  /** The destination aborted a stalled access (CMD_RESUME ABORT / TERM). */
  ABORTED = 7,
}

export type PacketType = 'write' | 'ack';

export interface Packet {
  type: PacketType;
  src: number;
  dst: number;
  /** Protection-domain id (16 bits in ExaNet headers). */
  pd: number;
  /** Destination virtual address (write) or the VA the ACK refers to. */
  va: bigint;
  /** Transfer id and block sequence number. */
  tid: number;
  seq: number;
  length: number;
  resp: AckResp;
  /** Modelled arrival time (µs). */
  arrivesAt: number;
}

interface Link {
  resource: ModelResource;
  packets: number;
  bytes: number;
}

export class Fabric {
  readonly costs: CostModel;
  #nodes = new Set<number>();
  #links = new Map<string, Link>();
  #handlers = new Map<number, (p: Packet) => void>();

  constructor(costs: CostModel) {
    this.costs = costs;
  }

  /** Attach a node; every pair of nodes gets a link in each direction. */
  addNode(node: number, handler: (p: Packet) => void): void {
    this.#nodes.add(node);
    this.#handlers.set(node, handler);
  }

  hasNode(node: number): boolean {
    return this.#nodes.has(node);
  }

  /**
   * Modelled transmission: the link serialises the payload after `atUs`, the packet arrives
   * one latency later. Returns the arrival time; delivery to the destination's handler is
   * left to `deliver` (the caller decides when real work happens).
   */
  transmit(src: number, dst: number, bytes: number, atUs: number): number {
    const link = this.#link(src, dst);
    link.packets++;
    link.bytes += bytes;
    const sent = link.resource.reserve(atUs, bytes / this.costs.linkBytesPerUs);
    return sent + this.costs.linkLatencyUs;
  }

  /** Send a packet: modelled transmission plus real delivery on the next turn. */
  send(p: Omit<Packet, 'arrivesAt'>, atUs: number, payloadBytes = 0): Packet {
    if (!this.#nodes.has(p.dst)) throw new RangeError(`fabric: unknown node ${p.dst}`);
    const packet: Packet = { ...p, arrivesAt: this.transmit(p.src, p.dst, payloadBytes, atUs) };
    const handler = this.#handlers.get(p.dst)!;
    queueMicrotask(() => handler(packet));
    return packet;
  }

  stats(): Array<{ src: number; dst: number; packets: number; bytes: number }> {
    return [...this.#links].map(([k, l]) => {
      const [src, dst] = k.split('>').map(Number) as [number, number];
      return { src, dst, packets: l.packets, bytes: l.bytes };
    });
  }

  #link(src: number, dst: number): Link {
    const k = `${src}>${dst}`;
    let l = this.#links.get(k);
    if (!l) {
      l = { resource: new ModelResource(), packets: 0, bytes: 0 };
      this.#links.set(k, l);
    }
    return l;
  }
}
