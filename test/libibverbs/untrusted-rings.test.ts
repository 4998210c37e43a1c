// Nothing a program writes into its rings is trusted (docs/device-abi.md §2). A program's send
// and receive rings are shared memory it may fill with anything: here the test writes garbage
// WQEs and indices into a live program's rings (through the device's own mapping of the same
// memfd, which is the program's memory) and rings for it. Each bad entry completes in error
// (or a corrupt index takes the QP to error with IBV_EVENT_QP_FATAL), is counted, and the device
// goes on serving that program's other QPs and the next program.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { randomFillSync } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, afterEach, beforeAll, beforeEach, expect, test } from 'vitest';
import * as abi from '../../kernel-sim/device/abi.js';
import type { ProgramContext } from '../../kernel-sim/device/context.js';
import { AsyncEventType, WcStatus, WrOpcode } from '../../kernel-sim/device/ib.js';
import type { Qp } from '../../kernel-sim/device/objects.js';
import { compileFixture, deviceHere, verbsEnv } from '../device/fixture.js';

let build = '';
let bin = '';
let dev: ReturnType<typeof deviceHere>;
const programs: ChildProcessWithoutNullStreams[] = [];

beforeAll(() => {
  build = mkdtempSync(join(tmpdir(), `pfr-rings-${process.pid}-`));
  bin = compileFixture('odp-loop', build, ['-libverbs']);
});
afterAll(() => rmSync(build, { recursive: true, force: true }));
beforeEach(() => {
  dev = deviceHere();
});
afterEach(() => {
  for (const p of programs.splice(0)) p.kill('SIGKILL');
  dev.close();
});

interface Program {
  qpns: [number, number];
  say(line: string): Promise<string>;
  ctx: ProgramContext;
}

async function start(): Promise<Program> {
  const child = spawn(bin, ['8192'], { env: verbsEnv(dev.dir) });
  programs.push(child);
  const lines: string[] = [];
  const waiters: ((l: string) => void)[] = [];
  createInterface({ input: child.stdout }).on('line', (l) => (waiters.length ? waiters.shift()!(l) : lines.push(l)));
  const line = (): Promise<string> => (lines.length ? Promise.resolve(lines.shift()!) : new Promise((r) => waiters.push(r)));
  const ready = (await line()).split(' ');
  expect(ready[0]).toBe('ready');
  const ctx = dev.device.contexts().find((c) => c.peer.pid === child.pid)!;
  return {
    qpns: [Number(ready[1]), Number(ready[2])],
    ctx,
    say: (l: string) => {
      child.stdin.write(`${l}\n`);
      return line();
    },
  };
}

const SQ = abi.sendWqe.offsets(['wr.wr_id', 'wr.opcode', 'wr.send_flags', 'dma.length', 'dma.num_sge'] as const);
const HDR = abi.queueBuf.offsets(['producer_index', 'consumer_index'] as const);

/** The program's send ring of QP `qpn`, as the bytes it shares with the device. */
function sendRing(p: Program, qpn: number): { view: DataView; slot(i: number): number; producer: number; setProducer(v: number): void } {
  const qp = p.ctx.objects.all('qp').find((q: Qp) => q.qpNum === qpn)!;
  const g = qp.ring!.rings.find((r) => r.kind === abi.QueueKind.SQ)!;
  const view = new DataView(qp.ring!.mapping.buffer);
  return {
    view,
    slot: (i) => g.offset + abi.QUEUE_DATA_OFFSET + ((i & (g.numElems - 1)) << g.log2ElemSize),
    get producer() {
      return view.getUint32(g.offset + HDR.producer_index, true);
    },
    setProducer: (v) => view.setUint32(g.offset + HDR.producer_index, v >>> 0, true),
  };
}

// A WQE the program's provider would never write, produced behind its back, and the doorbell.
function garbage(p: Program, qpn: number, fields: Partial<Record<keyof typeof SQ, number>>): void {
  const r = sendRing(p, qpn);
  const at = r.slot(r.producer);
  r.view.setBigUint64(at + SQ['wr.wr_id'], 0x5eedn, true);
  r.view.setUint32(at + SQ['wr.opcode'], fields['wr.opcode'] ?? WrOpcode.RDMA_WRITE, true);
  r.view.setUint32(at + SQ['wr.send_flags'], fields['wr.send_flags'] ?? 2, true);
  r.view.setUint32(at + SQ['dma.length'], fields['dma.length'] ?? 0, true);
  r.view.setUint32(at + SQ['dma.num_sge'], fields['dma.num_sge'] ?? 0, true);
  r.setProducer(r.producer + 1);
  p.ctx.dataPath!.scan();
}

