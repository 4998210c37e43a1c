// docs/device-abi.md gives every offset of the ABI in its tables; they are checked here
// against the C compiler's layout, so the document cannot drift from native/device/abi.h.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, expect, test } from 'vitest';
import { ROOT } from '../child.js';
import { cLayout, type CLayout } from './c-layout.js';

let c: CLayout;
const doc = readFileSync(join(ROOT, 'docs/device-abi.md'), 'utf8');
beforeAll(() => {
  c = cLayout();
});

test('every offset table under "### struct NAME" matches the C layout', () => {
  let checked = 0;
  for (const section of doc.split(/^### /m).slice(1)) {
    const names = [...section.split('\n')[0]!.matchAll(/struct (\w+) \((\d+) bytes/g)];
    const first = names[0];
    if (!first) continue;
    const s = c.structs[first[1]!]!;
    for (const [, name, size] of names) expect({ name, size: Number(size) }).toEqual({ name, size: c.structs[name!]!.size });
    const rows = [...section.matchAll(/^\| (\d+) \| ([\w.]+) \| (\d+) \|/gm)];
    expect(rows.length, first[1]).toBeGreaterThan(1);
    for (const [, offset, field, size] of rows) {
      if (/^(reserved|padding)$/.test(field!) && !(field! in s.fields)) continue;
      const [o, sz] = s.fields[field!] ?? [undefined, undefined];
      expect({ struct: first[1], field, offset: Number(offset), size: Number(size) }).toEqual({ struct: first[1], field, offset: o, size: sz });
      checked++;
    }
  }
  expect(checked).toBeGreaterThan(60);
});

test('every row of the bodies tables ("| `struct` (size) | off: field …") matches the C layout', () => {
  const rows = [...doc.matchAll(/^\| `(\w+)` \((\d+)\) \| (.+) \|$/gm)];
  expect(rows.length).toBeGreaterThan(20);
  for (const [, name, size, text] of rows) {
    const s = c.structs[name!];
    expect({ name, size: Number(size) }).toEqual({ name, size: s?.size });
    // Each "N: field" at the start of an entry (after "| " or ", ").
    for (const [, offset, field] of text!.matchAll(/(?:^|, )(\d+): (\w+)/g)) {
      if (/^(reserved|pad)/.test(field!)) continue; // padding: abi-layout prints named fields only
      const f = s!.fields[field!] ?? s!.fields[`${field}.${field}`];
      expect({ name, field, offset: Number(offset) }).toEqual({ name, field, offset: f?.[0] });
    }
  }
});
