// npm run docs: typedoc builds the API reference from the TSDoc, without internal members, and
// (typedoc.json: validation.notDocumented, treatWarningsAsErrors) fails on any public export,
// property or enum member without a doc comment.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, test } from 'vitest';
import { ROOT } from './child.js';

test('the API reference documents every public name and leaves internals out', () => {
  const dir = mkdtempSync(join(tmpdir(), 'pagefault-rdma-docs-'));
  try {
    const out = join(dir, 'api.json');
    // The same configuration as npm run docs (typedoc.json), written as JSON only (no HTML).
    // Without typedoc's own type check: npm test's tsc runs it on the same sources first, and
    // it was a third of this test's time; the warnings (an undocumented name) still fail it.
    const r = spawnSync(process.execPath, [join(ROOT, 'node_modules/typedoc/bin/typedoc'), '--json', out, '--skipErrorChecking'], {
      cwd: ROOT,
      encoding: 'utf8',
      timeout: 120_000,
    });
    expect(r.stdout + r.stderr).not.toContain('[warning]');
    expect(r.status, r.stdout + r.stderr).toBe(0);
    const names = new Set<string>();
    const walk = (n: { name?: string; children?: unknown[] }) => {
      if (n.name) names.add(n.name);
      for (const c of n.children ?? []) walk(c as { name?: string; children?: unknown[] });
    };
    walk(JSON.parse(readFileSync(out, 'utf8')) as { children?: unknown[] });
    for (const name of [
      'Cluster',
      'Context',
      'QueuePair',
      'Userfaultfd',
      'mapRegion',
      'Histogram',
      'TraceRecorder',
      'exportChromeTrace',
      'SimSystem',
    ])
      expect(names, name).toContain(name);
    // Members marked @internal in the TSDoc (Cluster's id tables, Context's node handle).
    for (const name of ['newPdHandle', 'mrByKey', 'forgetContext', 'simNode']) expect(names, name).not.toContain(name);
    // Engine internals: not on the public surface (kernel-sim/index.ts's export list).
    for (const name of ['walkCost', 'RUNS_IN_FLIGHT', 'EngineState', 'Transfer', 'checkSystemOptions']) expect(names, name).not.toContain(name);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}, 120_000);
