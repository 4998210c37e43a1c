// Pinning does not prevent faults (the thesis's motivation: THP). A buffer pinned with mlock
// (regMr without ON_DEMAND) is still moved by the kernel: MADV_COLLAPSE, like khugepaged,
// migrates its 4 KiB pages into transparent huge pages and every physical frame changes, while
// the mlock stays. The SMMU of the destination node cached the frames of the pinned MR at its
// first write (what an engine that pinned at registration holds); the MMU-notifier role
// (Region.collapse -> Smmu.regionMoved) re-walks them and drops the stale ones, so the next
// write re-translates. Frame numbers need CAP_SYS_ADMIN: as another user the program says so
// and shows residency only.
import { readFileSync } from 'node:fs';
import {
  Access,
  HUGE_PAGE_SIZE,
  mapRegion,
  PAGE_SIZE,
  PageCategory,
  SendFlags,
  WcStatus,
  WrOpcode,
  type MemoryRegion,
  type Region,
} from '../../lib/index.js';
import type { MoveReport } from '../../kernel-sim/index.js';
import { print, sizeName } from './support/format.js';
import { connectedPair, type Pair } from './support/pair.js';
import { liveLine } from './support/progress.js';
import { lockedBytes } from './support/smaps.js';
import type { TraceFile } from './support/trace-file.js';

export interface PinningMovesOptions {
  /** Buffer size, a multiple of 2 MiB (default 4 MiB). */
  size?: number;
  /** Seconds to leave khugepaged to collapse a second pinned buffer (0: skip; default 15). */
  khugepagedWaitS?: number;
  /** Where to put the trace of both processes (--trace): the source's faults and the writes' steps. */
  trace?: TraceFile;
}

/** One RDMA WRITE into the buffer and whether it holds the bytes afterwards. */
export interface WriteCheck {
  via: 'pinned MR' | 'ODP MR';
  /** Before or after the collapse. */
  when: 'before' | 'after';
  status: string;
  bytesOk: boolean;
  /** Pages the destination SMMU walked for it (re-translations). */
  pagesWalked: number;
}

export interface PinningMovesResult {
  size: number;
  pages: number;
  uid: number;
  /** False without CAP_SYS_ADMIN: frames read 0 and only residency is shown. */
  framesVisible: boolean;
  framesHidden?: string;
  /** Pages whose frame changed between the first read (before pinning) and the read after pinning (null when hidden). */
  framesMovedByPin: number | null;
  /** Pages whose frame changed in the collapse (null when frames are hidden). */
  framesMoved: number | null;
  residentBefore: number;
  residentAfter: number;
  mappedAfter: number;
  hugeBytesBefore: number;
  hugeBytesAfter: number;
  lockedBytesBefore: number;
  lockedBytesAfter: number;
  contentsKept: boolean;
  /** What the destination SMMU held for the pinned MR and what the MMU-notifier role did. */
  iotlb: {
    cachedBefore: number;
    checked: number;
    stale: number;
    framesKnown: boolean;
    /** Cached frames that no longer belong to the buffer: where a pinning-only engine would DMA. */
    oldFramesNotOwned: number | null;
  };
  pinningOnlyEngine: string;
  writes: WriteCheck[];
  khugepaged: KhugepagedReport;
}

export interface KhugepagedReport {
  thp: string;
  scanSleepMs: number | null;
  waitedS: number;
  /** Full scans khugepaged finished and pages it collapsed (system-wide) while we waited. */
  fullScans: number | null;
  pagesCollapsed: number | null;
  /** Whether the buffer was left as 4 KiB pages in a THP-eligible range for khugepaged. */
  setUp: boolean;
  hugeBytes: number;
  framesMoved: number | null;
  lockedBytes: number;
  note: string;
}

const ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE;

