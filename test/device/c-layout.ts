// The device ABI as the C compiler lays it out: native/device/abi-layout.c compiled and run
// once per test file, its JSON parsed (every struct's size and alignment, every field's offset
// and size, every constant).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT } from '../child.js';

export interface CLayout {
  structs: Record<string, { size: number; align: number; fields: Record<string, [number, number]> }>;
  constants: Record<string, number>;
}

export function cLayout(): CLayout {
  const dir = mkdtempSync(join(tmpdir(), `pfr-abi-${process.pid}-`));
  try {
    const bin = join(dir, 'abi-layout');
    const cc = spawnSync('cc', ['-std=c11', '-Wall', '-Wextra', '-Werror', '-o', bin, join(ROOT, 'native/device/abi-layout.c')], {
      encoding: 'utf8',
    });
    if (cc.status !== 0) throw new Error(`cc abi-layout.c failed: ${cc.stderr}`);
    const run = spawnSync(bin, { encoding: 'utf8' });
    if (run.status !== 0) throw new Error(`abi-layout failed: ${run.stderr}`);
    return JSON.parse(run.stdout) as CLayout;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
