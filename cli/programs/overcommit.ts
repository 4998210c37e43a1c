// Overcommit: what on-demand paging allows that pinning cannot (the ODP paper). Register
// several times the machine's memory as ODP MRs on node 1: the registrations succeed at once,
// a sparse run of RDMA WRITEs over them completes, and only the pages written become
// resident. The same memory registered pinned fails at registration with the library's
// RLIMIT_MEMLOCK error. The pinned side runs in a child process with a lowered RLIMIT_MEMLOCK
// and without CAP_IPC_LOCK: as root, pinning would lock the machine's real memory until the
// OOM killer steps in, which is the point of the demonstration but no way to run it.
import { spawn, spawnSync } from 'node:child_process';
import { kMaxLength } from 'node:buffer';
import { readFileSync, mkdtempSync, rmSync } from 'node:fs';
import { totalmem, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Access, HUGE_PAGE_SIZE, mapRegion, PAGE_SIZE, SendFlags, SIZE_MAX, WrOpcode, type MemoryRegion, type Region } from '../../lib/index.js';
import { binding } from '../../native/index.js';
import { print, sizeName } from './support/format.js';
import { connectedPair, type Pair } from './support/pair.js';
import { residentSetBytes } from './support/smaps.js';
import type { TraceFile } from './support/trace-file.js';

export interface OvercommitOptions {
  /** Registered memory as a multiple of the machine's RAM (default 4). */
  ratio?: number;
  /** RDMA WRITEs of one page each, spread over the registered memory (default 64). */
  writes?: number;
  /** Run both sides (default), or one: 'pinned' is what the child runs. */
  side?: 'both' | 'odp' | 'pinned';
  /** RLIMIT_MEMLOCK of the pinned side's child, KiB (default 8192, the usual default of ulimit -l). */
  memlockKiB?: number;
  /** Where to put the trace of the ODP side's processes (--trace); the pinned side fails before any fault. */
  trace?: TraceFile;
}

export interface SideResult {
  kind: 'odp' | 'pinned';
  /** Bytes the side asked to register, and how many MRs that took. */
  requestedBytes: number;
  mrs: number;
  registeredBytes: number;
  registrationMs: number;
  /** The registration error (pinned): code, syscall and the library's message naming the limit. */
  error?: { code?: string; syscall?: string; message: string };
  writes: number;
  /** Work completion statuses (ODP) or why nothing was posted (pinned). */
  completion: string;
  bytesOk: boolean;
  /** Pages of the registered memory resident after the writes (mincore). */
  residentPages: number;
  residentBytes: number;
  /** The process's resident set (VmRSS) before and after. */
  rssBefore: number;
  rssAfter: number;
  /** ODP only: one implicit MR (address 0, length SIZE_MAX) over the whole address space. */
  implicit?: { registrationMs: number; completion: string; bytesOk: boolean; residentPagesAdded: number };
  uid: number;
  memlockSoft: number;
  capIpcLock: boolean;
}

export interface OvercommitResult {
  ramBytes: number;
  ratio: number;
  regionBytes: number;
  odp?: SideResult;
  pinned?: SideResult;
}

const ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE;
// The largest region one ArrayBuffer can be (mapRegion refuses more), in whole huge pages.
const REGION_BYTES = Math.floor(Math.min(kMaxLength, 2 ** 32) / HUGE_PAGE_SIZE) * HUGE_PAGE_SIZE;

export async function overcommit(options: OvercommitOptions = {}): Promise<OvercommitResult> {
  const ratio = options.ratio ?? 4;
  const writes = options.writes ?? 64;
  const side = options.side ?? 'both';
  const ramBytes = totalmem();
  const requested = Math.ceil((ratio * ramBytes) / PAGE_SIZE) * PAGE_SIZE;
  const out: OvercommitResult = { ramBytes, ratio, regionBytes: REGION_BYTES };
  if (side === 'pinned') {
    out.pinned = pinnedSide(requested);
    report(out);
    return out;
  }
  out.odp = await odpSide(requested, writes, options.trace);
  if (side === 'both') out.pinned = await pinnedInChild(ratio, options.memlockKiB ?? 8192);
  report(out);
  return out;
}

