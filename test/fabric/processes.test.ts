// Nodes in separate processes over libfabric (tcp on loopback): the CLI's server and client
// are real processes the tests start and stop. Under CI (CI set) these tests run and fail
// when the addon was built without libfabric; elsewhere they are skipped then.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { networkInterfaces, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { LibfabricTransport, peerTimeoutMs } from '../../kernel-sim/index.js';
import type { FaultTime, StallReport } from '../../cli/programs/fabric-peer.js';
import { Op } from '../../kernel-sim/fabric/wire-codec.js';
import { Raw } from './raw.js';
import { built, ci, freePort, start, waitFor } from './spawn.js';

const dir = mkdtempSync(join(tmpdir(), 'pfr-fabric-'));

afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Run `program` as a server (port 0) and a client against it; both write --json. */
async function pair(program: string, args: string[]) {
  const sj = join(dir, `${program}-${Date.now()}-server.json`);
  const cj = join(dir, `${program}-${Date.now()}-client.json`);
  const server = start([program, '-p', '0', '--json', sj]);
  const port = (await waitFor(server.output, /port (\d+)/))[1]!;
  // No warm-up: the byte counts below are the run's -n alone (perftest-options.test.ts tests the warm-up).
  const client = start([program, '127.0.0.1', '-p', port, '--warm_up', '0', ...args, '--json', cj]);
  const [s, c] = await Promise.all([server.exit, client.exit]);
  expect(c.stderr + s.stderr).not.toMatch(/failed|differ/);
  expect([c.code, s.code]).toEqual([0, 0]);
  type R = {
    bytesVerified: number;
    mismatches: number;
    error?: string;
    faults: { source: number; destination: number };
    nacks: number;
    retransmitted: number;
    peer?: { bytesVerified: number; mismatches: number; nacks: number; faultTime?: FaultTime; evictUs?: number };
    faultTime: FaultTime;
    evictUs: number;
    stall?: StallReport;
    cqEvents?: number;
  };
  const read = (f: string) => (JSON.parse(readFileSync(f, 'utf8')) as { results: R }).results;
  return { client: read(cj), server: read(sj), stdout: c.stdout };
}