export async function pinningMoves(options: PinningMovesOptions = {}): Promise<PinningMovesResult> {
  const size = options.size ?? 4 * 2 ** 20;
  if (size % HUGE_PAGE_SIZE !== 0) throw new RangeError(`pinningMoves: size (${size}) must be a multiple of 2 MiB`);
  const pages = size / PAGE_SIZE;
  const pair = connectedPair({ trace: options.trace?.option ?? false });
  const src = mapRegion(size);
  const dst = mapRegion(size);
  const moves: MoveReport[] = [];
  const dstSmmu = pair.cluster.system.node(1).smmu;
  dstSmmu.onTranslationsMoved((m) => moves.push(m));
  try {
    // The source is ODP (it is not the point, and it keeps the pinned bytes within a small RLIMIT_MEMLOCK).
    const s = pair.ctx[0].regMr(pair.pd[0], src, 0, size, ACCESS | Access.ON_DEMAND);
    fill(dst, 1);
    const unpinned = dst.frames(); // the frames as the program found them, before it pins
    const pinned = pair.ctx[1].regMr(pair.pd[1], dst, 0, size, ACCESS); // mlock: every page resident and locked
    const writes: WriteCheck[] = [];
    // The first write through the pinned MR: the destination SMMU walks and caches every frame.
    writes.push(await write(pair, src, s, dst, pinned, 2, 'pinned MR', 'before'));
    const range = (): ReturnType<typeof dstSmmu.iotlb.entriesIn> => dstSmmu.iotlb.entriesIn(dst.address, size);
    const cachedBefore = range().length;
    const before = dst.frames();
    const huge = (): number => dst.pagemapScan({ all: PageCategory.HUGE | PageCategory.PRESENT }).reduce((n, r) => n + r.length, 0);
    const residentBefore = dst.residentPages();
    const hugeBytesBefore = huge();
    const lockedBytesBefore = lockedBytes(dst.address, size);
    const kept = Buffer.from(dst.buffer).subarray(0);
    const copy = Buffer.from(kept);

    await collapse(dst); // MADV_COLLAPSE: what khugepaged does later, now

    const after = dst.frames();
    const framesVisible = unpinned.visible && before.visible && after.visible;
    const framesMovedByPin = framesVisible ? moved(unpinned.pfns, before.pfns) : null;
    const framesMoved = framesVisible ? moved(before.pfns, after.pfns) : null;
    const move = moves.find((m) => m.region === dst.id);
    const nowOwned = new Set(after.pfns);
    const oldFramesNotOwned = framesVisible && move ? move.stale.filter((e) => e.was > 0 && !nowOwned.has(e.was)).length : null;
    const result: PinningMovesResult = {
      size,
      pages,
      uid: process.getuid?.() ?? -1,
      framesVisible,
      framesMovedByPin,
      framesMoved,
      residentBefore,
      residentAfter: dst.residentPages(),
      mappedAfter: dst.mapped().reduce((n, x) => n + x, 0),
      hugeBytesBefore,
      hugeBytesAfter: huge(),
      lockedBytesBefore,
      lockedBytesAfter: lockedBytes(dst.address, size),
      contentsKept: Buffer.from(dst.buffer).equals(copy),
      iotlb: {
        cachedBefore,
        checked: move?.checked ?? 0,
        stale: move?.stale.length ?? 0,
        framesKnown: move?.framesKnown ?? framesVisible,
        oldFramesNotOwned,
      },
      pinningOnlyEngine: '',
      writes,
      khugepaged: noKhugepaged('', null),
    };
    if (!framesVisible) result.framesHidden = before.hidden ?? after.hidden ?? '';
    result.pinningOnlyEngine =
      oldFramesNotOwned !== null
        ? `an engine that pinned at registration and kept its ${cachedBefore} translations would DMA the next write into ` +
          `${oldFramesNotOwned} frames the buffer no longer owns (freed by the collapse, free for anyone): the bytes lost, ` +
          'other memory overwritten'
        : `frames are hidden here: an engine that kept its ${cachedBefore} translations would DMA into the frames it cached at ` +
          'registration, which the collapse replaced';

    // After the move: the pinned MR (the SMMU re-walks: the notifier dropped the stale entries)
    // and an ODP MR over the same buffer both land the bytes in the buffer's new frames.
    const odp = pair.ctx[1].regMr(pair.pd[1], dst, 0, size, ACCESS | Access.ON_DEMAND);
    writes.push(await write(pair, src, s, dst, odp, 3, 'ODP MR', 'after'));
    writes.push(await write(pair, src, s, dst, pinned, 4, 'pinned MR', 'after'));
    odp.dereg();
    pinned.dereg();
    s.dereg();
    options.trace?.addContexts(pair.ctx);
    result.khugepaged = await khugepaged(size, options.khugepagedWaitS ?? 15);
    report(result);
    return result;
  } finally {
    pair.cluster.close();
    src.close();
    dst.close();
  }
}

