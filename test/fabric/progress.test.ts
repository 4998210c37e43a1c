// How a connection waits for an answer it expects (LibfabricOptions.progress): 'wait' sleeps on
// libfabric's wait fd at once, 'poll' polls the CQ first for up to maxSpinUs, 'adaptive' for up
// to twice what the answers took. Checked: the options are validated; every mode moves the same
// bytes; 'wait' never polls; a poll happens only with an answer due (an idle transport polls
// nothing, so it makes no wake-ups); and between two processes a poll long enough catches the
// answers it waits for without sleeping.
import { readFileSync } from 'node:fs';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { LibfabricTransport, type ProgressMode } from '../../kernel-sim/index.js';
import { Access, Cluster, connectQps, mapRegion, SendFlags, WcStatus, WrOpcode } from '../../lib/index.js';
import { closeAll, next, track } from '../verbs/helpers.js';
import { built, ci, start, waitFor } from './spawn.js';

afterEach(() => closeAll());
const dir = mkdtempSync(join(tmpdir(), 'pfr-progress-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('progress options', () => {
  it.each([
    [{ progress: 'busy' }, TypeError, 'ERR_INVALID_ARG_VALUE', /progress must be one of adaptive, poll, wait/],
    [{ maxSpinUs: -1 }, RangeError, 'ERR_OUT_OF_RANGE', /maxSpinUs must be a number of µs in 0\.\.1000000/],
    [{ maxSpinUs: Number.NaN }, RangeError, 'ERR_OUT_OF_RANGE', /maxSpinUs/],
  ])('%j is refused before any socket', (extra, type, code, message) => {
    let err: unknown;
    try {
      LibfabricTransport.listen({ port: 0, localNodes: [1], ...(extra as object) });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(type);
    expect((err as { code?: string }).code).toBe(code);
    expect((err as Error).message).toMatch(message);
  });
});

describe.skipIf(!built && !ci)('progress between two transports', () => {
  async function pair(progress: ProgressMode) {
    const server = track(LibfabricTransport.listen({ port: 0, localNodes: [1], progress }));
    const client = track(await LibfabricTransport.connect({ host: '127.0.0.1', port: server.port, localNodes: [0], progress, maxSpinUs: 200 }));
    await server.waitForPeer(5000);
    const sides = [0, 1].map((node) => {
      const cluster = track(Cluster.create({ nodes: 2, transport: node === 0 ? client : server }));
      const ctx = cluster.openDevice(node);
      const pd = ctx.allocPd();
      const cq = ctx.createCq(64);
      const qp = ctx.createQp(pd, { sendCq: cq, recvCq: cq, cap: { maxSendWr: 64 } });
      const buf = track(mapRegion(1 << 20));
      const mr = ctx.regMr(pd, buf, 0, buf.size, Access.LOCAL_WRITE | Access.REMOTE_WRITE);
      return { cq, qp, buf, mr };
    });
    const [c, s] = sides as [(typeof sides)[0], (typeof sides)[0]];
    connectQps(c.qp, s.qp);
    return { client, c, s };
  }

  it.each(['wait', 'poll', 'adaptive'] as const)(
    '%s: writes land byte for byte; polls only with an answer due',
    async (mode) => {
      const { client, c, s } = await pair(mode);
      const src = new Uint8Array(c.buf.buffer);
      for (let i = 0; i < src.length; i++) src[i] = (i * 13 + 5) & 0xff;
      const idle0 = client.progressStats();
      // Connected and idle: nothing is due, nothing polls.
      await new Promise((r) => setTimeout(r, 300));
      expect(client.progressStats().spins).toBe(idle0.spins);
      for (let i = 0; i < 20; i++) {
        const offset = i * 4096;
        c.qp.postSend({
          wrId: i,
          opcode: WrOpcode.RDMA_WRITE,
          sgList: [{ addr: c.buf.address + BigInt(offset), length: 3000, lkey: c.mr.lkey }],
          sendFlags: SendFlags.SIGNALED,
          rdma: { remoteAddr: s.buf.address + BigInt(offset), rkey: s.mr.rkey },
        });
        expect((await next(c.cq, 20_000)).status).toBe(WcStatus.SUCCESS);
        const dst = new Uint8Array(s.buf.buffer);
        expect(Buffer.compare(dst.subarray(offset, offset + 3000), src.subarray(offset, offset + 3000))).toBe(0);
      }
      const st = client.progressStats();
      expect(st.mode).toBe(mode);
      // Every write's answer was timed from its send.
      expect(st.replies).toBeGreaterThanOrEqual(20);
      expect(st.replyUs).toBeGreaterThan(0);
      if (mode === 'wait') expect(st.spins).toBe(0);
      // 'poll' polls before each sleep with an answer due (one process here: the answer comes
      // only after the poll, which is bounded: 200 µs each).
      if (mode === 'poll') expect(st.spins).toBeGreaterThan(0);
      expect(st.spunUs).toBeLessThanOrEqual(st.spins * 200 + 5000);
      // Idle again: the count stays.
      const after = client.progressStats().spins;
      await new Promise((r) => setTimeout(r, 300));
      expect(client.progressStats().spins).toBe(after);
    },
    60_000,
  );

  it('two processes: a poll long enough catches the answers it waits for', async () => {
    const server = start(['send-lat', '-p', '0', '--progress', 'poll', '--max-spin-us', '20000']);
    const port = (await waitFor(server.output, /-p (\d+)/))[1]!;
    const json = join(dir, 'poll.json');
    const client = start([
      'send-lat',
      '127.0.0.1',
      '-p',
      port,
      '-s',
      '64',
      '-n',
      '300',
      '--progress',
      'poll',
      '--max-spin-us',
      '20000',
      '--json',
      json,
    ]);
    const [ce, se] = await Promise.all([client.exit, server.exit]);
    expect(ce.code, ce.stdout + ce.stderr).toBe(0);
    expect(se.code, se.stdout + se.stderr).toBe(0);
    const r = (
      JSON.parse(readFileSync(json, 'utf8')) as {
        results: {
          progress: { mode: string; spins: number; hits: number; replies: number };
          cpuUs: number;
          bytesVerified: number;
          mismatches: number;
        };
      }
    ).results;
    expect(r.mismatches).toBe(0);
    expect(r.bytesVerified).toBeGreaterThan(0);
    expect(r.progress.mode).toBe('poll');
    expect(r.progress.replies).toBeGreaterThanOrEqual(300);
    // Most polls end with the answer (20 ms is far past a round trip even on a loaded machine).
    expect(r.progress.hits).toBeGreaterThan(r.progress.spins * 0.5);
    expect(r.cpuUs).toBeGreaterThan(0);
  }, 90_000);
});
