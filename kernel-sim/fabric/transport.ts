// What a node needs from the network: send a packet to another node and be handed the
// packets sent to it. Fabric is the in-process implementation; a transport between
// processes or hosts implements the same interface, and no node holds anything of another.
import type { Packet, WritePacket } from './packets.js';

/** What carries packets between nodes: the in-process Fabric, or LibfabricTransport between processes. */
export interface Transport {
  /** Attach a node: packets for it are handed to `handler` (on a later turn, never inside the sender). */
  attach(node: number, handler: (p: Packet) => void): void;
  /** True if the transport reaches `node`. */
  hasNode(node: number): boolean;
  /**
   * Modelled transmission of `bytes` from `src` to `dst` starting no earlier than `atUs`:
   * the link serialises the payload, the packet arrives one latency later. Returns the
   * arrival time (µs).
   */
  transmit(src: number, dst: number, bytes: number, atUs: number): number;
  /** When the link from `src` to `dst` is next free (modelled µs): what a sender plans a run of packets with. */
  linkFreeAt(src: number, dst: number): number;
  /** Hand a packet whose arrival time is already modelled to its destination node. */
  deliver(p: Packet): void;
  /** Model the transmission of a packet sent at `atUs` and deliver it; returns it with its arrival time. */
  send<P extends Packet>(p: Omit<P, 'arrivesAt'>, atUs: number, payloadBytes?: number): P;
  /** A transport between processes: whether `node` is hosted here (absent: every node is). */
  isLocal?(node: number): boolean;
  /**
   * A transport between processes: a write received here whose answer is no packet (a response,
   * which nothing ACKs; a READ or an atomic request, which its response answers) was handled:
   * its staged bytes may serve the next write (an ACK going out frees the others').
   */
  placed?(p: WritePacket): void;
  /** A transport between processes: hear when a peer node goes away, so what waits on it ends. */
  onPeerLost?(listener: (node: number) => void): void;
}
