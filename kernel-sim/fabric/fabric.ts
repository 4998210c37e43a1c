// The fabric: nodes joined by links with latency and bandwidth (modelled time), the
// in-process Transport. Delivery is real (the destination node's handler runs on a later
// turn) and the arrival time is modelled. Packets stay objects here, but each is checked
// against the wire layout's ranges (packet-layout.ts checkPacket) before it is handed over, as a
// frame from another process is when it is decoded: one protocol, one set of checks (about
// 50 ns a packet).
import { type CostModel, ModelResource } from '../cost-model/index.js';
import { checkPacket } from './packet-layout.js';
import type { Packet } from './packets.js';
import type { Transport } from './transport.js';

interface Link {
  src: number;
  dst: number;
  resource: ModelResource;
  packets: number;
  bytes: number;
}

/** A link's model: the payload is serialised after the link is free, and arrives one latency later. */
export function linkArrival(costs: CostModel, linkFreeAt: number, bytes: number, atUs: number): { freeAt: number; arrive: number } {
  const freeAt = Math.max(atUs, linkFreeAt) + bytes / costs.linkBytesPerUs;
  return { freeAt, arrive: freeAt + costs.linkLatencyUs };
}

/** The in-process transport: links between nodes with modelled latency and bandwidth; packets are handed over in memory. */
export class Fabric implements Transport {
  /** The cost model the links use. */
  readonly costs: CostModel;
  // Keyed by src × 2^20 + dst: a number, not a string built per block.
  #links = new Map<number, Link>();
  #handlers = new Map<number, (p: Packet) => void>();
  #refused = 0;

  constructor(costs: CostModel) {
    this.costs = costs;
  }

  /** Attach a node; every pair of nodes gets a link in each direction. */
  attach(node: number, handler: (p: Packet) => void): void {
    this.#handlers.set(node, handler);
  }

  /** The older name of attach. */
  addNode(node: number, handler: (p: Packet) => void): void {
    this.attach(node, handler);
  }

  /** True if a node is attached. */
  hasNode(node: number): boolean {
    return this.#handlers.has(node);
  }

  transmit(src: number, dst: number, bytes: number, atUs: number): number {
    const link = this.#link(src, dst);
    link.packets++;
    link.bytes += bytes;
    const sent = link.resource.reserve(atUs, bytes / this.costs.linkBytesPerUs);
    return sent + this.costs.linkLatencyUs;
  }

  linkFreeAt(src: number, dst: number): number {
    return this.#link(src, dst).resource.freeAt;
  }

  deliver(p: Packet): void {
    checkPacket(p);
    this.deliverDecoded(p);
  }

  /**
   * Hand over a packet decoded from the wire: decodeFrame has checked every field already
   * (the same checks as checkPacket, each modelled time's finiteness too), so not again.
   */
  deliverDecoded(p: Packet): void {
    const handler = this.#handlers.get(p.dst);
    if (!handler) throw new RangeError(`fabric: unknown node ${p.dst}`);
    queueMicrotask(() => {
      // Nothing a node's handler throws may escape into the microtask queue (it would end the
      // process): the packet is refused and counted, as a frame that fails its checks is.
      try {
        handler(p);
      } catch {
        this.#refused++;
      }
    });
  }

  /** Packets whose destination's handler threw (refused, never escaping into a microtask). */
  get refused(): number {
    return this.#refused;
  }

  send<P extends Packet>(p: Omit<P, 'arrivesAt'>, atUs: number, payloadBytes = 0): P {
    if (!this.#handlers.has(p.dst)) throw new RangeError(`fabric: unknown node ${p.dst}`);
    const packet = { ...p, arrivesAt: this.transmit(p.src, p.dst, payloadBytes, atUs) } as P;
    this.deliver(packet);
    return packet;
  }

  /** Packets and bytes sent per directed link. */
  stats(): Array<{
    /** Sending node. */
    src: number;
    /** Receiving node. */
    dst: number;
    /** Packets sent. */
    packets: number;
    /** Bytes sent. */
    bytes: number;
  }> {
    return [...this.#links.values()].map((l) => ({ src: l.src, dst: l.dst, packets: l.packets, bytes: l.bytes }));
  }

  #link(src: number, dst: number): Link {
    const k = src * 2 ** 20 + dst;
    let l = this.#links.get(k);
    if (!l) {
      l = { src, dst, resource: new ModelResource(), packets: 0, bytes: 0 };
      this.#links.set(k, l);
    }
    return l;
  }
}
