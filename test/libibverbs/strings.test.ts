// The names and numbers libibverbs gives its enums and rates, which programs print: the
// project's library says exactly what Debian's does, value by value (one C program, run on each).
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, expect, test } from 'vitest';
import { verbsLibDir } from '../../native/index.js';
import { compileFixture } from '../device/fixture.js';

const build = mkdtempSync(join(tmpdir(), `pfr-strings-${process.pid}-`));
afterAll(() => rmSync(build, { recursive: true, force: true }));

test.runIf(existsSync('/lib/x86_64-linux-gnu/libibverbs.so.1'))("enum strings and rate conversions are Debian's libibverbs', every value", () => {
  const bin = compileFixture('verbs-strings', build, ['-libverbs']);
  const debian = spawnSync(bin, [], { encoding: 'utf8' });
  const ours = spawnSync(bin, [], { encoding: 'utf8', env: { ...process.env, LD_LIBRARY_PATH: verbsLibDir() } });
  expect(debian.status).toBe(0);
  expect(ours.status).toBe(0);
  expect(ours.stdout.split('\n').length).toBeGreaterThan(150);
  expect(ours.stdout).toBe(debian.stdout);
});
