// A program's memory seen by the device (test/fixtures/evicted-mr.c, a verbs program on the
// project's libibverbs): its evicted ODP buffer is absent in its own page tables as the device
// reads them, a terminate-mode copy into it faults, the program's fault thread makes the pages
// resident when asked (page by page, or in one call), the copy engine writes it with
// process_vm_writev, and the program finds every byte. Its pinned MR is mlock'd against its own
// RLIMIT_MEMLOCK.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { constants, tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, afterEach, beforeAll, beforeEach, expect, test } from 'vitest';
import { FaultMethod } from '../../kernel-sim/device/abi.js';
import type { Mr } from '../../kernel-sim/device/objects.js';
import type { ProgramContext } from '../../kernel-sim/device/context.js';
import { CopyEngine, CopyFlag, CopyStatus } from '../../kernel-sim/pldma/copy-engine.js';
import { mapRegion, type Region } from '../../lib/index.js';
import { binding } from '../../native/index.js';
import { compileFixture, deviceHere, verbsEnv } from './fixture.js';

const P = 4096;
const E = constants.errno;
let build = '';
let bin = '';
let dev: ReturnType<typeof deviceHere>;
let engine: CopyEngine;
let program: Program | undefined;
const regions: Region[] = [];

beforeAll(() => {
  build = mkdtempSync(join(tmpdir(), `pfr-mem-${process.pid}-`));
  bin = compileFixture('evicted-mr', build, ['-libverbs']);
  engine = new CopyEngine(1);
});
afterAll(() => {
  engine.close();
  rmSync(build, { recursive: true, force: true });
});
beforeEach(() => {
  dev = deviceHere();
});
afterEach(() => {
  program?.child.kill('SIGKILL');
  program = undefined;
  for (const r of regions.splice(0)) r.close();
  dev.close();
});

interface Program {
  child: ChildProcessWithoutNullStreams;
  ready: string[];
  line(): Promise<string>;
}

async function start(pages: number, pinned: number, wrap: string[] = []): Promise<Program> {
  const [cmd, ...args] = [...wrap, bin, String(pages), String(pinned)];
  const child = spawn(cmd!, args, { env: verbsEnv(dev.dir) });
  const lines: string[] = [];
  const waiters: ((l: string) => void)[] = [];
  createInterface({ input: child.stdout }).on('line', (l) => (waiters.length ? waiters.shift()!(l) : lines.push(l)));
  const line = (): Promise<string> => (lines.length ? Promise.resolve(lines.shift()!) : new Promise((r) => waiters.push(r)));
  const ready = (await line()).split(' ');
  expect(ready[0]).toBe('ready');
  program = { child, ready, line };
  return program;
}

function theMr(): { ctx: ProgramContext; mr: Mr } {
  const ctx = dev.device.contexts()[0]!;
  const mr = ctx.objects.all('mr').find((m) => m.access & 64)!; // the ODP one
  return { ctx, mr };
}

function source(len: number, seed: number): Region {
  const r = mapRegion(len);
  regions.push(r);
  const b = new Uint8Array(r.buffer);
  for (let i = 0; i < len; i++) b[i] = (seed + i * 7) & 0xff;
  return r;
}

