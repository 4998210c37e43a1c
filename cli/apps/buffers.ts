// The RDMA buffers of one rank's trial, by policy. Under pin and the ODP policies they are shared
// mappings, fresh each trial, registered whole (pinned or on demand); evicting them between
// steps drops their page-table entries but keeps their bytes (unmapPages on memfd memory).
// Under `remote` they are remote-paged (EDM's DM-Handler): regions of RemotePagers whose pages
// live on a `pagefault-rdma memory-server`, registered on demand (touch-ahead). Before every
// step their pages are written to the server and dropped, so every page a step touches comes
// back from the server: a DMA fault's resolution fetches it (a major fault), and so does a CPU
// access of the kernel's own thread. A page the server cannot give back fails loudly: an error
// completion for a DMA (the kernel's wait throws), SIGBUS for a CPU access, never zeros.
// A rank's pagers are its RemoteMemory's (policy.ts), reused by its later trials.
import { PfrError, RemotePager, mapRegion, type MemoryRegion, type Region } from '../../lib/index.js';
import { registerFor, type World } from './world.js';
import type { AppPolicy } from './policy.js';

/** One registered buffer of a trial. */
export interface TrialBuffer {
  region: Region;
  mr: MemoryRegion;
}

/** What `TrialBuffers.map` may be told. */
export interface MapBufferOptions {
  /** Register only the first `registerBytes` (kv's pinned shard); default all. */
  registerBytes?: number;
  /** Remote paging: the most the buffer keeps resident (kv's store: what a pinned server may lock); default all. */
  residentLimit?: number;
}

/** A rank's buffers of one trial under one policy: map them, evict them before a step, release them at its end. */
export class TrialBuffers {
  #held: Array<TrialBuffer & { pager?: RemotePager; residentLimit?: number }> = [];

  constructor(
    private readonly w: World,
    private readonly policy: AppPolicy,
    private readonly evictEachStep: boolean,
  ) {
    if (policy === 'remote' && !w.remote)
      throw new PfrError(
        'ERR_PFR_STORE_UNAVAILABLE',
        `rank ${w.rank}: the remote policy needs a memory server (World.remote; the app command starts one)`,
      );
  }

  /** A buffer of `bytes` (a whole number of pages), registered under the trial's policy. */
  async map(bytes: number, o: MapBufferOptions = {}): Promise<TrialBuffer> {
    const length = o.registerBytes ?? bytes;
    if (this.policy === 'remote') {
      const limit = Math.min(bytes, o.residentLimit ?? bytes);
      const pager = await this.w.remote!.take(bytes, limit);
      const b = { region: pager.region, mr: registerFor(this.w, pager.region, 'remote', length), pager, residentLimit: limit };
      this.#held.push(b);
      return b;
    }
    const region = mapRegion(bytes, { shared: true });
    try {
      const b = { region, mr: registerFor(this.w, region, this.policy, length) };
      this.#held.push(b);
      return b;
    } catch (e) {
      region.close();
      throw e;
    }
  }

  /** Before a step: remote pages go to the server (always); with --evict-each-step, ODP buffers lose their page-table entries. */
  async evict(): Promise<void> {
    if (this.policy === 'remote') {
      await Promise.all(this.#held.map((b) => b.pager!.evict()));
      this.w.remote!.check();
    } else if (this.evictEachStep && this.policy !== 'pin') for (const b of this.#held) b.region.unmapPages();
  }

  /** Deregister and unmap (remote: give the pagers back, zeroed). */
  async release(): Promise<void> {
    for (const b of this.#held.splice(0)) {
      b.mr.dereg();
      if (b.pager) await this.w.remote!.give(b.pager, b.residentLimit);
      else b.region.close();
    }
  }
}
