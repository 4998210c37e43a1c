// The programs on a terminal: run under a pseudo-terminal (util-linux's `script`), their bytes
// rendered by a small terminal (terminal.ts) and the screen checked: the progress line never
// shares a line with a row, the table's header and rows are whole, lines fit the terminal,
// milestones stay on the screen, and the terminal is left as it was found (cursor shown,
// autowrap on), after a normal end and after Ctrl-C.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { requireDist, ROOT } from './child.js';
import { render, type Screen } from './terminal.js';

const MAIN = join(ROOT, 'dist/cli/main.js');
const COLS = 100;
const HIDE = '\x1b[?25l';

let dir80: string;
beforeAll(() => {
  requireDist();
  dir80 = mkdtempSync(join(tmpdir(), 'pagefault-rdma-terminal-'));
});
afterAll(() => rmSync(dir80, { recursive: true, force: true }));

// `pagefault-rdma ARGS` on a terminal of COLS columns; `interruptAfter`: seconds until SIGINT.
function onTerminal(args: string[], interruptAfter?: number, cols = COLS): { raw: string; screen: Screen; status: number | null } {
  const quote = (s: string) => `'${s.replace(/'/g, "'\\''")}'`;
  const node = [process.execPath, MAIN, ...args].map(quote).join(' ');
  const run = interruptAfter === undefined ? node : `timeout -s INT ${interruptAfter} ${node}`;
  const r = spawnSync('script', ['-qec', `stty cols ${cols} rows 50; ${run}`, '/dev/null'], {
    encoding: 'utf8',
    timeout: 120_000,
    env: { ...SHELL_ENV, FORCE_COLOR: '0' },
  });
  if (r.error) throw r.error;
  return { raw: r.stdout, screen: render(r.stdout, cols), status: r.status };
}

// `script` runs its command with $SHELL, which CI leaves unset (so /bin/sh, dash here). dash dies at
// once on the SIGINT a typed ^C sends the whole foreground group, before the line after the
// program runs; bash waits for the program and goes on if it handled the signal, as a user's
// interactive shell does. The tests name bash, so they mean the same on every machine.
const SHELL_ENV = { ...process.env, SHELL: '/bin/bash' };

const BAR = /\[[█░]{30}\] \d+\/\d+/;

