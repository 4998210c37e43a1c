// The project's libibverbs.so.1 exports what Debian's does, node by node (the programs and
// libraries linked against Debian's bind versioned symbols: one missing and they do not
// start), and every symbol Debian's verbs programs, librdmacm, libmlx5, libefa and pyverbs
// import from libibverbs is there at the version they ask for.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, test } from 'vitest';
import { verbsLibDir } from '../../native/index.js';

const DEBIAN = '/lib/x86_64-linux-gnu/libibverbs.so.1';
const ours = join(verbsLibDir(), 'libibverbs.so.1');

/** "VERSION symbol" of every symbol `file` defines (defined: true) or imports from libibverbs. */
function symbols(file: string, defined: boolean): string[] {
  const out = spawnSync('objdump', ['-T', file], { encoding: 'utf8' }).stdout;
  return out
    .split('\n')
    .filter((l) => /IBVERBS_/.test(l) && l.includes('*UND*') !== defined)
    .map((l) => l.trim().split(/\s+/).slice(-2))
    .filter(([v, s]) => s !== v && !/^IBVERBS_/.test(s!) && (defined ? !v!.startsWith('(') : true))
    .map(([v, s]) => `${v!.replace(/[()]/g, '')} ${s}`)
    .sort();
}

function importers(): string[] {
  const files = ['/usr/bin', '/lib/x86_64-linux-gnu']
    .flatMap((d) => (existsSync(d) ? readdirSync(d).map((f) => join(d, f)) : []))
    .filter((f) => /\/(ibv_\w+|ib_\w+|librdmacm\.so\.1|libmlx5\.so\.1|libefa\.so\.1)$/.test(f));
  const py = '/usr/lib/python3/dist-packages/pyverbs';
  if (existsSync(py))
    files.push(
      ...readdirSync(py, { recursive: true, encoding: 'utf8' })
        .filter((f) => f.endsWith('.so'))
        .map((f) => join(py, f)),
    );
  return files;
}

test('it exports versioned symbols only, in the IBVERBS_1.0 .. 1.14 and IBVERBS_PRIVATE_34 nodes', () => {
  const mine = symbols(ours, true);
  const byNode = new Map<string, number>();
  for (const l of mine) byNode.set(l.split(' ')[0]!, (byNode.get(l.split(' ')[0]!) ?? 0) + 1);
  console.log(`libibverbs.so.1 exports, by version node: ${[...byNode].map(([v, n]) => `${v} ${n}`).join(', ')} (${mine.length} in all)`);
  expect([...byNode.keys()].sort()).toEqual(
    ['1.0', '1.1', '1.5', '1.6', '1.7', '1.8', '1.9', '1.10', '1.11', '1.12', '1.13', '1.14', 'PRIVATE_34'].map((v) => `IBVERBS_${v}`).sort(),
  );
  const all = spawnSync('objdump', ['-T', ours], { encoding: 'utf8' }).stdout.split('\n');
  // Nothing else leaks out of the library (every defined dynamic symbol has a version node).
  expect(all.filter((l) => / g /.test(l) && !l.includes('*UND*') && !/IBVERBS_/.test(l))).toEqual([]);
  expect(spawnSync('objdump', ['-p', ours], { encoding: 'utf8' }).stdout).toMatch(/SONAME\s+libibverbs\.so\.1/);
});

describe.runIf(existsSync(DEBIAN))("against Debian's libibverbs", () => {
  test('the same symbols at the same versions', () => {
    expect(symbols(ours, true)).toEqual(symbols(DEBIAN, true));
  });

  test('everything its programs and libraries import is exported', () => {
    const mine = new Set(symbols(ours, true));
    const files = importers();
    expect(files.length).toBeGreaterThan(10);
    const missing = files.flatMap((f) =>
      symbols(f, false)
        .filter((s) => !mine.has(s))
        .map((s) => `${f}: ${s}`),
    );
    expect(missing).toEqual([]);
  });
});
