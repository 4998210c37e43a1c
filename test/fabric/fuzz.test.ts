// A bounded fuzz of a recorded session (session.ts) against a server in a child process: each
// run replays the real client's frames with a few mutations from a raw socket. Over the whole
// run: the server never crashes or hangs (it answers every report within a deadline), no byte
// lands outside its MR (read through /proc/PID/mem), the real client is served every few runs
// and at the end, and the server's RSS and descriptors stay bounded. The seed is printed;
// FUZZ_SEED=… replays a run, FUZZ_RUNS=… makes it longer (README, docs/testing.md).
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { WcStatus } from '../../lib/index.js';
import { Op } from '../../kernel-sim/fabric/wire-codec.js';
import { realClient, startServer, type PortServer, type Report } from './port-server.js';
import { mutate, record, replay, type Mutation } from './session.js';
import { built, ci } from './spawn.js';

const RUNS = Number(process.env.FUZZ_RUNS ?? 120);
const SEED = Number(process.env.FUZZ_SEED ?? Date.now() % 2 ** 31);
/** The real client comes every this many runs (and after the last). */
const CLIENT_EVERY = 20;
/** A server that takes longer than this to answer a report is hung. */
const REPORT_MS = 5_000;

const mutation: fc.Arbitrary<Mutation> = fc.oneof(
  // Most flips land in the first bytes, where the opcodes, flags, lengths and counts are.
  fc.record({ kind: fc.constant('flip' as const), msg: fc.nat(), at: fc.oneof(fc.nat({ max: 63 }), fc.nat()), bit: fc.nat({ max: 7 }) }),
  fc.record({ kind: fc.constant('truncate' as const), msg: fc.nat(), at: fc.nat() }),
  fc.record({ kind: fc.constant('splice' as const), msg: fc.nat(), at: fc.nat(), from: fc.nat(), fromAt: fc.nat() }),
  fc.record({ kind: fc.constant('duplicate' as const), msg: fc.nat() }),
  fc.record({ kind: fc.constant('drop' as const), msg: fc.nat() }),
  fc.record({ kind: fc.constant('swap' as const), msg: fc.nat(), with: fc.nat() }),
);

/** The server's report, or a failure naming a hang. */
async function report(s: PortServer): Promise<Report> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      s.report(),
      new Promise<never>(
        (_, reject) => (timer = setTimeout(() => reject(new Error(`the server did not answer within ${REPORT_MS} ms: hung`)), REPORT_MS)),
      ),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

describe.skipIf(!built && !ci)('a fuzz of recorded sessions against a server', () => {
  it(`${RUNS} mutated sessions: no crash, no hang, no byte outside the MR, the real client served, RSS and descriptors bounded`, async () => {
    console.log(`fuzz: seed ${SEED}, ${RUNS} runs (FUZZ_SEED=${SEED} replays them)`);
    const s = await startServer({ peerTimeoutMs: 600, limits: { helloTimeoutMs: 400 } });
    const session = await record(s.port);
    expect(session.length).toBeGreaterThanOrEqual(4);
    const samples: Array<{ rssKiB: number; heapKiB: number; fds: number }> = [];
    // Connections bound as node 0 so far (the recording's, the fuzzed ones a PING showed taken,
    // the real client's): each must be let go before the next hello as node 0 may be taken.
    let bound = 1;
    let runs = 0;
    const released = async () => {
      for (let r = await report(s); r.lost.length < bound; r = await report(s)) await new Promise((resolve) => setTimeout(resolve, 20));
    };
    await released();
    const first = await report(s);
    await fc.assert(
      fc.asyncProperty(fc.array(mutation, { minLength: 1, maxLength: 3 }), async (mutations) => {
        const raw = await replay(s.port, mutate(session, mutations));
        await new Promise((resolve) => setTimeout(resolve, 15));
        // Bound by its hello (the server said so with a PING): the server must let it go.
        if (raw.frames.some((f) => f.op === Op.PING)) bound++;
        raw.close();
        await raw.closed;
        await released();
        const r = await report(s);
        samples.push({ rssKiB: r.rssKiB, heapKiB: r.heapKiB, fds: r.fds });
        expect(s.alive()).toBe(true);
        expect([r.outside, s.outsideByMem()]).toEqual([0, 0]);
        if (++runs % CLIENT_EVERY === 0) {
          expect(await realClient(s.port)).toBe(WcStatus.SUCCESS);
          bound++;
          await released();
        }
      }),
      { seed: SEED, numRuns: RUNS, endOnFailure: true },
    );
    expect(await realClient(s.port)).toBe(WcStatus.SUCCESS);
    const last = await report(s);
    const rss = samples.map((x) => x.rssKiB);
    const fds = samples.map((x) => x.fds);
    // The highest RSS of each quarter of the runs: a bound levels off, a leak climbs.
    const quarters = (xs: number[]) => [0, 1, 2, 3].map((q) => Math.max(...xs.slice((q * xs.length) >> 2, ((q + 1) * xs.length) >> 2)));
    console.log(
      `fuzz: ${runs} runs, ${last.stats.refused} refused (${Object.keys(last.stats.refusedBy).length} reasons), RDMA ${JSON.stringify(last.stats.rdmaRefusedBy)}; ` +
        `RSS ${first.rssKiB} KiB at the start, at most ${quarters(rss).join(', ')} KiB by quarter (V8's heap ${quarters(samples.map((x) => x.heapKiB)).join(', ')} KiB); ` +
        `descriptors ${first.fds}, ${Math.min(...fds)}..${Math.max(...fds)}`,
    );
    expect(s.alive()).toBe(true);
    expect(last.outside).toBe(0);
    // Bounded: what the first runs left resident (receive slots, staging) stays; nothing grows with the runs.
    expect(Math.max(...rss) - first.rssKiB).toBeLessThan(96 << 10);
    expect(Math.max(...fds)).toBeLessThanOrEqual(first.fds + 16);
    expect(fds[fds.length - 1]).toBeLessThanOrEqual(first.fds + 2);
    s.child.kill('SIGKILL');
  }, 240_000);
});
