// The walk (bench/walk.ts, `pagefault-rdma walk`): the inspector follows a work request from
// qp.postSend to its CQE, synchronous code and later tasks alike, and counts its stops.
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { expect, test } from 'vitest';
import { walkCounts, type WalkResult } from '../bench/walk.js';
import { ROOT } from './child.js';

test('the counts: distinct files, A→B→A and lib↔kernel-sim crossings', () => {
  const stops = ['lib/verbs/qp.ts', 'kernel-sim/rc/requester.ts', 'lib/verbs/qp.ts', 'lib/verbs/cq.ts', 'native/index.ts', 'lib/verbs/cq.ts'];
  expect(walkCounts(stops)).toEqual({
    files: ['lib/verbs/qp.ts', 'kernel-sim/rc/requester.ts', 'lib/verbs/cq.ts', 'native/index.ts'],
    backAndForth: 2,
    crossings: 2,
  });
  expect(walkCounts([])).toEqual({ files: [], backAndForth: 0, crossings: 0 });
});

test('pagefault-rdma walk records each path from the post to the CQE, through the responder', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'pfr-walk-'));
  try {
    const file = join(dir, 'walk.json');
    const { stdout } = await promisify(execFile)(process.execPath, [join(ROOT, 'dist/cli/main.js'), 'walk', '--json', file], { timeout: 240_000 });
    expect(stdout).toMatch(/resident RDMA WRITE +\d+ +\d+ +\d+ +\d+ +success/);
    const walks = (JSON.parse(readFileSync(file, 'utf8')) as { results: { walks: WalkResult[] } }).results.walks;
    expect(walks.map((w) => w.path)).toEqual(['write', 'send', 'fault']);
    for (const w of walks) {
      expect(w.status, w.path).toBe('success');
      expect(w.stops.length, w.path).toBeGreaterThan(5);
      expect(w.files.length, w.path).toBeGreaterThan(3);
      expect(w.backAndForth, w.path).toBeGreaterThan(0);
      expect(w.crossings, w.path).toBeGreaterThan(0);
      expect(w.pauses, w.path).toBeGreaterThanOrEqual(w.stops.length);
      expect(w.stops[0], w.path).toBe('lib/verbs/qp.ts');
      // The provider's queue code, the doorbell into the device's QP, the send ring, the
      // requester, the RC responder (a later task), the completer, the CQ and its ring.
      for (const f of [
        /^lib\/verbs\/provider-queue\.ts$/,
        /^kernel-sim\/rc\/qp\.ts$/,
        /^kernel-sim\/device\/send-ring\.ts$/,
        /^kernel-sim\/rc\/requester\.ts$/,
        /^kernel-sim\/rc\/responder\.ts$/,
        /^kernel-sim\/rc\/completer\.ts$/,
        /^lib\/verbs\/cq\.ts$/,
        /^kernel-sim\/device\/cq-ring\.ts$/,
      ])
        expect(
          w.files.some((x) => f.test(x)),
          `${w.path}: ${String(f)}`,
        ).toBe(true);
      expect(w.stops.every((s, i) => i === 0 || s !== w.stops[i - 1])).toBe(true);
    }
    const [write, , fault] = walks;
    // The faulting write takes the fault path too: the SMMU driver and the fault library.
    for (const f of ['kernel-sim/smmu-driver/driver.ts', 'lib/fault-library/fault-library.ts']) {
      expect(fault!.files, f).toContain(f);
      expect(write!.files, f).not.toContain(f);
    }
    expect(fault!.stops.length).toBeGreaterThan(write!.stops.length);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}, 300_000);
