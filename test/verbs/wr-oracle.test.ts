// The random-WR oracle (wr-oracle.ts), bounded for npm test: about 20 s of random WR lists
// against libibverbs semantics and a byte-exact shadow. PFR_SEED=<n> replays a seed; the long
// run before a stop is `npm run test:random-wr` (PFR_RANDOM_WR_MS, default 180 s).
import { expect, test } from 'vitest';
import { oracle } from './wr-oracle.js';

const LONG = Number(process.env.PFR_RANDOM_WR_MS ?? 0);
const MS = LONG || 20_000;

test(
  `random WR lists over every opcode, RC/UD/XRC QPs and an SRQ match the spec and the shadow, canaries intact (${MS / 1000} s)`,
  async () => {
    const seed = Number(process.env.PFR_SEED ?? Math.floor(Math.random() * 2 ** 31));
    const t0 = performance.now();
    const stats = await oracle({ seed, numRuns: LONG ? 1_000_000 : 3000, maxWrs: 24, timeMs: MS });
    const s = (performance.now() - t0) / 1000;
    console.log(
      `[random-wr] seed ${seed}: ${stats.wrs} WRs in ${s.toFixed(1)} s, 0 hangs, 0 crashes, 0 wrong statuses, 0 bytes outside; faults ${stats.faults.source} source, ${stats.faults.destination} destination`,
    );
    console.log(`[random-wr] ${JSON.stringify(stats.statuses)}`);
    // The run was a real one: many WRs, every opcode completed with success and with an error.
    expect(stats.wrs).toBeGreaterThan(LONG ? 5000 : 300);
    for (const op of ['write', 'write-imm', 'send', 'send-imm', 'read', 'faa', 'cas', 'atomic-write', 'flush'])
      expect(stats.statuses[`${op}:SUCCESS`] ?? 0, op).toBeGreaterThan(0);
    for (const k of [
      'write:REM_ACCESS_ERR',
      'read:REM_ACCESS_ERR',
      'send:RNR_RETRY_EXC_ERR',
      'write:LOC_PROT_ERR',
      'faa:REM_INV_REQ_ERR',
      'send:REM_INV_REQ_ERR',
      'read:WR_FLUSH_ERR',
    ])
      expect(stats.statuses[k] ?? 0, k).toBeGreaterThan(0);
    expect(stats.faults.source + stats.faults.destination).toBeGreaterThan(0);
  },
  MS + 120_000,
);
