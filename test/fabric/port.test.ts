// A server's port, tried as an attacker would (issue 36), from raw TCP sockets: libfabric's own
// parser before any hello (in a child server whose exit status and signal are asserted),
// strangers who say hello and leave, answers for nothing, and crowds and floods past each of
// the transport's limits. Each is refused and counted (or, where libfabric itself crashes,
// the crash is that process's alone and said so), and the real client is served after it.
import { afterEach, describe, expect, it } from 'vitest';
import { AckResp, LibfabricTransport, type AckPacket } from '../../kernel-sim/index.js';
import { encodeExchange } from '../../kernel-sim/fabric/exchange-codec.js';
import { encodeChunk, encodeHello } from '../../kernel-sim/fabric/framing.js';
import { encodePacket } from '../../kernel-sim/fabric/packet-layout.js';
import { WcStatus } from '../../lib/index.js';
import { closeAll, track } from '../verbs/helpers.js';
import { startServer, realClient, type PortServer, type Report } from './port-server.js';
import { libfabricHeader, Raw, until } from './raw.js';
import { built, ci } from './spawn.js';

afterEach(() => closeAll());

/** Ask `s` for its report until `ok` holds of it (or fail naming `what`). */
async function reported(s: PortServer, what: string, ok: (r: Report) => boolean, timeoutMs = 10_000): Promise<Report> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const r = await s.report();
    if (ok(r)) return r;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(r)}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

const by = (r: Report, reason: string) => r.stats.refusedBy[reason] ?? 0;

describe.skipIf(!built && !ci)("libfabric's own parser, before any hello (a child server; its exit status and signal)", () => {
  it('a header whose hdr_size is under its own size: the length the provider reports is refused before a view is made; the server lives on', async () => {
    const s = await startServer();
    expect(s.alive()).toBe(true);
    const raw = await Raw.open(s.port);
    await raw.accepted;
    // libfabric 1.17 tcp takes hdr_size 8 as given and reports a length past the receive slot.
    raw.write(Buffer.concat([libfabricHeader({ hdrSize: 8, size: 16 }), Buffer.alloc(8)]));
    await raw.closed;
    const r = await reported(s, 'the refusal', (x) => by(x, 'a libfabric message whose length is past its receive slot') === 1);
    expect(r.stats.refused).toBe(1);
    expect(s.alive()).toBe(true);
    expect(await realClient(s.port)).toBe(WcStatus.SUCCESS);
    expect([s.outsideByMem(), s.alive()]).toEqual([0, true]);
    s.child.kill('SIGKILL');
  });

  // Unchanged on libfabric's main as of 2026-08: xnet_handle_tag asserts ep->srx and
  // xnet_handle_ack a non-empty queue, both compiled out of a release build. If this fails,
  // the installed libfabric fixed them: README's "Security" says what a listener exposes.
  it.each([
    ['a tagged message (op 1) to an endpoint with no shared receive context', Buffer.concat([libfabricHeader({ op: 1, size: 18 }), Buffer.alloc(2)])],
    ['an ACK (op_data 2) for no send', libfabricHeader({ opData: 2, size: 16 })],
  ])('%s: libfabric 1.17 tcp dies of SIGSEGV in that process alone, which says so', async (_what, message) => {
    const [s, bystander] = await Promise.all([startServer(), startServer()]);
    expect(s.alive()).toBe(true);
    const raw = await Raw.open(s.port);
    await raw.accepted;
    expect(s.alive()).toBe(true);
    raw.write(message);
    const e = await s.exit;
    expect([e.code, e.signal]).toEqual([null, 'SIGSEGV']);
    expect(e.stderr).toMatch(/pagefault-rdma: libfabric crashed in its provider on a message a peer sent this process/);
    // Another server (another process) is not touched.
    expect(bystander.alive()).toBe(true);
    expect(await realClient(bystander.port)).toBe(WcStatus.SUCCESS);
    bystander.child.kill('SIGKILL');
  });
});