describe.skipIf(!built && !ci)('nodes in two processes over libfabric tcp', () => {
  it('is built in (CI installs libfabric-dev)', () => {
    expect(built).toBe(true);
  });

  it('RDMA WRITE: faults at both ends (evicted pages), NACKs, retransmissions, bytes verified by the destination', async () => {
    const size = 64 * 1024;
    // -t 1: one write at a time, so that each one's source was evicted just before it.
    const r = await pair('write-bw', ['-s', String(size), '-n', '5', '-t', '1', '--evict']);
    expect(r.client.error).toBeUndefined();
    expect(r.client.faults.source).toBeGreaterThanOrEqual(5);
    expect(r.client.faults.destination).toBeGreaterThanOrEqual(1);
    expect(r.client.nacks).toBe(r.client.faults.destination);
    expect(r.client.retransmitted).toBeGreaterThanOrEqual(r.client.faults.source + r.client.faults.destination);
    expect(r.server.bytesVerified).toBe(size);
    expect(r.server.mismatches).toBe(0);
    expect(r.stdout).toMatch(/#bytes\s+#iterations\s+BW peak\[MB\/sec\]\s+BW average\[MB\/sec\]\s+MsgRate\[Mpps\]/);
  }, 60_000);

  it("stall mode: RMA writes block the server's provider thread (not its JS thread) in genuine faults its fault library resolves", async () => {
    const size = 64 * 1024;
    const iters = 5;
    const pages = (size / 4096) * iters;
    const r = await pair('write-bw', ['-s', String(size), '-n', String(iters), '--stall', '--evict']);
    expect(r.client.error).toBeUndefined();
    expect(r.server.bytesVerified).toBe(size);
    expect(r.server.mismatches).toBe(0);
    const st = r.server.stall!;
    // The server evicts its buffer before each write: every page of every write faults, on the
    // progress thread, and waits there until the SMMU stall is resolved and resumed.
    expect(st.pagesTouched).toBe(pages);
    expect(st.progressTid).not.toBe(st.jsTid);
    expect(st.faultTids).toEqual([st.progressTid]);
    expect(st.faultsByHandler).toBe(pages);
    expect(st.faultsNative).toBe(0);
    expect(st.smmuStalls).toBe(pages);
    expect(st.libraryFaults).toBe(pages);
    expect(r.client.faults.destination).toBe(pages);
    expect(r.client.nacks).toBe(0);
    expect(r.stdout).toMatch(/stall mode: 80 stalls of the server's provider thread/);
  }, 60_000);

  it("read-bw --stall: RMA reads block the server's provider thread in its faults; resident, the server's bytes arrive", async () => {
    const size = 64 * 1024;
    const pages = (size / 4096) * 3;
    const r = await pair('read-bw', ['-s', String(size), '-n', '3', '--stall', '--evict']);
    expect(r.client.error).toBeUndefined();
    // Evicted anonymous pages come back zero-filled: what the client read is checked against that.
    expect([r.client.bytesVerified, r.client.mismatches]).toEqual([size, 0]);
    const st = r.server.stall!;
    expect(st.faultTids).toEqual([st.progressTid]);
    expect(st.progressTid).not.toBe(st.jsTid);
    expect([st.smmuStalls, st.libraryFaults, st.faultsNative]).toEqual([pages, pages, 0]);
    expect(r.stdout).toMatch(/Connection type\s+: RC \(libfabric RMA, stall mode\)/);
    // Resident: no fault, the server's pattern read whole.
    const res = await pair('read-bw', ['-s', String(size), '-n', '2', '--stall']);
    expect(res.client.error).toBeUndefined();
    expect([res.client.bytesVerified, res.client.mismatches]).toEqual([size, 0]);
    expect(res.server.stall!.smmuStalls).toBe(0);
  }, 60_000);

  it('-a: every size from 2 to 2^23 bytes, one perftest row each (write-bw and send-lat), bytes verified', async () => {
    const sizes = Array.from({ length: 23 }, (_, i) => 2 ** (i + 1));
    const w = await pair('write-bw', ['-a', '-n', '2', '--evict']);
    expect(w.client.error).toBeUndefined();
    const rows = [...w.stdout.matchAll(/^\s+(\d+)\s+2\s+[\d.]+\s+[\d.]+\s+[\d.]+$/gm)].map((m) => Number(m[1]));
    expect(rows).toEqual(sizes);
    expect(w.server.bytesVerified).toBe(2 ** 23);
    expect(w.server.mismatches).toBe(0);
    const l = await pair('send-lat', ['-a', '-n', '1']);
    for (const side of [l.client, l.server]) {
      expect(side.error).toBeUndefined();
      expect(side.bytesVerified).toBe(sizes.reduce((a, b) => a + b, 0));
      expect(side.mismatches).toBe(0);
    }
    expect(l.stdout).toMatch(/every time in usec\)\n\s+#bytes #iterations\s+t_min/);
    const latRows = [...l.stdout.matchAll(/^\s+(\d+)\s+1(\s+[\d.]+){7}$/gm)].map((m) => Number(m[1]));
    expect(latRows).toEqual(sizes);
  }, 120_000);

  for (const type of ['FETCH_AND_ADD', 'CMP_AND_SWAP']) {
    it(`atomics (${type}): the server's evicted word and the client's evicted sink fault; every old value and the final word verified`, async () => {
      const iters = 20;
      const r = await pair('atomic-lat', ['-n', String(iters), '--evict', '-A', type]);
      expect(r.client.error).toBeUndefined();
      // Iteration i gets i back; the server's word ends at iters.
      expect(r.client.bytesVerified).toBe(8 * iters);
      expect(r.client.mismatches).toBe(0);
      expect(r.server.bytesVerified).toBe(8);
      expect(r.server.mismatches).toBe(0);
      expect(r.client.faults.source).toBeGreaterThanOrEqual(1);
      expect(r.client.faults.destination).toBeGreaterThanOrEqual(iters);
      expect(r.stdout).toMatch(/every time in usec\)\n\s+#bytes #iterations\s+t_min/);
    }, 60_000);
  }

  it('RDMA READ: the source faults in the server process, the sink in the client; every byte verified', async () => {
    const size = 32 * 1024;
    // -t 1: one read at a time, so that each one's sink was evicted just before it.
    const r = await pair('read-bw', ['-s', String(size), '-n', '4', '-t', '1', '--evict']);
    expect(r.client.error).toBeUndefined();
    expect(r.client.faults.source).toBeGreaterThanOrEqual(1);
    expect(r.client.faults.destination).toBeGreaterThanOrEqual(4);
    // A response is not ACKed: a fault at the client's sink makes the client ask again, the
    // server hears no NACK for it.
    expect(r.server.nacks).toBe(0);
    expect(r.client.bytesVerified).toBe(4 * size);
    expect(r.client.mismatches).toBe(0);
  }, 60_000);

  it('SEND (rc-pingpong): both sides evict before every message; both verify what they received', async () => {
    const size = 16 * 1024;
    const iters = 20;
    // -r 1: each receive is posted after its buffer was evicted (not 500 ahead).
    const r = await pair('rc-pingpong', ['-s', String(size), '-n', String(iters), '-r', '1', '--evict']);
    for (const side of [r.client, r.server]) {
      expect(side.error).toBeUndefined();
      expect(side.bytesVerified).toBe(iters * size);
      expect(side.mismatches).toBe(0);
      expect(side.faults.source).toBeGreaterThanOrEqual(iters);
      expect(side.faults.destination).toBeGreaterThanOrEqual(iters);
    }
    expect(r.client.nacks).toBeGreaterThanOrEqual(iters);
    expect(r.stdout).toMatch(/\d+ bytes in [\d.]+ seconds = [\d.]+ Mbit\/sec\n\d+ iters in [\d.]+ seconds = [\d.]+ usec\/iter/);
    // What the faults and the evictions cost, measured on each side and told to the client. A
    // fault's detection runs from its packet's issue on this side's clock: a peer's clock (its
    // process started at another moment) would add the gap between the two starts, ~1e6 µs.
    for (const side of [r.client, r.server]) {
      expect(side.faultTime.faults).toBeGreaterThanOrEqual(iters);
      expect(side.faultTime.totalUs).toBeGreaterThan(0);
      expect(side.faultTime.phasesUs.detect).toBeLessThan(100_000);
      expect(side.evictUs).toBeGreaterThan(0);
    }
    expect(r.client.peer?.faultTime).toEqual(r.server.faultTime);
    expect(r.client.peer?.evictUs).toBe(r.server.evictUs);
    // Lines are folded at 100 columns: any space may be a line break.
    expect(r.stdout).toMatch(/fault\s+time\s+\(measured.*?\):\s+here\s+\d+\s+faults,\s+[\d.]+\s+us\s+each.*?;\s+the\s+server\s+\d+\s+faults/s);
    expect(r.stdout).toMatch(/evicting\s+the\s+buffers\s+\(--evict\):\s+[\d.]+\s+ms\s+here,\s+[\d.]+\s+ms\s+on\s+the\s+other\s+side/);
  }, 60_000);

  it('rc-pingpong -e: both sides sleep on completion events (every one acknowledged); bytes verified over evicted buffers', async () => {
    const size = 4096;
    const iters = 20;
    const r = await pair('rc-pingpong', ['-s', String(size), '-n', String(iters), '-r', '1', '--evict', '-e']);
    for (const side of [r.client, r.server]) {
      expect(side.error).toBeUndefined();
      expect(side.bytesVerified).toBe(iters * size);
      expect(side.mismatches).toBe(0);
      expect(side.faults.destination).toBeGreaterThanOrEqual(iters);
      // Each side waits for its peer's message every iteration, on an empty CQ: at least one event each.
      expect(side.cqEvents).toBeGreaterThanOrEqual(iters);
    }
  }, 60_000);

  it('a server killed mid-transfer ends the WR with RETRY_EXC_ERR promptly, never a hang', async () => {
    const server = start(['write-bw', '-p', '0']);
    const port = (await waitFor(server.output, /port (\d+)/))[1]!;
    const client = start(['write-bw', '127.0.0.1', '-p', port, '-s', '64K', '-n', '1000000', '--evict']);
    await waitFor(client.output, /remote address/);
    await new Promise((r) => setTimeout(r, 500));
    server.child.kill('SIGKILL');
    const killedAt = Date.now();
    const c = await client.exit;
    expect(Date.now() - killedAt).toBeLessThan(10_000);
    expect(c.code).toBe(1);
    expect(c.stderr).toMatch(/a work request failed: .*RETRY_EXC_ERR/);
  }, 60_000);

  for (const mode of ['terminate', 'stall'] as const) {
    it(`a server that never answers (SIGSTOPped) ends the WR with RETRY_EXC_ERR within timeout × (retry_cnt + 1), ${mode} mode`, async () => {
      const server = start(['write-bw', '-p', '0']);
      try {
        const port = (await waitFor(server.output, /port (\d+)/))[1]!;
        const client = start([
          'write-bw',
          '127.0.0.1',
          '-p',
          port,
          '-s',
          '64K',
          '-n',
          '1000000',
          '--evict',
          ...(mode === 'stall' ? ['--stall'] : []),
        ]);
        await waitFor(client.output, /remote address/);
        await new Promise((r) => setTimeout(r, 1000));
        server.child.kill('SIGSTOP');
        const stoppedAt = Date.now();
        const c = await client.exit;
        // The programs' QPs: timeout 16 (268 ms), retry_cnt 7: 2.1 s of silence, then the
        // requester gives up; the rest is the program's 1 s goodbye to a peer that is gone.
        const limit = peerTimeoutMs(16, 7);
        // Silence counts from the last frame heard, up to a keepalive period (a quarter) before the stop.
        expect(Date.now() - stoppedAt).toBeGreaterThanOrEqual(limit * 0.75 - 300);
        expect(Date.now() - stoppedAt).toBeLessThan(limit + 6_000);
        expect(c.code).toBe(1);
        expect(c.stderr).toMatch(/a work request failed: transport retry counter exceeded \(RETRY_EXC_ERR\)/);
      } finally {
        server.child.kill('SIGCONT');
        server.child.kill('SIGKILL');
        await server.exit;
      }
    }, 60_000);
  }

  it('a refused connection is a clear error naming the address', async () => {
    const port = await freePort();
    const c = await start(['rc-pingpong', '127.0.0.1', '-p', String(port)]).exit;
    expect(c.code).toBe(1);
    expect(c.stderr).toContain(`cannot connect to 127.0.0.1:${port} over libfabric tcp: nothing listens there`);
    expect(c.stderr).toContain('Connection refused');
  }, 30_000);

  it('a port in use names the port and suggests -p 0; a host that does not resolve says so', async () => {
    const first = LibfabricTransport.listen({ port: 0, localNodes: [1] });
    try {
      expect(() => LibfabricTransport.listen({ port: first.port, localNodes: [2] })).toThrow(
        expect.objectContaining({ code: 'EADDRINUSE', message: expect.stringContaining(`port ${first.port} on 127.0.0.1 is in use`) }),
      );
      expect(() => LibfabricTransport.listen({ port: first.port, localNodes: [2] })).toThrow(/-p 0 for any free port/);
    } finally {
      first.close();
    }
    await expect(LibfabricTransport.connect({ host: 'no-such-host.invalid', port: 1, localNodes: [0] })).rejects.toMatchObject({
      code: 'ENOTFOUND',
      message: expect.stringContaining('host no-such-host.invalid does not resolve'),
    });
  });

  it('bad options and a provider without connected endpoints are clear errors', () => {
    expect(() => LibfabricTransport.listen({ port: 0, localNodes: [1], provider: 'udp' as never })).toThrow(
      expect.objectContaining({ code: 'ERR_INVALID_ARG_VALUE', message: expect.stringContaining('provider must be one of tcp, shm, verbs') }),
    );
    expect(() => LibfabricTransport.listen({ port: 70000, localNodes: [1] })).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }));
    expect(() => LibfabricTransport.listen({ port: 0, localNodes: [] })).toThrow(expect.objectContaining({ code: 'ERR_INVALID_ARG_TYPE' }));
    expect(() => LibfabricTransport.listen({ port: 0, localNodes: [1], peerTimeoutMs: 0 })).toThrow(
      expect.objectContaining({ code: 'ERR_OUT_OF_RANGE', message: expect.stringContaining('peerTimeoutMs must be a number of milliseconds >= 10') }),
    );
    expect(() => LibfabricTransport.listen({ port: 0, localNodes: [1], provider: 'shm' })).toThrow(
      expect.objectContaining({
        code: 'ENODATA',
        message: expect.stringContaining('(shm: reliable datagrams only, and CQs without a wait fd): use provider tcp'),
      }),
    );
  });

  it('a server refuses connections that never say hello (closing, sending garbage, staying silent) and serves its real client', async () => {
    const sj = join(dir, `refuse-${Date.now()}-server.json`);
    const cj = join(dir, `refuse-${Date.now()}-client.json`);
    const server = start(['write-bw', '-p', '0', '--json', sj]);
    const port = Number((await waitFor(server.output, /port (\d+)/))[1]);
    (await Raw.open(port)).close();
    const garbage = await Raw.open(port);
    garbage.send(Uint8Array.of(0xff, 0, 0));
    await garbage.closed;
    const client = start(['write-bw', '127.0.0.1', '-p', String(port), '-s', '4096', '-n', '5', '--json', cj]);
    // Connected before the client (while it starts), never a hello: it must not be the one the
    // server swaps its buffer's address and key with (it is cut after the peer timeout).
    const silent = await Raw.open(port);
    const [s, c] = await Promise.all([server.exit, client.exit]);
    silent.close();
    expect(c.stderr + s.stderr).not.toMatch(/failed|differ|Error/);
    expect([c.code, s.code]).toEqual([0, 0]);
    const results = (f: string) =>
      (JSON.parse(readFileSync(f, 'utf8')) as { results: { bytesVerified: number; mismatches: number; refused: number } }).results;
    expect(results(sj)).toMatchObject({ bytesVerified: 4096, mismatches: 0 });
    expect(results(sj).refused).toBeGreaterThanOrEqual(2);
    expect(results(cj).refused).toBe(0);
    expect(silent.frames.map((f) => f.op)).toEqual([Op.HELLO]);
  }, 60_000);

  it('a server listens on loopback only, unless --bind 0.0.0.0', async () => {
    const external = Object.values(networkInterfaces())
      .flat()
      .find((a) => a?.family === 'IPv4' && !a.internal)?.address;
    if (!external) return; // no address but loopback: nothing to tell apart
    for (const [args, reachable] of [
      [[], false],
      [['--bind', '0.0.0.0'], true],
    ] as const) {
      const server = start(['rc-pingpong', '-p', '0', ...args]);
      const port = Number((await waitFor(server.output, /port (\d+)/))[1]);
      const reached = await new Promise<boolean>((resolve) => {
        const sock = connect(port, external);
        sock.on('connect', () => {
          sock.destroy();
          resolve(true);
        });
        sock.on('error', () => resolve(false));
      });
      server.child.kill('SIGTERM');
      await server.exit;
      expect([args, reached]).toEqual([args, reachable]);
    }
  }, 30_000);

  it('without HOST the server says how to start the other side', async () => {
    const server = start(['rc-pingpong', '-p', '0']);
    const m = await waitFor(server.output, /start the other side with:\n\s+npx pagefault-rdma rc-pingpong \S+ -p (\d+)/);
    expect(Number(m[1])).toBeGreaterThan(0);
    server.child.kill('SIGTERM');
    await server.exit;
  }, 30_000);

  for (const program of ['rc-pingpong', 'write-bw'])
    for (const victim of ['client', 'server'] as const) {
      it(`${program}: the ${victim} killed mid-run ends the other side non-zero, naming it, within the peer timeout`, async () => {
        const server = start([program, '-p', '0']);
        const port = (await waitFor(server.output, /port (\d+)/))[1]!;
        const client = start([program, '127.0.0.1', '-p', port, '-s', '16K', '-n', '1000000']);
        await waitFor(client.output, /remote address/);
        await new Promise((r) => setTimeout(r, 1000));
        const [killed, survivor] = victim === 'client' ? [client, server] : [server, client];
        killed.child.kill('SIGKILL');
        const killedAt = Date.now();
        const s = await survivor.exit;
        // A killed process's connection shuts at once; the peer timeout bounds a silent one.
        expect(Date.now() - killedAt).toBeLessThan(peerTimeoutMs(16, 7) + 3_000);
        expect(s.code).toBe(1);
        const name =
          victim === 'client' ? /the client \(node 0\) went away/ : new RegExp(`the server \\(node 1 at 127\\.0\\.0\\.1:${port}\\) went away`);
        expect(s.stderr).toMatch(name);
      }, 60_000);
    }

  it('sizes past what the programs carry are refused at once, the limit named', async () => {
    const big = await start(['write-bw', '127.0.0.1', '-s', '2047M']).exit;
    expect(big.code).toBe(1);
    expect(big.stderr).toMatch(/2047M is larger than these programs carry between processes, 1G: .*peer timeout \(2148 ms\)/);
    const huge = await start(['read-bw', '-s', '4G']).exit;
    expect(huge.code).toBe(1);
    expect(huge.stderr).toContain("4G is larger than the largest message, 2^31 bytes (the modelled port's max_msg_sz)");
  }, 30_000);

  it("perftest's header block, -q lanes, -t depth and -b: both directions verified", async () => {
    const r = await pair('write-bw', ['-s', '16K', '-n', '20', '-q', '2', '-t', '4', '-b', '--evict']);
    for (const side of [r.client, r.server]) {
      expect(side.error).toBeUndefined();
      // Each side checks the last write into each of its two lanes' slots.
      expect(side.bytesVerified).toBe(2 * 16 * 1024);
      expect(side.mismatches).toBe(0);
    }
    expect(r.stdout).toMatch(
      /RDMA_Write BW Test\n Device\s+: pfr0\n Number of qps\s+: 2\n Connection type : RC\n TX depth\s+: 4\n CQ Moderation\s+: 1\n Mtu\s+: 1024\[B\]/,
    );
    expect(r.stdout).toMatch(/On-demand paging: ON \(touch-ahead\)\n Bidirectional\s+: ON/);
    const addresses = [
      // perftest's line, 86 columns: in a pipe (80) RKey and VAddr go on, aligned, on the next line.
      ...r.stdout.matchAll(/^ local address: LID 0x0000 QPN 0x[0-9a-f]{4} PSN 0x[0-9a-f]{6}\n {16}RKey 0x[0-9a-f]{6} VAddr 0x[0-9a-f]{12}$/gm),
    ];
    expect(addresses).toHaveLength(2);
    expect(r.stdout).toMatch(/^ remote address: LID 0x0001 QPN/m);
    // 2 lanes × 20 writes.
    expect(r.stdout).toMatch(/^\s+16384\s+40\s+[\d.]+\s+[\d.]+\s+[\d.]+$/m);
  }, 60_000);

  it('-D: a duration instead of a count; latency columns are measured per WR, not one value repeated', async () => {
    const r = await pair('write-lat', ['-D', '2']);
    expect(r.client.error).toBeUndefined();
    const row = /^\s+2\s+(\d+)((?:\s+[\d.]+){7})$/m.exec(r.stdout)!;
    expect(Number(row[1])).toBeGreaterThan(1);
    const [min, max, typical] = row[2]!.trim().split(/\s+/).map(Number);
    expect(min).toBeLessThan(max!);
    expect(typical).toBeGreaterThanOrEqual(min!);
    expect(r.stdout).toMatch(/Duration\s+: 2 s/);
  }, 60_000);

  it('--run_infinitely prints a line per period until SIGINT, then both sides exit 0', async () => {
    const server = start(['write-bw', '-p', '0']);
    const port = (await waitFor(server.output, /port (\d+)/))[1]!;
    const client = start(['write-bw', '127.0.0.1', '-p', port, '-s', '4K', '-D', '1', '--run_infinitely']);
    await waitFor(client.output, /^\s+4096\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\n(?:.*\n)*\s+4096\s+\d+\s+[\d.]+/m, 30_000);
    client.child.kill('SIGINT');
    const [c, s] = await Promise.all([client.exit, server.exit]);
    expect([c.code, s.code]).toEqual([0, 0]);
    expect(c.stderr + s.stderr).not.toMatch(/went away|failed|differ/);
    expect(c.stdout).toMatch(/mismatches 0/);
  }, 60_000);

  it("atomic-lat refuses -s, -a and --report_gbits by name (perftest's atomics are 8 bytes); send-lat refuses -q", async () => {
    for (const flag of [['-s', '64'], ['-a'], ['--report_gbits']]) {
      const e = await start(['atomic-lat', ...flag]).exit;
      expect(e.code).toBe(1);
      expect(e.stderr).toMatch(
        new RegExp(
          `^error: (-[sa], )?${flag[0] === '-s' ? '--size' : flag[0] === '-a' ? '--all' : '--report_gbits'} is refused: perftest's atomics are 8 bytes`,
        ),
      );
    }
    const q = await start(['send-lat', '127.0.0.1', '-q', '2']).exit;
    expect(q.code).toBe(1);
    expect(q.stderr).toContain('a ping-pong has one message each way at a time on one QP');
  }, 30_000);

  it('rc-pingpong -O -P -r -m: implicit ODP, prefetched, rx depth and MTU, bytes verified; -P alone is refused as ibv_rc_pingpong does', async () => {
    const r = await pair('rc-pingpong', ['-s', '8K', '-n', '20', '-O', '-P', '-r', '4', '-m', '2048', '--evict']);
    for (const side of [r.client, r.server]) {
      expect(side.error).toBeUndefined();
      expect(side.bytesVerified).toBe(20 * 8192);
      expect(side.mismatches).toBe(0);
    }
    expect(r.stdout).toMatch(/ {2}local address: {2}LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}/);
    expect(r.stdout).toContain('MTU 2048, implicit ODP, prefetched, rx depth 4');
    const p = await start(['rc-pingpong', '127.0.0.1', '-P']).exit;
    expect(p.code).toBe(1);
    expect(p.stderr).toContain('-P: prefetch is valid only with an on-demand memory region (-o or -O)');
  }, 60_000);

  // rc-pingpong's server takes more events than one exchange item list holds (4096): they cross in pieces.
  for (const [program, run] of [
    ['rc-pingpong', ['-n', '120', '-r', '1']],
    ['write-lat', ['-n', '10']],
  ] as const) {
    it(`${program} --trace: each side writes its faults, and the client's file holds the server's too`, async () => {
      const sf = join(dir, `${program}-server.trace.json`);
      const cf = join(dir, `${program}-client.trace.json`);
      const server = start([program, '-p', '0', '--trace', sf]);
      const port = (await waitFor(server.output, /port (\d+)/))[1]!;
      const c = await start([program, '127.0.0.1', '-p', port, ...run, '--evict', '--trace', cf]).exit;
      const s = await server.exit;
      expect([c.code, s.code]).toEqual([0, 0]);
      type Ev = { ph: string; name: string; pid: number; args?: { name?: string } };
      const events = (f: string) => (JSON.parse(readFileSync(f, 'utf8')) as { traceEvents: Ev[] }).traceEvents;
      const names = (evs: Ev[]) => evs.filter((e) => e.name === 'process_name').map((e) => e.args!.name!);
      const client = events(cf);
      const server_ = events(sf);
      expect(server_.filter((e) => e.ph !== 'M').length).toBeGreaterThan(0);
      expect(names(client).some((n) => n.startsWith('server: node 1'))).toBe(true);
      expect(names(client).some((n) => n.startsWith('client: node 0'))).toBe(true);
      // The client's own faults (its evicted buffer) are there besides the server's.
      const clientPids = new Set(client.filter((e) => e.name === 'process_name' && e.args!.name!.startsWith('client')).map((e) => e.pid));
      expect(client.filter((e) => e.ph !== 'M' && clientPids.has(e.pid)).length).toBeGreaterThan(0);
      // Every event of the server's own file is in the client's, however many.
      const serverPids = new Set(client.filter((e) => e.name === 'process_name' && e.args!.name!.startsWith('server')).map((e) => e.pid));
      const fromServer = client.filter((e) => e.ph !== 'M' && serverPids.has(e.pid)).length;
      expect(fromServer).toBe(server_.filter((e) => e.ph !== 'M').length);
      if (program === 'rc-pingpong') expect(fromServer).toBeGreaterThan(4096);
    }, 60_000);
  }
});
