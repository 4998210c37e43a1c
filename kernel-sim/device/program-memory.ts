// A program's memory as the device sees it (docs/device-abi.md §5). Each MR is a foreign
// region of the addon's table (native/foreign.cc): the SMMU's walks (pageRun, pagemap) read the
// program's own page tables, the copy engine moves its bytes with process_vm_readv/writev, and
// the region satisfies MemoryLike, so the engine's translate and copy take it as they take a
// local region. A page that is not there is the thesis's fault: resolve() asks the program's
// fault thread (over the fault socket the provider passed at GET_CONTEXT) to make the pages
// resident, and waits for its answer, with a timeout.
import { constants } from 'node:os';
import { binding } from '../../native/index.js';
import type { MemoryLike, MemoryObserver } from '../memory.js';
import { ABI_VERSION, FAULT_MAGIC, FAULT_WRITE, FaultMethod, FaultOp, faultRequest, faultResponse } from './abi.js';
import { SeqpacketConnection, type Datagram } from './seqpacket.js';

const PAGE = 4096;
const E = constants.errno;

/** The device's counters of the fault protocol (struct pfr_device_stats' fault fields). */
export interface FaultCounters {
  raised: number;
  resolved: number;
  failed: number;
  /** Answers that broke the protocol (wrong size, magic, op, or an unknown fault id). */
  refused: number;
}

/** Another process's memory as a region: pages and bytes reached through the kernel, never mapped here. */
export class ForeignRegion implements MemoryLike {
  readonly id: number;
  readonly address: bigint;
  readonly size: number;
  readonly pageSize = PAGE;
  readonly granule = PAGE;
  #closed = false;
  readonly #observers = new Set<MemoryObserver>();

  constructor(pid: number, address: bigint, size: number) {
    this.id = binding.foreignRegion(pid, address, size);
    this.address = address;
    this.size = size;
  }

  get closed(): boolean {
    return this.#closed;
  }

  observe(o: MemoryObserver): void {
    this.#observers.add(o);
  }

  unobserve(o: MemoryObserver): void {
    this.#observers.delete(o);
  }

  /** The offset of the first page of [offset, offset+length) without a present entry in the program's page table, or -1. */
  firstAbsent(offset: number, length: number): number {
    const first = Math.floor(offset / PAGE) * PAGE;
    const pages = Math.ceil((offset + length - first) / PAGE);
    const at = binding.pageRun(this.id, first, pages, PAGE, 0, new Float64Array(0));
    return at < 0 ? -1 : first + at * PAGE;
  }

