// The source's import graph, read from the files themselves: no module imports itself
// through others (a cycle hides which of two files depends on which), type-only imports
// included. Relative imports only: packages cannot import back.
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { expect, test } from 'vitest';
import { ROOT } from '../child.js';

function sources(dir: string): string[] {
  return readdirSync(join(ROOT, dir), { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))
    .map((f) => join(ROOT, dir, f));
}

/** Every cycle found by a depth-first walk (each back edge once), as `a -> b -> a`. */
function importCycles(files: string[]): string[] {
  const graph = new Map<string, string[]>();
  for (const f of files) {
    const deps = [...readFileSync(f, 'utf8').matchAll(/(?:import|export)\s[^'"]*?from\s+'(\.[^']+)'/g)];
    graph.set(
      f,
      deps.map((m) => resolve(dirname(f), m[1]!.replace(/\.js$/, '.ts'))),
    );
  }
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const cycles: string[] = [];
  const visit = (f: string): void => {
    state.set(f, 'open');
    stack.push(f);
    for (const d of graph.get(f) ?? []) {
      if (!graph.has(d)) continue;
      if (state.get(d) === 'open') cycles.push([...stack.slice(stack.indexOf(d)), d].map((x) => relative(ROOT, x)).join(' -> '));
      else if (!state.has(d)) visit(d);
    }
    stack.pop();
    state.set(f, 'done');
  };
  for (const f of graph.keys()) if (!state.has(f)) visit(f);
  return cycles;
}

test('no import cycle in native, kernel-sim, lib, cli, examples or bench', () => {
  const files = ['native', 'kernel-sim', 'lib', 'cli', 'examples', 'bench'].flatMap(sources);
  expect(files.length).toBeGreaterThan(50);
  expect(importCycles(files)).toEqual([]);
});