describe.skipIf(!built && !ci)('strangers and answers for nothing', () => {
  it("a stranger's hello as another node, then its close, its silence or a stall mid-frame, is that stranger's loss alone", async () => {
    const server = track(LibfabricTransport.listen({ port: 0, localNodes: [1], peerTimeoutMs: 800 }));
    const lost: number[] = [];
    server.onPeerLost((n) => lost.push(n));
    const client = track(await LibfabricTransport.connect({ host: '127.0.0.1', port: server.port, localNodes: [0] }));
    // The server waits on its client's word while the strangers come and go.
    const waiting = server.receive<string>(20_000);
    const closer = await Raw.open(server.port);
    closer.send(encodeHello([2]));
    await until("the closer's hello", () => server.hasNode(2));
    closer.close();
    const silent = await Raw.open(server.port);
    silent.send(encodeHello([3]));
    const staller = await Raw.open(server.port);
    staller.send(encodeHello([4]));
    await until('their hellos', () => server.hasNode(3) && server.hasNode(4));
    // A provider message announced as 1016 bytes more, 10 of them sent: then nothing.
    staller.write(Buffer.concat([libfabricHeader({ size: 16 + 1016 }), Buffer.alloc(10)]));
    await until('the three strangers lost', () => [2, 3, 4].every((n) => lost.includes(n)), 10_000);
    expect(lost.sort()).toEqual([2, 3, 4]);
    client.post('still here');
    expect(await waiting).toBe('still here');
    expect(server.hasNode(0) && !lost.includes(0)).toBe(true);
  }, 30_000);

  it('with peers, a hello naming another node is refused; with a token, one without it', async () => {
    const s = await startServer({ token: 's3cret', limits: { helloTimeoutMs: 500 } });
    const other = await Raw.open(s.port);
    other.send(encodeHello([2]));
    await other.closed;
    // A client without the token (or with another) is refused; one with it is served.
    await expect(realClient(s.port)).rejects.toThrow(/cannot connect/);
    await expect(realClient(s.port, 0x5a, { token: 'guess' })).rejects.toThrow(/cannot connect/);
    expect(await realClient(s.port, 0x5a, { token: 's3cret' })).toBe(WcStatus.SUCCESS);
    const r = await s.report();
    expect(by(r, "a hello without this side's token")).toBe(3);
    s.child.kill('SIGKILL');
  }, 30_000);

  it('100 ACKs for transfers never sent are refused and counted; the engine counts nothing in flight', async () => {
    const s = await startServer();
    const raw = await Raw.open(s.port);
    raw.send(encodeHello([0]));
    const ack = (tid: number): AckPacket => ({
      type: 'ack',
      src: 0,
      dst: 1,
      pd: 1,
      va: 0n,
      tid,
      seq: 0,
      length: 4096,
      arrivesAt: 0,
      resp: AckResp.OK,
      verdicts: [{ seq: 0, count: 1, resp: AckResp.OK, walkUs: 0 }],
    });
    for (let i = 0; i < 100; i++) raw.send(encodePacket(ack(1000 + i)));
    const r = await reported(s, 'the 100 answers', (x) => x.answersRefused === 100);
    expect(r.inflight).toBe(0);
    raw.close();
    await reported(s, 'the stranger gone', (x) => x.lost.includes(0));
    expect(await realClient(s.port)).toBe(WcStatus.SUCCESS);
    expect((await s.report()).inflight).toBe(0);
    s.child.kill('SIGKILL');
  }, 30_000);
});

