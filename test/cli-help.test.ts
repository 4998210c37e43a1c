// Every program's --help (issue 37): each default said once, as it is typed (not as JSON), none
// for a flag that is off; a bad option prints the error and a one-line pointer to --help.
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from './child.js';

const MAIN = join(ROOT, 'dist/cli/main.js');
const programs = readdirSync(join(ROOT, 'dist/cli/commands'))
  .filter((f) => f.endsWith('.js'))
  .map((f) => f.slice(0, -3));

const run = (args: string[]) => spawnSync(process.execPath, [MAIN, ...args], { encoding: 'utf8', timeout: 30_000 });

describe('--help of every program', () => {
  it('lists programs', () => {
    expect(programs.length).toBeGreaterThan(10);
  });
  for (const program of programs)
    it(`${program}: defaults once and as typed; a bad option is the error and a pointer`, () => {
      const h = run([program, '--help']);
      expect(h.status).toBe(0);
      const text = h.stdout.replace(/\s+/g, ' ');
      expect(text).not.toMatch(/\(default[^)]*\) \(default/);
      expect(text).not.toMatch(/default: ["[{]/);
      expect(text).not.toContain('default: false');
      const bad = run([program, '--no-such-option']);
      expect(bad.status).toBe(1);
      // The error (run names its required -n first), then the pointer; never the whole help.
      const lines = bad.stderr.trim().split('\n');
      expect(lines).toHaveLength(2);
      expect(lines[0]).toMatch(program === 'run' ? /^error: / : /^error: unknown option '--no-such-option'$/);
      expect(lines[1]).toBe(`(pagefault-rdma ${program} --help lists its options)`);
    });
});

describe('messages on stderr', () => {
  const long = ['pingpong', '--hardware', 'no-such-preset'];
  const joined = (text: string) => text.replace(/\n +/g, ' ').trim();

  it('are wrapped to the width a program is told (COLUMNS, as a job tells its ranks), words whole; into a log, a message a line', () => {
    const narrow = spawnSync(process.execPath, [MAIN, ...long], { encoding: 'utf8', timeout: 30_000, env: { ...process.env, COLUMNS: '40' } });
    expect(narrow.status).toBe(1);
    const lines = narrow.stderr.trimEnd().split('\n');
    expect(lines.length).toBeGreaterThan(4); // wrapped, not cut
    expect(lines.filter((l) => l.length > 40)).toEqual([]);
    // Into a pipe or a file with no width given: one line per message (a log is grepped).
    const env = { ...process.env };
    delete env.COLUMNS;
    const log = spawnSync(process.execPath, [MAIN, ...long], { encoding: 'utf8', timeout: 30_000, env });
    expect(log.stderr.trimEnd().split('\n')).toHaveLength(2); // the error, then the pointer to --help
    // The same words, in the same order (continuation lines indented).
    expect(joined(narrow.stderr)).toBe(joined(log.stderr));
    expect(joined(log.stderr)).toContain("got 'no-such-preset' (pagefault-rdma hardware lists them with their sources)");
    // The top level's pointer (96 characters) too.
    const cmd = spawnSync(process.execPath, [MAIN, 'no-such-command'], { encoding: 'utf8', timeout: 30_000, env: { ...process.env, COLUMNS: '80' } });
    expect(
      cmd.stderr
        .trimEnd()
        .split('\n')
        .filter((l) => l.length > 80),
    ).toEqual([]);
    expect(joined(cmd.stderr)).toContain("(pagefault-rdma --help lists the commands; pagefault-rdma COMMAND --help, a command's options)");
  });
});
