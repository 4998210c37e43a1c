// The programs' handshake (cli/programs/fabric-peer.ts): the client names its program and run,
// the server answers. Another program, a run past the server's limits, a body of the wrong
// shape or a peer without the token ends both sides (non-zero, the reason named, never a
// TypeError); strangers on the port during a run are rejected and counted, the run goes on;
// --supervise starts a server killed by a provider crash again on its port.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { LibfabricTransport } from '../../kernel-sim/index.js';
import { encodeHello } from '../../kernel-sim/fabric/framing.js';
import { libfabricHeader, Raw } from './raw.js';
import { built, ci, start, waitFor } from './spawn.js';

const dir = mkdtempSync(join(tmpdir(), 'pfr-handshake-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A server of `program` on a free port. */
async function serve(program: string, args: string[] = []) {
  const json = join(dir, `${program}-${process.pid}-${Date.now()}-server.json`);
  const server = start([program, '-p', '0', '--json', json, ...args]);
  const port = Number((await waitFor(server.output, /port (\d+)/))[1]);
  return { ...server, port, json };
}

/** A client of the programs' handshake that says what it is told to, then waits for what the server does. */
async function fakeClient(port: number) {
  return LibfabricTransport.connect({ host: '127.0.0.1', port, localNodes: [0], peers: [1] });
}

const params = { op: 'write', size: 4096, iters: 5, evict: false, odp: false, policy: 'touch-ahead', txDepth: 1, qps: 1, mtu: 1024 };

describe("the programs' limits in --help", () => {
  it('names the server limits, the token, --supervise and the transport limits', async () => {
    const help = start(['write-bw', '--help']);
    const out = (await help.exit).stdout.replace(/\s+/g, ' ');
    for (const s of ['--max-msg <bytes>', '--max-qps <n>', '--max-memory <bytes>', '--token <secret>', 'PFR_FABRIC_TOKEN', '--supervise'])
      expect(out).toContain(s);
    for (const limit of ['limits.maxWaiting', 'limits.helloTimeoutMs', 'limits.maxFrameBytes', 'limits.maxHeldBytes', 'limits.maxUnsentBytes'])
      expect(out).toContain(limit);
  });
});

describe.skipIf(!built && !ci)("the programs' handshake", () => {
  it('a client of another program, or past --max-qps, is refused: both sides end non-zero, naming it', async () => {
    const rc = await serve('rc-pingpong');
    const wrong = start(['write-bw', '127.0.0.1', '-p', String(rc.port), '-n', '5']);
    const [s1, c1] = await Promise.all([rc.exit, wrong.exit]);
    const mismatch = 'the client runs write-bw, this server runs rc-pingpong: start both sides with the same program';
    expect([s1.code, c1.code]).toEqual([1, 1]);
    expect(s1.stderr).toContain(mismatch);
    expect(c1.stderr).toContain(`refused the run: ${mismatch}`);

    const bw = await serve('write-bw', ['--max-qps', '2']);
    const many = start(['write-bw', '127.0.0.1', '-p', String(bw.port), '-q', '4', '-n', '5']);
    const [s2, c2] = await Promise.all([bw.exit, many.exit]);
    expect([s2.code, c2.code]).toEqual([1, 1]);
    expect(c2.stderr).toContain('refused the run: the client asks for 4 QPs, this server takes at most 2 (--max-qps)');
    expect(s2.stderr + c2.stderr).not.toMatch(/TypeError/);
  }, 60_000);

  it('malformed bodies (an op nobody offers, a QP number that is text) end the server with the field named, never a TypeError', async () => {
    const bogus = await serve('write-bw');
    const c1 = await fakeClient(bogus.port);
    c1.post({ program: 'write-bw', params: { ...params, op: 'bogus' } });
    expect(await c1.receive(10_000)).toEqual({ refused: expect.stringContaining('sent a malformed run: run.params.op must be one of') });
    c1.close();
    const e1 = await bogus.exit;
    expect(e1.code).toBe(1);
    expect(e1.stderr).toContain(
      'the client (node 0) sent a malformed run: run.params.op must be one of "send", "write", "read", "atomic", got "bogus"',
    );

    const qpns = await serve('write-bw');
    const c2 = await fakeClient(qpns.port);
    c2.post({ program: 'write-bw', params });
    expect(await c2.receive(10_000)).toEqual({ accepted: true });
    c2.post([{ node: 0, qpn: 'seventeen', psn: 0, addr: 0n, rkey: 0 }]);
    const e2 = await qpns.exit;
    c2.close();
    expect(e2.code).toBe(1);
    expect(e2.stderr).toContain('sent a malformed list of QPs: list of QPs[0].qpn must be an integer in 0..16777215, got "seventeen"');

    // Everything right up to the final word, which is not a list of counts.
    const last = await serve('write-bw');
    const c3 = await fakeClient(last.port);
    c3.post({ program: 'write-bw', params });
    expect(await c3.receive(10_000)).toEqual({ accepted: true });
    const theirs = await c3.exchange<Array<{ node: number }>>([{ node: 0, qpn: 17, psn: 0, addr: 0n, rkey: 0 }], 10_000);
    expect(theirs.map((e) => e.node)).toEqual([1]);
    expect(await c3.exchange('ready', 10_000)).toBe('ready');
    c3.post({ counts: 'lots' });
    const e3 = await last.exit;
    c3.close();
    expect(e3.code).toBe(1);
    expect(e3.stderr).toContain('sent a malformed final word: final word.counts must be a list of 1 items, got "lots"');
    expect(e1.stderr + e2.stderr + e3.stderr).not.toMatch(/TypeError|NaN/);
  }, 60_000);

  it('with --token, a client without it is refused and the server waits on; strangers during a run are rejected and counted', async () => {
    const json = join(dir, `token-${process.pid}-client.json`);
    const server = await serve('write-bw', ['--token', 'hunter2']);
    const without = start(['write-bw', '127.0.0.1', '-p', String(server.port), '-n', '5']);
    expect((await without.exit).code).toBe(1);
    // A stranger who says hello as node 2 before the client: refused, it is not the peer.
    const early = await Raw.open(server.port);
    early.send(encodeHello([2]));
    await early.closed;
    const client = start(['write-bw', '127.0.0.1', '-p', String(server.port), '-D', '2', '--json', json], { env: { PFR_FABRIC_TOKEN: 'hunter2' } });
    await waitFor(client.output, /remote address/);
    // During the run: a stranger's request is rejected in the connection manager, before any
    // endpoint exists for it (its bytes, were it a tagged message, never reach the parser).
    const during = await Raw.open(server.port);
    during.write(Buffer.concat([libfabricHeader({ op: 1, size: 18 }), Buffer.alloc(2)]));
    await during.closed;
    const [s, c] = await Promise.all([server.exit, client.exit]);
    expect([s.code, s.signal, c.code]).toEqual([0, null, 0]);
    const refusedBy = (JSON.parse(readFileSync(server.json, 'utf8')) as { results: { refusedBy: Record<string, number> } }).results.refusedBy;
    expect(refusedBy).toMatchObject({
      "a hello without this side's token": 2,
      'a connection request while every peer is connected': 1,
    });
    expect((JSON.parse(readFileSync(json, 'utf8')) as { results: { rdmaRefused: Record<string, number> } }).results.rdmaRefused).toEqual({});
  }, 60_000);

  it("--supervise: a provider crash on a stranger's message while the server waits starts it again on its port; the client is served", async () => {
    const server = start(['write-bw', '-p', '0', '--supervise', '-n', '20']);
    const port = Number((await waitFor(server.output, /port (\d+)/))[1]);
    const raw = await Raw.open(port);
    await raw.accepted;
    raw.write(Buffer.concat([libfabricHeader({ op: 1, size: 18 }), Buffer.alloc(2)]));
    const m = await waitFor(
      server.output,
      /the server process \(pid (\d+)\) was killed by SIGSEGV while it waited for a client .*; listening again on port (\d+)/,
    );
    expect(Number(m[2])).toBe(port);
    // The child started again says it listens, as the first did.
    await waitFor(server.output, /waiting for a client[\s\S]*waiting for a client/);
    const client = start(['write-bw', '127.0.0.1', '-p', String(port), '-n', '20']);
    const [s, c] = await Promise.all([server.exit, client.exit]);
    expect([s.code, s.signal, c.code]).toEqual([0, null, 0]);
    expect(s.stderr).toMatch(/libfabric crashed in its provider/);
  }, 60_000);
});