function sides(requested: number): number[] {
  const sizes: number[] = [];
  for (let left = requested; left > 0; left -= REGION_BYTES) sizes.push(Math.min(left, REGION_BYTES));
  return sizes;
}

function baseResult(kind: SideResult['kind'], requestedBytes: number): SideResult {
  const limit = binding.memlockLimit();
  return {
    kind,
    requestedBytes,
    mrs: 0,
    registeredBytes: 0,
    registrationMs: 0,
    writes: 0,
    completion: '',
    bytesOk: false,
    residentPages: 0,
    residentBytes: 0,
    rssBefore: residentSetBytes(),
    rssAfter: 0,
    uid: process.getuid?.() ?? -1,
    memlockSoft: limit.soft,
    capIpcLock: capIpcLock(),
  };
}

async function odpSide(requested: number, writes: number, trace?: TraceFile): Promise<SideResult> {
  const r = baseResult('odp', requested);
  const pair = connectedPair({ trace: trace?.option ?? false });
  const regions: Region[] = [];
  const mrs: MemoryRegion[] = [];
  const src = mapRegion(PAGE_SIZE);
  try {
    for (const size of sides(requested)) regions.push(mapRegion(size));
    const t0 = performance.now();
    for (const region of regions) mrs.push(pair.ctx[1].regMr(pair.pd[1], region, 0, region.size, ACCESS | Access.ON_DEMAND));
    r.registrationMs = performance.now() - t0;
    r.mrs = mrs.length;
    r.registeredBytes = mrs.reduce((n, mr) => n + mr.length, 0);
    const s = pair.ctx[0].regMr(pair.pd[0], src, 0, PAGE_SIZE, ACCESS | Access.ON_DEMAND);
    // Sparse: one page per write, spread over every region, each page written once.
    const targets = Array.from({ length: writes }, (_, i) => {
      const region = i % regions.length;
      const pages = regions[region]!.size / PAGE_SIZE;
      const page = Math.floor(((Math.floor(i / regions.length) + 0.5) * pages) / Math.ceil(writes / regions.length)) % pages;
      return { region, offset: page * PAGE_SIZE, byte: (i % 250) + 1 };
    });
    const statuses = new Map<string, number>();
    for (const t of targets) {
      new Uint8Array(src.buffer).fill(t.byte);
      pair.qp[0].postSend({
        wrId: t.byte,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [{ addr: s.addr, length: PAGE_SIZE, lkey: s.lkey }],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: mrs[t.region]!.addr + BigInt(t.offset), rkey: mrs[t.region]!.rkey },
      });
      const wc = await pair.cq[0].next({ timeoutMs: 60_000 });
      statuses.set(wc.statusStr, (statuses.get(wc.statusStr) ?? 0) + 1);
      r.writes++;
    }
    r.bytesOk = targets.every((t) => new Uint8Array(regions[t.region]!.buffer, t.offset, PAGE_SIZE).every((b) => b === t.byte));
    r.completion = [...statuses].map(([k, n]) => `${n} × ${k}`).join(', ');
    r.residentPages = regions.reduce((n, region) => n + region.residentPages(), 0);
    r.residentBytes = r.residentPages * PAGE_SIZE;
    r.rssAfter = residentSetBytes();
    r.implicit = await implicitOdp(pair, src, s, regions, r.residentPages);
    s.dereg();
    trace?.addContexts(pair.ctx);
    return r;
  } finally {
    for (const mr of mrs) mr.dereg();
    pair.cluster.close();
    src.close();
    for (const region of regions) region.close();
  }
}