function report(r: PinningMovesResult): void {
  const n = r.pages;
  print(`A ${sizeName(r.size)} buffer (${n} pages of 4 KiB) on node 1, registered pinned (mlock), then MADV_COLLAPSE:`);
  if (r.framesVisible)
    print(`  physical frames (/proc/self/pagemap) changed: ${r.framesMovedByPin} of ${n} by pinning, then ${r.framesMoved} of ${n} by the collapse`);
  else print(`  physical frames: not shown (uid ${r.uid}): ${r.framesHidden}`);
  print(`  resident pages: ${r.residentBefore} before, ${r.residentAfter} after (${r.mappedAfter} mapped)`);
  print(`  in huge pages: ${sizeName(r.hugeBytesBefore || 0)} before, ${sizeName(r.hugeBytesAfter || 0)} after`);
  print(`  mlocked: ${sizeName(r.lockedBytesBefore || 0)} before, ${sizeName(r.lockedBytesAfter || 0)} after; contents kept: ${r.contentsKept}`);
  const t = r.iotlb;
  print(
    `Node 1's SMMU cached ${t.cachedBefore} translations of the pinned MR at its first write; on the collapse the ` +
      `MMU-notifier role re-walked ${t.checked} and dropped ${t.stale} whose frame ${t.framesKnown ? 'had changed' : 'it could not see (hidden)'}.`,
  );
  print(`Without that notifier, ${r.pinningOnlyEngine}.`);
  for (const w of r.writes)
    print(
      `  RDMA WRITE ${w.when} the collapse via the ${w.via}: ${w.status}, bytes ${w.bytesOk ? 'correct' : 'WRONG'}, node 1's SMMU walked ${w.pagesWalked} pages`,
    );
  const k = r.khugepaged;
  print(`khugepaged (THP ${k.thp}, scan every ${k.scanSleepMs ?? '?'} ms), reported, not asserted: ${k.note}`);
}

async function write(
  pair: Pair,
  src: Region,
  s: MemoryRegion,
  dst: Region,
  d: MemoryRegion,
  seed: number,
  via: WriteCheck['via'],
  when: WriteCheck['when'],
): Promise<WriteCheck> {
  fill(src, seed);
  const smmu = pair.cluster.system.node(1).smmu;
  const walked = smmu.counters().pagesWalked;
  pair.qp[0].postSend({
    wrId: seed,
    opcode: WrOpcode.RDMA_WRITE,
    sgList: [{ addr: s.addr, length: src.size, lkey: s.lkey }],
    sendFlags: SendFlags.SIGNALED,
    rdma: { remoteAddr: d.addr, rkey: d.rkey },
  });
  const wc = await pair.cq[0].next({ timeoutMs: 60_000 });
  return {
    via,
    when,
    status: wc.statusStr,
    bytesOk: wc.status === WcStatus.SUCCESS && Buffer.from(dst.buffer).equals(Buffer.from(src.buffer)),
    pagesWalked: smmu.counters().pagesWalked - walked,
  };
}

/** How many pages sit in another frame in `b` than in `a`. */
/**
 * MADV_COLLAPSE, tried again while the kernel says EAGAIN. That is transient: a page just
 * faulted in by a thread on another CPU can sit in that CPU's LRU batch, where the collapse
 * cannot isolate it, until the batch drains. Any other error, or EAGAIN after a second, is thrown.
 */
async function collapse(r: Region): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      return r.collapse();
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EAGAIN' || attempt === 50) throw err;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }
}

function moved(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let n = 0;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) n++;
  return n;
}

// Different bytes per write and per page, so a stale or misplaced page cannot pass.
function fill(r: Region, seed: number): void {
  const b = new Uint8Array(r.buffer);
  b.fill(0x40 + seed);
  for (let p = 0; p < b.length; p += PAGE_SIZE) b[p] = (p / PAGE_SIZE + seed) & 0xff;
}

function readSys(path: string): string {
  try {
    return readFileSync(path, 'utf8').trim();
  } catch {
    return '?';
  }
}