describe('a program on a terminal', () => {
  test('pingpong: the bar never shares a line with a row; header and rows whole; cursor shown at the end', () => {
    const { raw, screen } = onTerminal(['pingpong', '-s', '4K', '-n', '300']);
    expect(raw).toContain(HIDE); // the bar was drawn
    const lines = screen.lines;
    // The bar is gone and shared no line with anything printed.
    expect(lines.filter((l) => BAR.test(l))).toEqual([]);
    // The header, over two lines: the column names, then the units beside #bytes.
    const h = lines.findIndex((l) => l.includes('#bytes'));
    expect(lines.filter((l) => l.includes('#bytes'))).toHaveLength(1);
    expect(lines[h - 1]).toMatch(/^ +t_min +t_max +t_typical +t_avg +t_stdev +99% +99\.9%$/);
    expect(lines[h]).toMatch(/^ +#bytes( +\[usec\]){7} +time +buffers$/);
    // Four rows (model and real, evicted and resident), each whole: size, seven numbers, time base, buffers.
    const rows = lines.filter((l) => /^ +4096 /.test(l));
    expect(rows).toHaveLength(4);
    for (const row of rows) expect(row).toMatch(/^ +4096( +\d+(\.\d\d?)?){7} +(model|real) +(evicted|resident)$/);
    // The closing notes come after the rows, none over the header.
    const last = lines.indexOf(rows[3]!);
    expect(lines.findIndex((l) => l.includes('retransmitted blocks'))).toBeGreaterThan(last);
    expect(lines.findIndex((l) => l.includes('(run time'))).toBeGreaterThan(last);
    for (const l of lines) expect(l.length, l).toBeLessThanOrEqual(COLS);
    expect([screen.cursorVisible, screen.autowrap]).toEqual([true, true]);
  }, 120_000);

  test('text is wrapped to the terminal: every line the program writes fits 72 columns', () => {
    const { raw, screen } = onTerminal(['destination-fault', '-s', '8K'], undefined, 72);
    // The bytes as written, not as the terminal wrapped them: each line already fits.
    const escape = new RegExp(`${String.fromCharCode(27)}\\[[0-9;?]*[A-Za-z]`, 'g');
    const written = raw.split(/\r?\n/).map((l) => l.replace(escape, '').replace(/.*\r/, ''));
    expect(written.filter((l) => l.length > 72)).toEqual([]);
    expect(screen.lines.some((l) => l.includes('retransmission: node 0 re-issues block 1'))).toBe(true);
  }, 120_000);

  test("an error on stderr is wrapped to the terminal's width too (72 columns), words whole", () => {
    const { raw, screen, status } = onTerminal(['pingpong', '--hardware', 'no-such-preset'], undefined, 72);
    expect(status).toBe(1);
    const written = render(raw, 1000).lines.filter((l) => l !== '');
    expect(written.length).toBeGreaterThan(2);
    expect(written.filter((l) => l.length > 72)).toEqual([]);
    expect(screen.lines.join(' ').replace(/ +/g, ' ')).toContain("got 'no-such-preset' (pagefault-rdma hardware lists them with their sources)");
  }, 120_000);

  test('Ctrl-C in the middle of a run: the bar is cleared, the cursor shown, autowrap on', () => {
    const { raw, screen, status } = onTerminal(['pingpong', '-s', '4K', '-n', '1000000', '--no-baseline'], 8);
    expect(raw).toContain(HIDE); // interrupted while the bar was drawn
    expect(raw.lastIndexOf('\x1b[?25h')).toBeGreaterThan(raw.lastIndexOf(HIDE));
    expect([screen.cursorVisible, screen.autowrap]).toEqual([true, true]);
    expect(screen.lines.filter((l) => BAR.test(l))).toEqual([]);
    expect(status).not.toBe(0);
  }, 120_000);

  test('pinning-moves: the wait for khugepaged counts down on a live line, gone at the end', () => {
    const { raw, screen } = onTerminal(['pinning-moves', '--khugepaged-wait', '3']);
    const thp = screen.lines.find((l) => l.startsWith('khugepaged (THP'));
    expect(thp).toBeDefined();
    // THP "never", or huge pages given at once: there is nothing to wait for, and no countdown.
    if (screen.lines.some((l) => l.startsWith('Waiting up to 3 s for khugepaged'))) expect(raw).toMatch(/khugepaged: [1-3] s left, /);
    expect(screen.lines.filter((l) => /s left, /.test(l))).toEqual([]);
    expect([screen.cursorVisible, screen.autowrap]).toEqual([true, true]);
  }, 120_000);

  test("remote-paging: the milestones ('written', each pass, 'verified') stay on the screen", () => {
    const { screen } = onTerminal(['remote-paging', '-s', '4M', '--resident', '1M', '--updates', '512']);
    const starts = screen.lines.map((l) => l.split(/ +/)[0]);
    for (const m of ['written', 'verified']) expect(starts).toContain(m);
    expect(screen.lines.filter((l) => /^pass [12] +faults \d+/.test(l))).toHaveLength(2);
    expect(screen.lines.filter((l) => l.startsWith('…'))).toEqual([]); // the live line is gone
    expect([screen.cursorVisible, screen.autowrap]).toEqual([true, true]);
  }, 120_000);
});

// Every screen a user sees fits 80 columns: what the program writes (not what the terminal
// wrapped for it) on a terminal of 80 columns, and the same program's lines into a pipe.
describe('80 columns', () => {
  /** The lines as written, not as the terminal wrapped them: the bytes rendered on a screen too wide to wrap. */
  const written = (raw: string) => render(raw, 1000).lines;
  const RUNS: string[][] = [
    ['--help'],
    ['write-bw', '--help'],
    ['rc-pingpong', '--help'],
    ['demo'],
    ['odp-vs-pinned', '-a', '--max-size', '16K', '-n', '1'],
    ['pingpong', '-s', '4K', '-n', '100'],
    ['measured-table', '--max-size', '16K', '--iters', '1'],
    ['app', 'kv', '-s', '16', '--steps', '3', '--runs', '1', '--policies', 'pin,remote', '--no-warm-up'],
    ['run', '-n', '2', '--', 'alltoall', '-n', '5', '-s', '4K'],
  ];

  test.each(RUNS)(
    '%s … on a terminal of 80 columns and into a pipe: no line over 80',
    (...args) => {
      const { raw, status } = onTerminal(args, undefined, 80);
      expect(status).toBe(0);
      expect(written(raw).filter((l) => [...l].length > 80)).toEqual([]);
      const piped = spawnSync(process.execPath, [MAIN, ...args], { encoding: 'utf8', timeout: 120_000 });
      expect(piped.status).toBe(0);
      const lines = piped.stdout.split('\n');
      expect(lines.length).toBeGreaterThan(3);
      expect(lines.filter((l) => [...l].length > 80)).toEqual([]);
    },
    120_000,
  );

  test("rc-pingpong and write-bw: the address lines fit, as ibv_rc_pingpong's and perftest's, on both sides", () => {
    for (const [program, extra] of [
      ['rc-pingpong', ['-n', '50', '-g', '0']],
      ['write-bw', ['-n', '50', '-x', '0']],
    ] as const) {
      // The server's lines into a file, the client on the terminal, in one shell under the pty.
      const log = join(dir80, `${program}.server`);
      const q = (s: string) => `'${s.replace(/'/g, "'\\''")}'`;
      const node = (a: readonly string[]) => [process.execPath, MAIN, ...a].map(q).join(' ');
      const shell =
        `${node([program, '-p', '0', ...extra])} > ${q(log)} 2>&1 & ` +
        `for i in $(seq 100); do p=$(grep -o 'port [0-9]*' ${q(log)} | head -1 | cut -d' ' -f2); [ -n "$p" ] && break; sleep 0.1; done; ` +
        `${node([program, '127.0.0.1', ...extra])} -p $p; wait`;
      const r = spawnSync('script', ['-qec', `stty cols 80 rows 50; ${shell}`, '/dev/null'], { encoding: 'utf8', timeout: 120_000, env: SHELL_ENV });
      expect(r.status).toBe(0);
      const client = written(r.stdout);
      expect(client.some((l) => /local address: +LID/.test(l))).toBe(true);
      expect(client.filter((l) => [...l].length > 80).join('\n')).toBe('');
      const server = readFileSync(log, 'utf8').split('\n');
      expect(server.some((l) => /remote address: +LID/.test(l))).toBe(true);
      expect(server.filter((l) => [...l].length > 80).join('\n')).toBe('');
    }
  }, 120_000);
});

// Ctrl-C typed into remote-paging while its live line is drawn: the line and the echoed ^C are
// cleared, the cursor shown, and the shell's prompt (here: the exit status) starts a clean line.
test('Ctrl-C typed into remote-paging: no truncated status line, no ^C glued to it, exit 130', async () => {
  const q = (s: string) => `'${s.replace(/'/g, "'\\''")}'`;
  const node = [process.execPath, MAIN, 'remote-paging', '-s', '256M', '--resident', '16M'].map(q).join(' ');
  const child = spawn('script', ['-qec', `stty cols 80 rows 50; ${node}; echo EXIT=$?`, '/dev/null'], {
    stdio: ['pipe', 'pipe', 'pipe'],
    env: SHELL_ENV,
  });
  let raw = '';
  let sent = false;
  child.stdout.on('data', (d: Buffer) => {
    raw += d.toString();
    // Once the live line has been redrawn a few times.
    if (!sent && (raw.match(/…  +faults/g) ?? []).length >= 3) {
      sent = true;
      child.stdin.write('\x03');
    }
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), 90_000);
  await new Promise((resolve) => child.on('close', resolve));
  clearTimeout(timer);
  expect(sent).toBe(true);
  const screen = render(raw, 80);
  expect(screen.lines.filter((l) => l.includes('…') || l.includes('^C'))).toEqual([]);
  expect(screen.lines.filter((l) => l.startsWith('EXIT='))).toEqual(['EXIT=130']);
  expect([screen.cursorVisible, screen.autowrap]).toEqual([true, true]);
}, 120_000);

// Ctrl-C typed at the terminal (the byte 0x03 into the pty, echoed as ^C by the line
// discipline), as a user stops a --run_infinitely run: what perftest does, on a clean screen.
describe('Ctrl-C typed into write-bw --run_infinitely', () => {
  /** The server outside the pty (a file for its lines), the client under it; Ctrl-C once `rows` rows are on the screen. */
  async function interrupted(extra: string[], rows: number): Promise<{ client: Screen; status: string; server: string; serverCode: number | null }> {
    const log = join(dir80, `ri${extra.join('')}.server`);
    const server = spawn(process.execPath, [MAIN, 'write-bw', '-p', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    server.stdout.on('data', (d: Buffer) => (out += d.toString()));
    server.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const serverExit = new Promise<number | null>((resolve) => server.on('exit', (code) => resolve(code)));
    for (let i = 0; i < 300 && !/port (\d+)/.test(out); i++) await new Promise((r) => setTimeout(r, 100));
    const port = /port (\d+)/.exec(out)![1]!;
    const q = (s: string) => `'${s.replace(/'/g, "'\\''")}'`;
    const node = [process.execPath, MAIN, 'write-bw', '127.0.0.1', '-p', port, '-s', '4K', '-D', '1', '--run_infinitely', ...extra].map(q).join(' ');
    const client = spawn('script', ['-qec', `stty cols 80 rows 50; ${node}; echo EXIT=$?`, '/dev/null'], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: SHELL_ENV,
    });
    let raw = '';
    let sent = false;
    client.stdout.on('data', (d: Buffer) => {
      raw += d.toString();
      if (!sent && (raw.match(/^ +4096 +\d+ /gm) ?? []).length >= rows) {
        sent = true;
        client.stdin.write('\x03');
      }
    });
    const timer = setTimeout(() => (client.kill('SIGKILL'), server.kill('SIGKILL')), 90_000);
    await new Promise((resolve) => client.on('close', resolve));
    const serverCode = await serverExit;
    clearTimeout(timer);
    writeFileSync(log, out);
    const screen = render(raw, 80);
    return { client: screen, status: screen.lines.find((l) => l.startsWith('EXIT='))!, server: out, serverCode };
  }

  test("one way: the ^C is cleared, ' User stopped traffic', exit 0; the server says ' Client closed connection'", async () => {
    const r = await interrupted([], 2);
    expect(r.client.lines.filter((l) => l.includes('^C'))).toEqual([]);
    expect(r.client.lines).toContain(' User stopped traffic');
    expect(r.status).toBe('EXIT=0');
    expect(r.client.lines.filter((l) => [...l].length > 80)).toEqual([]);
    expect(r.client.lines.some((l) => l.includes('mismatches 0'))).toBe(true);
    expect(r.serverCode).toBe(0);
    expect(r.server).toContain('\n Client closed connection\n');
    // The server posts nothing one way: no table of periods it never had.
    expect(r.server).not.toContain('#bytes');
  }, 120_000);

  test('-b: perftest catches no SIGINT in a duplex run, so the status is 130; the screen is still clean', async () => {
    const r = await interrupted(['-b'], 1);
    expect(r.client.lines.filter((l) => l.includes('^C'))).toEqual([]);
    expect(r.client.lines).not.toContain(' User stopped traffic');
    expect(r.status, r.client.lines.join('\n')).toBe('EXIT=130');
    expect(r.serverCode).toBe(0);
  }, 120_000);
});