test('garbage WQEs complete in error, a corrupt index is QP_FATAL; the counts say so and everything else goes on', async () => {
  const p = await start();
  const [a, b] = p.qpns;
  // A clean transfer first: the QPs work.
  expect(await p.say('write 2')).toBe('ok 2');
  const before = dev.device.stats().dataPath!;

  // QP b: an index past the ring. Its QP goes to error, the program hears IBV_EVENT_QP_FATAL.
  const rb = sendRing(p, b);
  rb.setProducer(rb.producer + 5000);
  p.ctx.dataPath!.scan();
  expect(await p.say('async')).toBe(`async ${AsyncEventType.QP_FATAL}`);

  // QP a: an opcode no QP has, then an SGE count past the ring's: error completions, in order.
  garbage(p, a, { 'wr.opcode': 0x77 });
  expect(await p.say('poll')).toBe(`wc ${WcStatus.LOC_QP_OP_ERR} 0`);
  // The QP is in error now: what the provider posts next is flushed, and garbage too.
  expect(await p.say('post')).toBe('posted');
  expect(await p.say('poll')).toBe(`wc ${WcStatus.WR_FLUSH_ERR} 1`);
  garbage(p, a, { 'dma.num_sge': 1_000_000 });
  expect(await p.say('poll')).toMatch(new RegExp(`^wc ${WcStatus.WR_FLUSH_ERR} `));
  expect(await p.say('poll')).toBe('none');

  const after = dev.device.stats().dataPath!;
  expect(after.corruptRings - before.corruptRings).toBe(1);
  expect(after.refusedWqes - before.refusedWqes).toBeGreaterThanOrEqual(2);
  // The device goes on: the next program's transfers fault, resolve and land.
  const q = await start();
  expect(await q.say('write 5')).toBe('ok 5');
  expect(await q.say('send 5')).toBe('ok 5');
});

test('random bytes in a send ring and random indices: the device stays up and the next program runs', async () => {
  const p = await start();
  const [a, b] = p.qpns;
  const junk = Buffer.alloc(256);
  for (let i = 0; i < 300; i++) {
    const r = sendRing(p, i % 2 ? a : b);
    randomFillSync(junk);
    const at = r.slot(r.producer);
    for (let k = 0; k < 256 && at + k < r.view.byteLength; k++) r.view.setUint8(at + k, junk[k]!);
    r.setProducer(r.producer + (junk[0]! % 4 === 0 ? junk.readUInt32LE(4) : 1 + (junk[1]! % 3)));
    p.ctx.dataPath!.scan();
  }
  // The program can still poll its CQ (whatever completed), and exits cleanly.
  for (let i = 0; i < 8 && (await p.say('poll')) !== 'none'; i++);
  const q = await start();
  expect(await q.say('write 3')).toBe('ok 3');
  expect(await q.say('read 3')).toBe('ok 3');
});

test("a CQ consumer index past the ring: the CQ is overrun (IBV_EVENT_CQ_ERR), its QPs go to error, the program's other work goes on", async () => {
  const p = await start();
  expect(await p.say('write 1')).toBe('ok 1');
  const cq = p.ctx.objects.all('cq')[0]!;
  const v = new DataView(cq.ring.mapping.buffer);
  // The program's own index, which the device reads and never trusts.
  v.setUint32(HDR.consumer_index, v.getUint32(HDR.producer_index, true) + 100_000, true);
  const before = dev.device.stats().dataPath!;
  expect(await p.say('post')).toBe('posted');
  expect(await p.say('async')).toBe(`async ${AsyncEventType.CQ_ERR}`);
  const after = dev.device.stats().dataPath!;
  expect(after.corruptRings - before.corruptRings).toBe(1);
  expect(after.cqes - before.cqes).toBe(0);
  const q = await start();
  expect(await q.say('write 2')).toBe('ok 2');
});