/** A khugepaged report of a run that has not (yet) seen anything collapse. */
function noKhugepaged(thp: string, scanSleepMs: number | null): KhugepagedReport {
  return {
    thp,
    scanSleepMs,
    waitedS: 0,
    fullScans: null,
    pagesCollapsed: null,
    setUp: false,
    hugeBytes: 0,
    framesMoved: null,
    lockedBytes: 0,
    note: '',
  };
}

/**
 * The same move left to khugepaged: a pinned buffer of 4 KiB pages in a THP-eligible range
 * (collapse once, drop all but one page of each huge page so the kernel splits it, touch them
 * back as 4 KiB pages, pin), then wait and see whether its frames change.
 */
async function khugepaged(size: number, waitS: number): Promise<KhugepagedReport> {
  const thpFile = readSys('/sys/kernel/mm/transparent_hugepage/enabled');
  const thp = /\[(\w+)\]/.exec(thpFile)?.[1] ?? thpFile;
  const sleep = Number(readSys('/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs'));
  const out = noKhugepaged(thp, Number.isFinite(sleep) ? sleep : null);
  if (waitS === 0) {
    out.note = 'skipped (--khugepaged-wait 0)';
    return out;
  }
  if (thp === 'never') {
    out.note = 'THP is "never" on this machine: khugepaged collapses nothing';
    return out;
  }
  const r = mapRegion(size);
  try {
    fill(r, 8);
    await collapse(r); // makes the range THP-eligible (MADV_HUGEPAGE) as a side effect
    for (let o = 0; o < size; o += HUGE_PAGE_SIZE) r.evict(o + PAGE_SIZE, HUGE_PAGE_SIZE - PAGE_SIZE);
    fill(r, 9);
    r.pin();
    const huge = (): number => r.pagemapScan({ all: PageCategory.HUGE | PageCategory.PRESENT }).reduce((n, x) => n + x.length, 0);
    out.setUp = huge() === 0;
    if (!out.setUp) {
      out.note = 'the kernel gave huge pages at once: nothing left for khugepaged';
      return out;
    }
    const before = r.frames();
    const stat = (name: string): number => Number(readSys(`/sys/kernel/mm/transparent_hugepage/khugepaged/${name}`));
    const scans0 = stat('full_scans');
    const collapsed0 = stat('pages_collapsed');
    const t0 = performance.now();
    print(`Waiting up to ${waitS} s for khugepaged to collapse a second pinned buffer (--khugepaged-wait 0 skips this)...`);
    const line = liveLine();
    try {
      for (let left = waitS * 1000; left > 0 && huge() < size; left = waitS * 1000 - (performance.now() - t0)) {
        line.update(`khugepaged: ${Math.ceil(left / 1000)} s left, ${sizeName(huge())} of ${sizeName(size)} collapsed so far`);
        await new Promise((res) => setTimeout(res, Math.min(250, left)));
      }
    } finally {
      line.stop();
    }
    out.waitedS = Math.round((performance.now() - t0) / 100) / 10;
    out.hugeBytes = huge();
    const scans = stat('full_scans') - scans0;
    const collapsed = stat('pages_collapsed') - collapsed0;
    out.fullScans = Number.isFinite(scans) ? scans : null;
    out.pagesCollapsed = Number.isFinite(collapsed) ? collapsed : null;
    out.lockedBytes = lockedBytes(r.address, size);
    const after = r.frames();
    if (before.visible && after.visible) out.framesMoved = moved(before.pfns, after.pfns);
    const frameNote = out.framesMoved === null ? 'frames hidden' : `${out.framesMoved} of ${size / PAGE_SIZE} frames moved`;
    out.note =
      out.hugeBytes > 0
        ? `after ${out.waitedS} s, ${sizeName(out.hugeBytes)} of the pinned buffer is huge pages (${frameNote}), ${sizeName(out.lockedBytes || 0)} still mlocked`
        : `nothing collapsed within ${out.waitedS} s (khugepaged finished ${out.fullScans ?? '?'} full scans of every ` +
          `process's memory and collapsed ${out.pagesCollapsed ?? '?'} huge pages meanwhile; give it longer with --khugepaged-wait)`;
    return out;
  } finally {
    r.close();
  }
}