  /** The region goes (its MR was deregistered, its program went away). Idempotent. */
  close(): void {
    if (this.#closed) return;
    for (const o of [...this.#observers]) o.regionClosing(this);
    this.#closed = true;
    binding.closeRegion(this.id);
  }
}

/** How a fault ended: the program's answer, or why there was none. */
export interface FaultAnswer {
  /** 0, or the -errno the fault thread answered (or -ETIMEDOUT, -EPIPE: no answer). */
  status: number;
  pages: number;
  ns: number;
}

interface Pending {
  resolve(a: FaultAnswer): void;
  timer: NodeJS.Timeout;
}

/** The MRs' foreign regions of one program and its fault thread. */
export class ProgramMemory {
  readonly pid: number;
  readonly counters: FaultCounters;
  /** The fault socket's descriptor (the connection's own). */
  readonly faultFd: number;
  readonly #fault: SeqpacketConnection;
  readonly #regions = new Map<number, ForeignRegion>();
  readonly #pending = new Map<bigint, Pending>();
  #next = 1n;
  #closed = false;

  constructor(pid: number, faultFd: number, counters: FaultCounters = { raised: 0, resolved: 0, failed: 0, refused: 0 }) {
    this.pid = pid;
    this.counters = counters;
    this.faultFd = faultFd;
    this.#fault = SeqpacketConnection.adopt(faultFd);
    this.#fault.listen({ message: (d) => this.#answer(d), close: () => this.#lost() });
  }

  /** The foreign region of MR `handle` over [start, start+length) of the program, page-aligned outward (made once). */
  region(handle: number, start: bigint, length: bigint): ForeignRegion {
    let r = this.#regions.get(handle);
    if (!r) {
      const base = (start / BigInt(PAGE)) * BigInt(PAGE);
      const end = ((start + length + BigInt(PAGE - 1)) / BigInt(PAGE)) * BigInt(PAGE);
      r = new ForeignRegion(this.pid, base, Number(end - base));
      this.#regions.set(handle, r);
    }
    return r;
  }

  /** MR `handle` is gone: its region too. */
  forget(handle: number): void {
    this.#regions.get(handle)?.close();
    this.#regions.delete(handle);
  }

  /**
   * Ask the program's fault thread to make [address, address+length) of MR `mrHandle` resident
   * (whole pages), writable if `write`, by `method`; the answer, or -ETIMEDOUT after `timeoutMs`.
   */
  resolve(mrHandle: number, address: bigint, length: number, write: boolean, method: FaultMethod, timeoutMs = 5000): Promise<FaultAnswer> {
    if (this.#closed || this.#fault.closed) {
      this.counters.failed++; // the program is gone: nothing can make its pages resident
      return Promise.resolve({ status: -E.EPIPE, pages: 0, ns: 0 });
    }
    const id = this.#next++;
    const bytes = new Uint8Array(faultRequest.size);
    const v = new DataView(bytes.buffer);
    const o = faultRequest.offsets(['magic', 'abi_version', 'op', 'fault_id', 'addr', 'length', 'mr_handle', 'flags', 'method'] as const);
    const first = (address / BigInt(PAGE)) * BigInt(PAGE);
    const end = ((address + BigInt(length) + BigInt(PAGE - 1)) / BigInt(PAGE)) * BigInt(PAGE);
    v.setUint32(o.magic, FAULT_MAGIC, true);
    v.setUint16(o.abi_version, ABI_VERSION, true);
    v.setUint16(o.op, FaultOp.REQUEST, true);
    v.setBigUint64(o.fault_id, id, true);
    v.setBigUint64(o.addr, first, true);
    v.setBigUint64(o.length, end - first, true);
    v.setUint32(o.mr_handle, mrHandle, true);
    v.setUint32(o.flags, write ? FAULT_WRITE : 0, true);
    v.setUint32(o.method, method, true);
    this.counters.raised++;
    return new Promise((resolve) => {
      const timer = setTimeout(() => this.#settle(id, { status: -E.ETIMEDOUT, pages: 0, ns: 0 }), timeoutMs);
      this.#pending.set(id, { resolve, timer });
      let sent: boolean;
      try {
        sent = this.#fault.send(bytes);
      } catch {
        // The program's end is gone (EPIPE): nothing will answer.
        this.#settle(id, { status: -E.EPIPE, pages: 0, ns: 0 });
        return;
      }
      if (!sent) this.#settle(id, { status: -E.EAGAIN, pages: 0, ns: 0 });
    });
  }

  #settle(id: bigint, a: FaultAnswer): void {
    const p = this.#pending.get(id);
    if (!p) return;
    this.#pending.delete(id);
    clearTimeout(p.timer);
    if (a.status === 0) this.counters.resolved++;
    else this.counters.failed++;
    p.resolve(a);
  }

  // The fault thread's answer, checked like any message from a peer.
  #answer(d: Datagram): void {
    for (const fd of d.fds) binding.fdClose(fd);
    const b = d.bytes;
    const v = new DataView(b.buffer, b.byteOffset, b.byteLength);
    const o = faultResponse.offsets(['magic', 'abi_version', 'op', 'fault_id', 'status', 'pages', 'ns'] as const);
    const ok =
      !d.truncated &&
      b.byteLength === faultResponse.size &&
      v.getUint32(o.magic, true) === FAULT_MAGIC &&
      v.getUint16(o.abi_version, true) === ABI_VERSION &&
      v.getUint16(o.op, true) === FaultOp.RESOLVED &&
      v.getInt32(o.status, true) <= 0 &&
      this.#pending.has(v.getBigUint64(o.fault_id, true));
    if (!ok) {
      this.counters.refused++;
      return;
    }
    this.#settle(v.getBigUint64(o.fault_id, true), {
      status: v.getInt32(o.status, true),
      pages: v.getUint32(o.pages, true),
      ns: Number(v.getBigUint64(o.ns, true)),
    });
  }

  // The fault socket closed: the program (or its provider) is gone; nothing will answer.
  #lost(): void {
    for (const id of [...this.#pending.keys()]) this.#settle(id, { status: -E.EPIPE, pages: 0, ns: 0 });
  }

  /** Every region closed, every wait answered -EPIPE, the fault socket closed. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#lost();
    for (const r of this.#regions.values()) r.close();
    this.#regions.clear();
    this.#fault.close();
  }
}
