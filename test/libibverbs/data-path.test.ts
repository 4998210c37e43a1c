// Debian's verbs programs, unmodified, through the data path: the project's libibverbs.so.1
// writes their work requests into the rings, the device process (`pagefault-rdma device`)
// consumes them on its engine, moves the bytes between the two programs' memories and writes
// the completions back. Two processes on loopback, connected by (GID, QPN) as the programs
// exchange them; both must exit 0. A C program of the suite's own evicts its buffers before
// every transfer and checks every byte, and the device's statistics show the faults it served.
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { queryStats } from '../../kernel-sim/device/client.js';
import { compileFixture, deviceProcess, verbsEnv } from '../device/fixture.js';
import { listening, pair, run } from './pair.js';

let dev: Awaited<ReturnType<typeof deviceProcess>>;
let build = '';
let odpLoop = '';
beforeAll(async () => {
  dev = await deviceProcess();
  build = mkdtempSync(join(tmpdir(), `pfr-dp-${process.pid}-`));
  odpLoop = compileFixture('odp-loop', build, ['-libverbs']);
}, 60_000);
afterAll(async () => {
  rmSync(build, { recursive: true, force: true });
  // A device that died says why (its log's last lines) before the stop's exit code fails.
  if (dev.child.exitCode !== null || dev.child.signalCode !== null)
    console.error(`the device died (${dev.child.signalCode ?? dev.child.exitCode}):\n${dev.log.slice(-30).join('\n')}`);
  expect(await dev.stop()).toBe(0);
});

const has = (p: string): boolean => existsSync(`/usr/bin/${p}`);

async function both(cmd: string, args: string[]): Promise<{ server: string; client: string }> {
  const { server, client } = await pair(dev.dir, cmd, args);
  expect({ cmd, args, server: server.status, client: client.status, out: server.status || client.status ? server.out + client.out : '' }).toEqual({
    cmd,
    args,
    server: 0,
    client: 0,
    out: '',
  });
  return { server: server.out, client: client.out };
}

describe.runIf(has('ibv_rc_pingpong'))('ibverbs-utils', () => {
  for (const args of [
    [],
    ['-s', '4096'],
    ['-s', '65536', '-n', '100'],
    ['-o', '-n', '200'],
    ['-O', '-n', '200'],
    ['-o', '-P', '-n', '200'],
    ['-e', '-n', '200'],
  ])
    test(`ibv_rc_pingpong ${args.join(' ')}: both sides exit 0`, async () => {
      const before = await queryStats(dev.dir);
      const { server, client } = await both('ibv_rc_pingpong', ['-g', '0', ...args]);
      const iters = args.includes('-n') ? args[args.indexOf('-n') + 1] : '1000';
      for (const out of [server, client]) expect(out).toMatch(new RegExp(`${iters} iters in [\\d.]+ seconds`));
      // Each side saw the other's QPN: the one it connected to.
      const qpn = (out: string, which: string) => new RegExp(`${which} address:.*QPN (0x[0-9a-f]+)`).exec(out)?.[1];
      expect(qpn(server, 'local')).toBe(qpn(client, 'remote'));
      expect(qpn(client, 'local')).toBe(qpn(server, 'remote'));
      const after = await queryStats(dev.dir);
      expect(after.faultsFailed - before.faultsFailed).toBe(0);
      expect(after.refused).toEqual(before.refused);
    }, 90_000);

  test.runIf(has('ibv_ud_pingpong'))(
    'ibv_ud_pingpong: both sides exit 0',
    async () => {
      const { client } = await both('ibv_ud_pingpong', ['-g', '0', '-n', '200']);
      expect(client).toMatch(/200 iters in/);
    },
    90_000,
  );

  test.runIf(has('ibv_srq_pingpong'))(
    'ibv_srq_pingpong: both sides exit 0',
    async () => {
      const { client } = await both('ibv_srq_pingpong', ['-g', '0', '-n', '200']);
      expect(client).toMatch(/200 iters in/);
    },
    90_000,
  );
});

