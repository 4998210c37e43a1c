// README's example, run as a user would paste it: its output must be what its comments say.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { expect, test } from 'vitest';
import { requireDist, ROOT } from './child.js';

test("README's RDMA-write example prints what its comments promise", () => {
  requireDist();
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const block = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]!).find((b) => b.includes('Cluster.create'))!;
  expect(block).toBeDefined();
  // The comment lines that start with "// " right after a console.log are its expected output.
  const expected = [...block.matchAll(/^\/\/ (.+?)(?: {2,}\(.*\))?$/gm)].map((m) => m[1]!.trim());
  expect(expected.length).toBe(2);
  const dir = mkdtempSync(join(tmpdir(), 'pagefault-rdma-readme-'));
  try {
    const file = join(dir, 'example.mjs');
    writeFileSync(file, block.replaceAll("from 'pagefault-rdma'", `from '${pathToFileURL(join(ROOT, 'dist/lib/index.js')).href}'`));
    const r = spawnSync(process.execPath, [file], { encoding: 'utf8', timeout: 60_000 });
    expect(r.stderr).toBe('');
    expect(
      r.stdout
        .trim()
        .split('\n')
        .map((l) => l.trim()),
    ).toEqual(expected);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// Every js block of README, pasted into a .mts file of a strict TypeScript project: it
// compiles against the published declarations (a field possibly undefined is TS18048 here).
test("README's js examples compile under strict TypeScript", () => {
  requireDist();
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const blocks = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]!);
  expect(blocks.length).toBeGreaterThanOrEqual(3);
  const dir = mkdtempSync(join(tmpdir(), 'pagefault-rdma-readme-ts-'));
  try {
    const lib = join(ROOT, 'dist/lib/index.js');
    const files = blocks.map((b, i) => {
      const f = join(dir, `example-${i}.mts`);
      writeFileSync(f, b.replaceAll("from 'pagefault-rdma'", `from '${lib}'`));
      return f;
    });
    const tsc = join(ROOT, 'node_modules/typescript/bin/tsc');
    const args = ['--strict', '--noEmit', '--module', 'nodenext', '--target', 'es2022', '--types', 'node'];
    const r = spawnSync(process.execPath, [tsc, ...args, '--typeRoots', join(ROOT, 'node_modules/@types'), ...files], {
      cwd: dir,
      encoding: 'utf8',
      timeout: 120_000,
    });
    expect(r.stdout + r.stderr).toBe('');
    expect(r.status).toBe(0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}, 120_000);
