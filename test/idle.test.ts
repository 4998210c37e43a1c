// An idle process does not wake: a 2-node Cluster with contexts, an ODP MR and connected QPs,
// and registered Userfaultfds (both deliveries), doing nothing for 3 s, makes at most one
// voluntary context switch a second on any thread (the measurement's own timer is one), as a
// bare Node process does. A timer, a poll loop with a timeout or a setInterval would show here.
import { expect, test } from 'vitest';
import { runFixture } from './child.js';

test('an idle process holding a Cluster and registered Userfaultfds wakes at most once a second per thread (3 s, /proc/self/task/*/status)', async () => {
  const r = await runFixture('idle-wakeups.mjs', ['3000'], { timeoutMs: 20_000 });
  expect(r.code, r.stderr).toBe(0);
  const { ms, threads } = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { ms: number; threads: Array<{ thread: string; switches: number }> };
  expect(ms).toBe(3000);
  expect(threads.length).toBeGreaterThan(2);
  for (const t of threads) expect(t.switches, t.thread).toBeLessThanOrEqual(3);
  const total = threads.reduce((s, t) => s + t.switches, 0);
  console.log(`[idle] ${total} context switches in ${ms} ms over ${threads.length} threads`);
  expect(total).toBeLessThanOrEqual(6);
}, 30_000);