describe.skipIf(!built && !ci)("crowds and floods past the transport's limits", () => {
  it('bare TCP connections (no connection request) are cut after the hello timeout, and past maxWaiting at once; descriptors come back', async () => {
    const s = await startServer({ limits: { helloTimeoutMs: 500, maxWaiting: 8 } });
    const before = (await s.report()).fds;
    const crowd = await Promise.all(Array.from({ length: 100 }, () => Raw.bare(s.port)));
    // Past maxWaiting the oldest go at once: 8 at most are still open a moment later.
    await until('92 cut', () => crowd.filter((c) => !c.open).length >= 92, 8_000);
    await Promise.all(crowd.map((c) => c.closed));
    const r = await reported(s, 'the crowd counted', (x) => by(x, 'a connection that sent no connection request') === 100);
    expect(r.fds).toBeLessThanOrEqual(before + 2);
    expect(await realClient(s.port)).toBe(WcStatus.SUCCESS);
    s.child.kill('SIGKILL');
  }, 30_000);

  it('connection requests past maxWaiting are rejected in the connection manager; the waiting ones are cut at the hello timeout', async () => {
    const s = await startServer({ limits: { helloTimeoutMs: 600, maxWaiting: 8 } });
    const before = (await s.report()).fds;
    const crowd: Raw[] = [];
    for (let i = 0; i < 30; i++) crowd.push(await Raw.open(s.port));
    const r1 = await reported(s, 'the rejections', (x) => by(x, 'a connection request beyond limits.maxWaiting') === 22);
    expect(r1.fds).toBeLessThanOrEqual(before + 8 * 8);
    await Promise.all(crowd.map((c) => c.closed));
    const r2 = await reported(s, 'the cut', (x) => by(x, 'no hello within the hello timeout') === 8);
    expect(r2.fds).toBeLessThanOrEqual(before + 2);
    expect(await realClient(s.port)).toBe(WcStatus.SUCCESS);
    s.child.kill('SIGKILL');
  }, 30_000);

  it('a chunked frame past maxFrameBytes, and chunks past maxHeldBytes, cut their connection; the limit is named', async () => {
    const s = await startServer({ limits: { maxFrameBytes: 8 << 20, maxHeldBytes: 4 << 20 } });
    const big = await Raw.open(s.port);
    big.send(encodeHello([0]));
    big.send(encodeChunk(16 << 20, 0, new Uint8Array(1 << 20)));
    await big.closed;
    const held = await Raw.open(s.port);
    held.send(encodeHello([0]));
    held.send(encodeChunk(6 << 20, 0, new Uint8Array(3 << 20)));
    held.send(encodeChunk(6 << 20, 3 << 20, new Uint8Array(3 << 20)));
    await held.closed;
    const r = await reported(
      s,
      'both refused',
      (x) =>
        by(x, 'a chunked frame larger than limits.maxFrameBytes') === 1 && by(x, 'a chunk beyond limits.maxHeldBytes') === 1 && x.lost.length === 2,
    );
    expect(r.rssKiB).toBeLessThan(512 << 10);
    expect(await realClient(s.port)).toBe(WcStatus.SUCCESS);
    s.child.kill('SIGKILL');
  }, 30_000);

  it('a peer that reads nothing of what it is sent is cut at maxUnsentBytes', async () => {
    const server = track(LibfabricTransport.listen({ port: 0, localNodes: [1], limits: { maxUnsentBytes: 4 << 20 } }));
    const raw = await Raw.open(server.port);
    raw.pause();
    raw.send(encodeHello([0]));
    await until('its hello', () => server.hasNode(0));
    const body = Array.from({ length: 16 }, () => 'x'.repeat(65_536));
    try {
      for (let i = 0; i < 64; i++) {
        server.post(body);
        await new Promise((resolve) => setImmediate(resolve));
      }
    } catch (e) {
      // Cut: the exchange has no peer any more.
      expect((e as { code?: string }).code).toBe('ENOTCONN');
    }
    await until(
      'the cut',
      () => !server.hasNode(0) || (server.stats().refusedBy['a peer that does not read what it is sent: limits.maxUnsentBytes'] ?? 0) > 0,
    );
    expect(server.stats().refusedBy['a peer that does not read what it is sent: limits.maxUnsentBytes']).toBe(1);
    raw.close();
  }, 30_000);

  it("an exchange from a connection that is not the exchange's peer is refused; the server serves on", async () => {
    const s = await startServer({ peers: null });
    const raw = await Raw.open(s.port);
    raw.send(encodeHello([0]));
    await raw.accepted;
    const stranger = await Raw.open(s.port);
    stranger.send(encodeHello([2]));
    stranger.send(encodeExchange({ qpn: 1 }));
    await reported(s, 'the refusal', (x) => by(x, 'an exchange from a connection that is not the peer') === 1);
    raw.close();
    stranger.close();
    await reported(s, 'both gone', (x) => x.lost.includes(0) && x.lost.includes(2));
    expect(await realClient(s.port)).toBe(WcStatus.SUCCESS);
    s.child.kill('SIGKILL');
  }, 30_000);
});