/** One implicit ODP MR, the whole address space at once: one write through it into each region's last page. */
async function implicitOdp(
  pair: Pair,
  src: Region,
  s: MemoryRegion,
  regions: readonly Region[],
  residentBefore: number,
): Promise<SideResult['implicit']> {
  const t0 = performance.now();
  const mr = pair.ctx[1].regMr(pair.pd[1], null, 0, SIZE_MAX, ACCESS | Access.ON_DEMAND);
  const registrationMs = performance.now() - t0;
  const statuses = new Map<string, number>();
  try {
    for (const [i, region] of regions.entries()) {
      new Uint8Array(src.buffer).fill(0x80 + (i % 100));
      pair.qp[0].postSend({
        wrId: i,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [{ addr: s.addr, length: PAGE_SIZE, lkey: s.lkey }],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: region.address + BigInt(region.size - PAGE_SIZE), rkey: mr.rkey },
      });
      const wc = await pair.cq[0].next({ timeoutMs: 60_000 });
      statuses.set(wc.statusStr, (statuses.get(wc.statusStr) ?? 0) + 1);
    }
  } finally {
    mr.dereg();
  }
  const bytesOk = regions.every((region, i) => new Uint8Array(region.buffer, region.size - PAGE_SIZE).every((b) => b === 0x80 + (i % 100)));
  const resident = regions.reduce((n, region) => n + region.residentPages(), 0);
  return {
    registrationMs,
    completion: [...statuses].map(([k, n]) => `${n} × ${k}`).join(', '),
    bytesOk,
    residentPagesAdded: resident - residentBefore,
  };
}

/** The pinned side, in this process: register the same memory pinned until the first failure. */
function pinnedSide(requested: number): SideResult {
  const r = baseResult('pinned', requested);
  const pair = connectedPair();
  const regions: Region[] = [];
  const mrs: MemoryRegion[] = [];
  try {
    for (const size of sides(requested)) {
      // Never let this lock a good part of the machine's memory: past the limit that is not an
      // error the library reports but the OOM killer's work.
      const soft = r.memlockSoft < 0 ? Infinity : r.memlockSoft;
      if (r.capIpcLock || soft > totalmem() / 4) {
        r.error = {
          message: `not tried: this process may lock ${r.capIpcLock ? 'without limit (CAP_IPC_LOCK)' : `${soft} bytes`}, so pinning ${size} bytes would lock the machine's memory; run it with a lower "ulimit -l"`,
        };
        break;
      }
      const region = mapRegion(size);
      regions.push(region);
      const t0 = performance.now();
      try {
        mrs.push(pair.ctx[1].regMr(pair.pd[1], region, 0, size, ACCESS));
        r.registeredBytes += size;
      } catch (e) {
        const err = e as NodeJS.ErrnoException;
        r.error = { code: err.code, syscall: err.syscall, message: err.message };
        break;
      } finally {
        r.registrationMs += performance.now() - t0;
      }
    }
    r.mrs = mrs.length;
    r.completion = r.error ? `nothing posted: the registration ${r.error.code ? 'failed' : 'was not tried'}` : 'registered (no limit stopped it)';
    r.residentPages = regions.reduce((n, region) => n + region.residentPages(), 0);
    r.residentBytes = r.residentPages * PAGE_SIZE;
    r.rssAfter = residentSetBytes();
    return r;
  } finally {
    for (const mr of mrs) mr.dereg();
    pair.cluster.close();
    for (const region of regions) region.close();
  }
}

/**
 * The pinned side in a child with RLIMIT_MEMLOCK lowered to `memlockKiB` (ulimit -l) and,
 * when this process has it, CAP_IPC_LOCK dropped from the bounding set (setpriv), so the
 * limit applies even to root.
 */
