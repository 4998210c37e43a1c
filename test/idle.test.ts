// An idle process does not wake: a 2-node Cluster with contexts, an ODP MR and connected QPs,
// and registered Userfaultfds (both deliveries), doing nothing for 3 s, makes at most one
// voluntary context switch a second on any thread (the measurement's own timer is one), as a
// bare Node process does. A timer, a poll loop with a timeout or a setInterval would show here
// in every run; the suite's own load can add a stray switch to one run, so a second run is
// taken when the first is over the bound, and the better of the two must meet it.
import { expect, test } from 'vitest';
import { runFixture } from './child.js';

type Idle = { ms: number; threads: Array<{ thread: string; switches: number }> };

async function idle(): Promise<Idle> {
  const r = await runFixture('idle-wakeups.mjs', ['3000'], { timeoutMs: 20_000 });
  expect(r.code, r.stderr).toBe(0);
  const out = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as Idle;
  expect(out.ms).toBe(3000);
  expect(out.threads.length).toBeGreaterThan(2);
  return out;
}

const total = (r: Idle) => r.threads.reduce((s, t) => s + t.switches, 0);
const within = (r: Idle) => r.threads.every((t) => t.switches <= 3) && total(r) <= 6;

test('an idle process holding a Cluster and registered Userfaultfds wakes at most once a second per thread (3 s, /proc/self/task/*/status)', async () => {
  let r = await idle();
  if (!within(r)) {
    console.log(`[idle] first run over the bound (${total(r)} switches: ${JSON.stringify(r.threads.filter((t) => t.switches > 0))}); once more`);
    r = await idle();
  }
  for (const t of r.threads) expect(t.switches, t.thread).toBeLessThanOrEqual(3);
  console.log(`[idle] ${total(r)} context switches in ${r.ms} ms over ${r.threads.length} threads`);
  expect(total(r)).toBeLessThanOrEqual(6);
}, 60_000);
