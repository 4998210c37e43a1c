// The device ABI is defined once, in C (native/device/abi.h): this compiles abi-layout.c, which
// prints every struct's size and every field's offset as the C compiler lays them out, and
// checks the TypeScript mirror (kernel-sim/device/abi.ts) against it field by field, constants
// included. A field moved in one language and not the other fails here.
import { beforeAll, expect, test } from 'vitest';
import * as abi from '../../kernel-sim/device/abi.js';
import type { Layout } from '../../kernel-sim/device/layout.js';
import { cLayout, type CLayout } from './c-layout.js';

let c: CLayout;
beforeAll(() => {
  c = cLayout();
});

const padding = (path: string): boolean => /(^|\.)(pad(_\d|ding)?|reserved\d?)$/.test(path);

test('every struct of abi.h has a mirror with the same size, alignment and field offsets', () => {
  const mirrors = new Map<string, Layout>(abi.ABI_STRUCTS.map((l) => [l.name, l]));
  expect([...mirrors.keys()].sort()).toEqual(Object.keys(c.structs).sort());
  for (const [name, s] of Object.entries(c.structs)) {
    const l = mirrors.get(name)!;
    expect({ name, size: l.size, align: l.align }).toEqual({ name, size: s.size, align: s.align });
    for (const [path, [offset, size]] of Object.entries(s.fields)) {
      const f = l.fields.get(path);
      expect({ name, path, offset: f?.offset, size: f?.size }).toEqual({ name, path, offset, size });
    }
    // Every named leaf of the mirror is one C prints (padding aside): no field of the mirror's own.
    for (const [path, f] of l.fields)
      if (f.kind !== undefined && !padding(path) && !path.includes('.'))
        expect({ name, path, inC: path in s.fields }).toEqual({ name, path, inC: true });
  }
});

test('the ring header keeps rxe_queue_buf offsets and the entries fit their slots', () => {
  expect(abi.queueBuf.offsets(['log2_elem_size', 'index_mask', 'producer_index', 'consumer_index', 'data'] as const)).toEqual({
    log2_elem_size: 0,
    index_mask: 4,
    producer_index: 128,
    consumer_index: 256,
    data: 384,
  });
  expect(abi.cqe.size).toBeLessThanOrEqual(1 << abi.CQE_LOG2);
  expect(abi.doorbellPage.size).toBeLessThanOrEqual(abi.DOORBELL_PAGE_SIZE);
});

// C's constant names, mapped to the mirror's: enums by prefix, the rest by name.
const ENUMS: [RegExp, Record<string, unknown>][] = [
  [/^PFR_OP_(?!MAX)(\w+)$/, abi.Op],
  [/^PFR_QUEUE_(SQ|RQ|SRQ|CQ)$/, abi.QueueKind],
  [/^PFR_REFUSED_(?!KINDS)(\w+)$/, abi.Refusal],
  [/^PFR_POLICY_(\w+)$/, abi.MrPolicy],
  [/^PFR_FAULT_(REQUEST|RESOLVED)$/, abi.FaultOp],
  [/^PFR_FAULT_(TOUCH|POPULATE)$/, abi.FaultMethod],
  [/^PFR_ELEMENT_(\w+)$/, abi.ElementKind],
  [/^PFR_DEVICE_(RUNNING|FATAL)$/, abi.DeviceState],
];

function mirrorOf(name: string): unknown {
  for (const [re, e] of ENUMS) {
    const m = re.exec(name);
    if (m) return e[m[1]!];
  }
  const special: Record<string, string> = { PFR_REFUSED_KINDS: 'REFUSAL_KINDS' };
  return (abi as Record<string, unknown>)[special[name] ?? name.replace(/^PFR_/, '')];
}

test('every constant of abi.h has the same value in the mirror', () => {
  expect(Object.keys(c.constants).length).toBeGreaterThan(60);
  for (const [name, value] of Object.entries(c.constants)) expect({ name, value: mirrorOf(name) }).toEqual({ name, value });
});