test('an evicted MR: absent to the device, a fault, resolved by the program, written, every byte checked', async () => {
  const pages = 16;
  const p = await start(pages, 0);
  const { ctx, mr } = theMr();
  expect(mr.start).toBe(BigInt(p.ready[1]!));
  const region = ctx.memory.region(mr.handle, mr.start, mr.length);
  expect(region.size).toBe(pages * P);
  // The program's own page table, as the device reads it: nothing present after MADV_DONTNEED.
  expect([...binding.pagemap(region.id, 0, region.size)]).toEqual(new Array(pages).fill(0));
  expect(region.firstAbsent(0, region.size)).toBe(0);

  // A terminate-mode write faults at the first page, and touches nothing.
  const src = source(region.size, 3);
  const fault = await engine.copy(src, 0, region, 0, region.size, CopyFlag.CheckDest);
  expect(fault).toMatchObject({ status: CopyStatus.DestFault, faultOffset: 0 });
  expect(region.firstAbsent(0, region.size)).toBe(0);

  // The fault thread touches the first page alone, then makes the rest resident in one call.
  const touched = await ctx.memory.resolve(mr.handle, mr.start, P, true, FaultMethod.TOUCH);
  expect(touched).toMatchObject({ status: 0, pages: 1 });
  expect(region.firstAbsent(0, region.size)).toBe(P);
  const rest = await ctx.memory.resolve(mr.handle, mr.start + BigInt(P), (pages - 1) * P, true, FaultMethod.POPULATE);
  expect(rest).toMatchObject({ status: 0, pages: pages - 1 });
  expect(region.firstAbsent(0, region.size)).toBe(-1);

  // Retransmitted: the bytes land in the program's memory (process_vm_writev), every one checked there.
  expect(await engine.copy(src, 0, region, 0, region.size, CopyFlag.CheckDest)).toMatchObject({ status: CopyStatus.Ok });
  p.child.stdin.write('check 3\n');
  expect(await p.line()).toBe(`ok ${pages * P}`);
  expect(dev.device.stats()).toMatchObject({ faultsRaised: 2, faultsResolved: 2, faultsFailed: 0 });

  // And back: the device reads what the program holds (process_vm_readv).
  const back = mapRegion(region.size);
  regions.push(back);
  expect(await engine.copy(region, 0, back, 0, region.size, CopyFlag.CheckSource)).toMatchObject({ status: CopyStatus.Ok });
  expect(Buffer.from(back.buffer).equals(Buffer.from(src.buffer))).toBe(true);
  p.child.stdin.write('exit\n');
  expect(await new Promise((r) => p.child.once('exit', r))).toBe(0);
});

test('the fault thread touches nothing outside the MR the request names, and a gone program fails the fault at once', async () => {
  const p = await start(4, 0);
  const { ctx, mr } = theMr();
  const outside = await ctx.memory.resolve(mr.handle, mr.start + mr.length + BigInt(P), P, true, FaultMethod.TOUCH);
  expect(outside.status).toBe(-E.EFAULT!);
  const other = await ctx.memory.resolve(mr.handle + 1000, mr.start, P, true, FaultMethod.TOUCH);
  expect(other.status).toBe(-E.EFAULT!);
  p.child.kill('SIGKILL');
  await new Promise((r) => p.child.once('exit', r));
  const gone = await ctx.memory.resolve(mr.handle, mr.start, P, true, FaultMethod.TOUCH, 2000);
  expect([-E.EPIPE!, -E.ETIMEDOUT!]).toContain(gone.status);
  expect(dev.device.stats().faultsFailed).toBe(3);
});

test('the device going away fails the next verb of a program at once (EIO), and the program goes on', async () => {
  const p = await start(1, 0);
  p.child.stdin.write('pd\n');
  expect(await p.line()).toBe('pd ok');
  dev.device.close();
  const t0 = Date.now();
  p.child.stdin.write('pd\n');
  expect(await p.line()).toBe('pd EIO');
  expect(Date.now() - t0).toBeLessThan(2000);
  p.child.stdin.write('check 0\nexit\n');
  expect(await p.line()).toMatch(/^(ok|bad) /);
  expect(await new Promise((r) => p.child.once('exit', r))).toBe(0);
});

test("a pinned MR is mlock'd in the program, against its own RLIMIT_MEMLOCK", async () => {
  const p = await start(1, 8);
  expect(p.ready[3]).toBe('pinned');
  const locked = /VmLck:\s+(\d+) kB/.exec(readFileSync(`/proc/${p.child.pid}/status`, 'utf8'))![1];
  expect(Number(locked)).toBeGreaterThanOrEqual(32);
  const ctx = dev.device.contexts()[0]!;
  const pinned = ctx.objects.all('mr').find((m) => !(m.access & 64))!;
  expect(ctx.memory.region(pinned.handle, pinned.start, pinned.length).firstAbsent(0, 8 * P)).toBe(-1);
  p.child.kill('SIGKILL');
  // Without CAP_IPC_LOCK (which root has), 64 KiB of memlock cannot pin 128 KiB: ENOMEM, as libibverbs says.
  const limited = await start(1, 32, ['prlimit', '--memlock=65536', 'setpriv', '--inh-caps=-ipc_lock', '--bounding-set=-ipc_lock', '--']);
  expect(limited.ready[3]).toBe('ENOMEM');
});