describe.runIf(has('ib_write_bw'))('perftest', () => {
  const runs: Array<[string, string[]]> = [
    ['ib_write_bw', ['-s', '65536', '-n', '100']],
    ['ib_send_bw', ['-s', '65536', '-n', '100']],
    ['ib_read_bw', ['-s', '65536', '-n', '100']],
    ['ib_write_lat', ['-s', '2', '-n', '200']],
    ['ib_send_lat', ['-s', '2', '-n', '200']],
    ['ib_read_lat', ['-s', '2', '-n', '200']],
    ['ib_atomic_lat', ['-n', '200']],
  ];
  for (const [cmd, args] of runs)
    for (const odp of cmd === 'ib_atomic_lat' ? [[]] : [[], ['--odp']])
      // perftest 4.5 itself refuses ODP atomics
      test(`${cmd} ${[...args, ...odp].join(' ')}: both sides exit 0 with their figures`, async () => {
        const { client } = await both(cmd, ['-d', 'pfr0', '-x', '0', ...args, ...odp]);
        expect(client).toMatch(/Device\s+: pfr0/);
        const n = args[args.indexOf('-n') + 1];
        // The results line: #bytes, #iterations, then figures.
        expect(client).toMatch(new RegExp(`^\\s*\\d+\\s+${n}\\s+[\\d.]+\\s+[\\d.]+`, 'm'));
      }, 90_000);
});

test('a program of its own evicts before every transfer: WRITE, SEND and READ fault, the device resolves each, every byte lands', async () => {
  const before = await queryStats(dev.dir);
  const r = spawnSync(odpLoop, ['65536'], { env: verbsEnv(dev.dir), input: 'write 20\nsend 20\nread 20\nexit\n', encoding: 'utf8', timeout: 60_000 });
  expect(r.stdout.split('\n').slice(1, 4)).toEqual(['ok 20', 'ok 20', 'ok 20']);
  expect(r.status).toBe(0);
  const after = await queryStats(dev.dir);
  const raised = after.faultsRaised - before.faultsRaised;
  // One fault at least per transfer (the destination evicted each time), every one resolved.
  expect(raised).toBeGreaterThanOrEqual(60);
  expect(after.faultsResolved - before.faultsResolved).toBe(raised);
  expect(after.faultsFailed - before.faultsFailed).toBe(0);
  // 60 WQEs sent, 20 receives taken, a CQE for each, nothing refused.
  expect(after.dataPath!.sendWqes - before.dataPath!.sendWqes).toBe(60);
  expect(after.dataPath!.recvWqes - before.dataPath!.recvWqes).toBe(20);
  expect(after.dataPath!.cqes - before.dataPath!.cqes).toBe(80);
  expect(after.dataPath!.refusedWqes - before.dataPath!.refusedWqes).toBe(0);
}, 90_000);

test.runIf(has('ibv_rc_pingpong'))(
  'a program killed mid-run has its resources released; the device goes on serving',
  async () => {
    const before = await queryStats(dev.dir);
    const port = String(21000 + (process.pid % 8000));
    const server = run(dev.dir, 'ibv_rc_pingpong', ['-g', '0', '-n', '1000000', '-p', port], 60_000);
    await new Promise((r) => setTimeout(r, 500));
    const client = run(dev.dir, 'ibv_rc_pingpong', ['-g', '0', '-n', '1000000', '-p', port, '127.0.0.1'], 60_000);
    // Running: both contexts open, ping-pong under way.
    for (let i = 0; i < 200 && (await queryStats(dev.dir)).openContexts < before.openContexts + 2; i++) await new Promise((r) => setTimeout(r, 25));
    await new Promise((r) => setTimeout(r, 500));
    client.kill();
    expect((await client.done).signal).toBe('SIGKILL');
    // The peer's sends now find no QP: it ends with an error completion, or we end it.
    const ended = await Promise.race([server.done, new Promise<undefined>((r) => setTimeout(() => r(undefined), 8000))]);
    if (!ended) server.kill();
    const s = ended ?? (await server.done);
    expect(s.status === 0).toBe(false);
    let after = await queryStats(dev.dir);
    for (let i = 0; i < 200 && after.openContexts > before.openContexts; i++) {
      await new Promise((r) => setTimeout(r, 25));
      after = await queryStats(dev.dir);
    }
    expect(after.openContexts).toBe(before.openContexts);
    // Both programs' PD, MR, CQ and QP (and the killed one's channel-less context) released by the device.
    expect(after.releasedObjects - before.releasedObjects).toBeGreaterThanOrEqual(8);
    await both('ibv_rc_pingpong', ['-g', '0', '-n', '100']);
  },
  90_000,
);

