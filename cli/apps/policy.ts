// How a kernel's buffers are had: pinned, an ODP fault library policy, or remote-paged (EDM's
// DM-Handler), and a rank's remote-paged memory. Under `remote` a rank's buffers are regions of
// RemotePagers whose pages live on a `pagefault-rdma memory-server`. A pager's DM-Handler thread
// takes 0.1–0.3 s to start here, so a rank's pagers are made once and reused by its later
// trials, zeroed in between (a fresh buffer reads zeros, as kv's store relies on).
import { PAGE_SIZE, RemotePager, type PfrError, type PolicyName } from '../../lib/index.js';
import { TABLE_POLICIES } from '../programs/odp-vs-pinned.js';

// Bytes zeroed between turns of the event loop: 64 pages, each a fetch at worst (~1 ms loaded).
const ZERO_SLICE = 64 * PAGE_SIZE;

/** How a kernel's buffers are had: pinned, an ODP fault library policy, or remote-paged. */
export type AppPolicy = PolicyName | 'remote';

/** Every policy of `app`, in the order it runs them. */
export const APP_POLICIES: readonly AppPolicy[] = [...TABLE_POLICIES, 'remote'];

/** The fault library's policy of remote-paged buffers: a fault fetches the rest of the transfer at once. */
export const REMOTE_ODP: PolicyName = 'touch-ahead';

/** A rank's remote-paged memory: pagers on one memory server, kept for the run, reused by its trials. */
export class RemoteMemory {
  #free = new Map<string, RemotePager[]>();
  #all: RemotePager[] = [];
  #error: PfrError | undefined;

  /**
   * @param socket the memory server's Unix socket
   * @param prefix the keys' prefix of this rank's pagers (each pager adds an instance id of its own)
   */
  constructor(
    readonly socket: string,
    readonly prefix: string,
  ) {}

  /** A pager of `bytes` that keeps at most `residentLimit` bytes resident (default: all): one left by an earlier trial, or a new one. */
  async take(bytes: number, residentLimit = bytes): Promise<RemotePager> {
    this.check();
    const reuse = this.#free.get(`${bytes}/${residentLimit}`)?.pop();
    if (reuse) return reuse;
    const pager = await RemotePager.create({
      size: bytes,
      ...(residentLimit < bytes ? { residentLimit } : {}),
      store: { server: { socket: this.socket, prefix: this.prefix } },
    });
    // A store failure is also an error completion or SIGBUS where it struck; the trial checks for it too.
    pager.on('error', (e) => (this.#error ??= e));
    this.#all.push(pager);
    return pager;
  }

  /**
   * Give `pager` back for a later trial, zeroed: its stored pages come back to be zeroed, a
   * fetch each, in slices between which the event loop turns (a job's transport must be heard
   * from, or its peers count this rank lost).
   */
  async give(pager: RemotePager, residentLimit = pager.region.size): Promise<void> {
    const bytes = new Uint8Array(pager.region.buffer);
    for (let at = 0; at < bytes.length; at += ZERO_SLICE) {
      // After a store failure its pages may be poisoned (a CPU access: SIGBUS): close() takes it, nothing reuses it.
      if (this.#error) return;
      bytes.fill(0, at, at + ZERO_SLICE);
      await new Promise((resolve) => setImmediate(resolve));
    }
    const key = `${pager.region.size}/${residentLimit}`;
    this.#free.set(key, [...(this.#free.get(key) ?? []), pager]);
  }

  /** Pages read from the memory server by all this rank's pagers so far (faulting and read ahead). */
  pagesFetched(): number {
    return this.#all.reduce((n, p) => n + p.stats().pagesFetched, 0);
  }

  /** Throw the first store failure any pager reported. */
  check(): void {
    if (this.#error) throw this.#error;
  }

  /** Close every pager (its keys deleted from the server). */
  async close(): Promise<void> {
    await Promise.all(this.#all.map((p) => p.close()));
    this.#all = [];
    this.#free.clear();
  }
}