async function pinnedInChild(ratio: number, memlockKiB: number): Promise<SideResult> {
  // From the sources (tests), the CLI to run is the built one.
  const main = fileURLToPath(new URL(import.meta.url.endsWith('.ts') ? '../../dist/cli/main.js' : '../main.js', import.meta.url));
  const dir = mkdtempSync(join(tmpdir(), 'pagefault-rdma-overcommit-'));
  const file = join(dir, 'pinned.json');
  const node = [process.execPath, main, 'overcommit', '--side', 'pinned', '--ratio', String(ratio), '--json', file];
  const drop = capIpcLock() ? ['setpriv', '--inh-caps=-ipc_lock', '--bounding-set=-ipc_lock'] : [];
  if (drop.length && spawnSync('setpriv', ['--version'], { stdio: 'ignore' }).error)
    throw new Error(
      'overcommit: "setpriv" is not on PATH: it drops CAP_IPC_LOCK for the pinned side, so that the memlock limit holds. Install util-linux (Debian/Ubuntu: apt-get install util-linux) and run again',
    );
  // An ordinary user cannot raise the limit: never ask for more than the current one.
  const soft = binding.memlockLimit().soft;
  const kib = soft < 0 ? memlockKiB : Math.min(memlockKiB, Math.floor(soft / 1024));
  const script = `ulimit -l ${kib} && exec "$@"`;
  try {
    const { code, stderr } = await new Promise<{ code: number | null; stderr: string }>((resolve, reject) => {
      const child = spawn('/bin/sh', ['-c', script, 'sh', ...drop, ...node], { stdio: ['ignore', 'ignore', 'pipe'] });
      let err = '';
      child.stderr.on('data', (d: Buffer) => (err += d.toString()));
      const timer = setTimeout(() => child.kill('SIGKILL'), 120_000);
      child.on('error', reject);
      child.on('close', (c) => {
        clearTimeout(timer);
        resolve({ code: c, stderr: err });
      });
    });
    if (code !== 0) throw new Error(`the pinned side's child failed (exit ${code}): ${stderr.trim()}`);
    return (JSON.parse(readFileSync(file, 'utf8')) as { results: OvercommitResult }).results.pinned!;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function capIpcLock(): boolean {
  const eff = /CapEff:\s+([0-9a-f]+)/.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '0';
  return (BigInt('0x' + eff) & (1n << 14n)) !== 0n;
}

function report(o: OvercommitResult): void {
  const gib = (b: number): string => `${(b / 2 ** 30).toFixed(1)} GiB`;
  const mib = (b: number): string => `${(b / 2 ** 20).toFixed(1)} MiB`;
  print(`This machine has ${gib(o.ramBytes)} of RAM; registering ${o.ratio}× that on node 1, in regions of ${sizeName(o.regionBytes)}.`);
  for (const s of [o.odp, o.pinned]) {
    if (!s) continue;
    const who = `uid ${s.uid}, RLIMIT_MEMLOCK ${s.memlockSoft < 0 ? 'unlimited' : sizeName(s.memlockSoft)}${s.capIpcLock ? ', CAP_IPC_LOCK' : ''}`;
    print(`${s.kind === 'odp' ? 'ODP (Access.ON_DEMAND)' : 'Pinned (no ON_DEMAND: mlock)'} [${who}]:`);
    print(`  registration: ${s.mrs} MRs, ${gib(s.registeredBytes)} of ${gib(s.requestedBytes)} in ${s.registrationMs.toFixed(1)} ms`);
    if (s.implicit) {
      const m = s.implicit;
      print(
        `  implicit ODP MR (address 0, length SIZE_MAX) registered in ${m.registrationMs.toFixed(2)} ms; one write through it into ` +
          `each region: ${m.completion}, bytes ${m.bytesOk ? 'correct' : 'WRONG'}, ${m.residentPagesAdded} more pages resident`,
      );
    }
    if (s.error) print(`  failed: ${s.error.code ?? ''} ${s.error.message}`);
    print(`  completion: ${s.completion}${s.writes ? `; bytes ${s.bytesOk ? 'correct' : 'WRONG'}` : ''}`);
    print(
      `  resident: ${s.residentPages} pages (${sizeName(s.residentBytes || 0)}) of the registered memory; VmRSS ${mib(s.rssBefore)} -> ${mib(s.rssAfter)}`,
    );
  }
}