test.runIf(has('ib_write_bw'))(
  "a program killed in the middle of its transfers: the device survives its peer's writes into its memory and serves on",
  async () => {
    const before = await queryStats(dev.dir);
    const port = String(22000 + (process.pid % 8000));
    const args = ['-d', 'pfr0', '-x', '0', '-s', '65536', '-D', '30', '-p', port];
    const server = run(dev.dir, 'ib_write_bw', args, 60_000);
    for (let i = 0; i < 400 && !listening(Number(port)); i++) await new Promise((r) => setTimeout(r, 25));
    const client = run(dev.dir, 'ib_write_bw', [...args, '127.0.0.1'], 60_000);
    for (let i = 0; i < 200 && (await queryStats(dev.dir)).openContexts < before.openContexts + 2; i++) await new Promise((r) => setTimeout(r, 25));
    await new Promise((r) => setTimeout(r, 1000));
    // The server's memory is the one written: it goes first, writes in flight into it.
    server.kill();
    expect((await server.done).signal).toBe('SIGKILL');
    const c = await Promise.race([client.done, new Promise<undefined>((r) => setTimeout(() => r(undefined), 10_000))]);
    if (!c) client.kill();
    expect((c ?? (await client.done)).status === 0).toBe(false);
    let after = await queryStats(dev.dir);
    for (let i = 0; i < 200 && after.openContexts > before.openContexts; i++) {
      await new Promise((r) => setTimeout(r, 25));
      after = await queryStats(dev.dir);
    }
    expect(after.openContexts).toBe(before.openContexts);
    await both('ib_write_bw', ['-d', 'pfr0', '-x', '0', '-s', '65536', '-n', '100']);
  },
  90_000,
);

test.runIf(has('ibv_rc_pingpong'))(
  'the device killed mid-run: both programs end with an error, neither hangs',
  async () => {
    const own = await deviceProcess();
    const port = String(23000 + (process.pid % 8000));
    const server = run(own.dir, 'ibv_rc_pingpong', ['-g', '0', '-n', '1000000', '-p', port], 60_000);
    for (let i = 0; i < 400 && !listening(Number(port)); i++) await new Promise((r) => setTimeout(r, 25));
    const client = run(own.dir, 'ibv_rc_pingpong', ['-g', '0', '-n', '1000000', '-p', port, '127.0.0.1'], 60_000);
    for (let i = 0; i < 200 && (await queryStats(own.dir)).openContexts < 2; i++) await new Promise((r) => setTimeout(r, 25));
    await new Promise((r) => setTimeout(r, 500));
    own.child.kill('SIGKILL');
    const t0 = Date.now();
    const [s, c] = await Promise.all([server.done, client.done]);
    expect(Date.now() - t0).toBeLessThan(10_000);
    for (const r of [s, c]) {
      expect(r.signal).toBeNull(); // ended by itself, not by the timeout's kill
      expect(r.status).not.toBe(0);
    }
    expect(s.out + c.out).toMatch(/poll CQ failed|Failed status|Couldn't post/);
    await own.stop();
  },
  90_000,
);
