// The programs' code belongs to the command (cli/programs/); examples/ holds short programs a
// user reads and copies, so they use the public package API only, and they run.
import { execFile } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { promisify } from 'node:util';
import { expect, test } from 'vitest';
import { ROOT } from './child.js';

function sources(dir: string): string[] {
  return readdirSync(join(ROOT, dir), { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))
    .map((f) => join(ROOT, dir, f));
}

/** Every import and re-export specifier of a file, relative ones resolved to a path from ROOT. */
function imports(file: string): string[] {
  return [...readFileSync(file, 'utf8').matchAll(/(?:import|export)\s[^'"]*?from\s+'([^']+)'|import\('([^']+)'\)/g)].map((m) => {
    const spec = (m[1] ?? m[2])!;
    return spec.startsWith('.') ? relative(ROOT, resolve(dirname(file), spec)) : spec;
  });
}

test('no cli or bench file imports examples/', () => {
  const files = [...sources('cli'), ...sources('bench')];
  expect(files.length).toBeGreaterThan(30);
  const bad = files.flatMap((f) =>
    imports(f)
      .filter((i) => i.startsWith('examples'))
      .map((i) => `${relative(ROOT, f)} -> ${i}`),
  );
  expect(bad).toEqual([]);
});

test('examples import only the public package API and Node built-ins', () => {
  const files = sources('examples');
  expect(files.length).toBeGreaterThanOrEqual(2);
  const bad = files.flatMap((f) =>
    imports(f)
      .filter((i) => i !== 'lib/index.js' && i !== 'pagefault-rdma' && !i.startsWith('node:'))
      .map((i) => `${relative(ROOT, f)} -> ${i}`),
  );
  expect(bad).toEqual([]);
});

const run = promisify(execFile);
test.each([
  ['rdma-write', /status success, faults at the destination 1, retransmitted blocks 1\ndst\[0\] = 42, resident pages 16 of 16/],
  ['send-recv', /send success; receive success, 13 bytes: hello over RC/],
])('examples/%s.ts runs and prints its result', async (name, expected) => {
  const { stdout } = await run(process.execPath, [join(ROOT, 'dist', 'examples', `${name}.js`)], { timeout: 30_000 });
  expect(stdout).toMatch(expected);
});
