// The native toucher: a thread of the addon's own (never the JS thread, never the libuv
// pool) that reads or writes a range page by page and reports what it saw. Its faults
// are genuine faults of a non-JS thread, like those of a DMA engine's copy thread.
import { binding, TouchMode } from '../native/index.js';
import { PfrError } from './errors.js';
import type { Region } from './region.js';
import { checkBool, checkInt, checkObject, invalidArg, known } from './validate.js';

/** What `touch()` walks and how. */
export interface TouchOptions {
  /** Byte offset into the region where the walk starts (default 0). */
  offset?: number;
  /** Bytes to walk (default: to the end of the region). */
  length?: number;
  /** 'read' (default): copy the bytes out; 'write': fill every byte with `fill`. */
  access?: 'read' | 'write';
  /** Touch one byte per page instead of every byte (cheapest way to fault each page). */
  probe?: boolean;
  /** Byte written by 'write' (default 0xA5). */
  fill?: number;
  /** Record the time spent on each page (ns). */
  timings?: boolean;
}

/** What a `touch()` walk did. */
export interface TouchResult {
  /** Kernel thread id of the toucher thread (the faulting thread). */
  threadId: number;
  /** Pages walked. */
  pages: number;
  /** Wall time of the whole walk in ns. */
  ns: number;
  /** 'read' without probe: the bytes read. */
  data?: Buffer;
  /** Probe reads: the sum of the first byte of every page. */
  checksum: number;
  /** With timings: ns spent on each page. */
  pageNs?: Float64Array;
}

/** The error of a touch whose access to some pages raised SIGBUS (code ERR_PFR_ACCESS_FAILED). */
export interface AccessFailedError extends PfrError {
  /** The signal the access raised. */
  signal: 'SIGBUS';
  /** Region offsets of the pages whose access failed. */
  offsets: number[];
  /** What the walk saw of the other pages (failed pages read as zeros). */
  result: TouchResult;
}

/**
 * Read or write a range of `region` from a native thread; resolves when the walk is done.
 * A page whose access raises SIGBUS (poisoned with UFFDIO_POISON, or missing under a
 * userfaultfd opened with the SIGBUS feature) does not kill the process: the walk goes on
 * and the promise rejects with ERR_PFR_ACCESS_FAILED naming the pages.
 */
export async function touch(region: Region, options?: TouchOptions): Promise<TouchResult> {
  const opts = checkObject(
    'touch: options',
    options,
    known<TouchOptions>({ offset: true, length: true, access: true, probe: true, fill: true, timings: true }),
  );
  const s = region.span('touch', opts.offset as number | undefined, opts.length as number | undefined);
  const access = opts.access ?? 'read';
  if (access !== 'read' && access !== 'write') throw invalidArg(`touch: options.access must be 'read' or 'write', got ${String(access)}`);
  const probe = checkBool('touch: options.probe', opts.probe, false);
  const fill = opts.fill === undefined ? 0xa5 : checkInt('touch: options.fill', opts.fill, 0, 255);
  const timings = checkBool('touch: options.timings', opts.timings, false);
  const mode = access === 'read' ? (probe ? TouchMode.ProbeRead : TouchMode.ReadCopy) : probe ? TouchMode.ProbeWrite : TouchMode.WriteFill;
  const r = await binding.touch(region.id, s.offset, s.length, mode, fill, timings);
  const out: TouchResult = { threadId: r.tid, pages: r.pages, ns: r.ns, checksum: r.checksum };
  if (r.data) out.data = r.data;
  if (r.pageNs) out.pageNs = r.pageNs;
  if (r.failed) {
    const offsets = Array.from(r.failed);
    const err = new PfrError(
      'ERR_PFR_ACCESS_FAILED',
      `touch: the access to ${offsets.length} page(s) failed with SIGBUS (first at offset ${offsets[0]}): ` +
        'the page is poisoned (UFFDIO_POISON) or missing under a userfaultfd opened with the SIGBUS feature',
    );
    throw Object.assign(err, { signal: 'SIGBUS' as const, offsets, result: out });
  }
  return out;
}
