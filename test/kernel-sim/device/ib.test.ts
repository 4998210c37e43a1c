// The IB enums the device speaks are defined once, in kernel-sim/device/ib.ts: lib re-exports
// the same objects (so a status the engine writes is the status the verbs compare against), and
// nothing in kernel-sim reaches up into lib for them.
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { expect, test } from 'vitest';
import * as ib from '../../../kernel-sim/device/ib.js';
import * as qpState from '../../../kernel-sim/device/qp-state.js';
import * as lib from '../../../lib/index.js';
import { ROOT } from '../../child.js';

const ENUMS = [
  'Access',
  'AdviseMrAdvice',
  'AdviseMrFlags',
  'AsyncEventType',
  'FlushLevel',
  'FlushType',
  'OdpGeneralCaps',
  'OdpTransportCaps',
  'QpAttrMask',
  'QpState',
  'QpType',
  'SendFlags',
  'UD_MTU',
  'WcFlags',
  'WcOpcode',
  'WcStatus',
  'WrOpcode',
  'wcStatusStr',
] as const;

test("lib's IB enums are the device's own objects, not copies", () => {
  for (const name of ENUMS) expect((lib as Record<string, unknown>)[name], name).toBe((ib as Record<string, unknown>)[name]);
  expect(qpState.QpState).toBe(ib.QpState);
  expect(qpState.QpType).toBe(ib.QpType);
  expect(ib.WcStatus.REM_ACCESS_ERR).toBe(10);
  expect(ib.MtuType.MTU_4096).toBe(5);
});

function sources(dir: string): string[] {
  return readdirSync(join(ROOT, dir), { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))
    .map((f) => join(ROOT, dir, f));
}

test('kernel-sim imports nothing from lib (only itself and native), and no other file declares the IB enums', () => {
  const files = sources('kernel-sim');
  expect(files.length).toBeGreaterThan(20);
  const up: string[] = [];
  for (const f of files)
    for (const m of readFileSync(f, 'utf8').matchAll(/(?:import|export)\s[^'"]*?from\s+'(\.[^']+)'/g)) {
      const target = relative(ROOT, resolve(dirname(f), m[1]!));
      if (target.startsWith('lib') || target.startsWith('cli') || target.startsWith('examples')) up.push(`${relative(ROOT, f)} -> ${target}`);
    }
  expect(up).toEqual([]);
  const decl =
    /\bexport\s+(?:const\s+)?enum\s+(WcStatus|WcOpcode|WrOpcode|QpState|QpType|AsyncEventType|MtuType)\b|\bexport\s+const\s+(Access|SendFlags|WcFlags)\s*=/g;
  const found: string[] = [];
  for (const f of ['kernel-sim', 'lib', 'cli'].flatMap(sources))
    for (const m of readFileSync(f, 'utf8').matchAll(decl)) found.push(`${relative(ROOT, f)}: ${m[1] ?? m[2]}`);
  expect(found.sort()).toEqual(
    ['Access', 'AsyncEventType', 'MtuType', 'QpState', 'QpType', 'SendFlags', 'WcFlags', 'WcOpcode', 'WcStatus', 'WrOpcode']
      .map((n) => `kernel-sim/device/ib.ts: ${n}`)
      .sort(),
  );
});
