// The commands around the device: `libdir` prints the library's folder, `exec` runs a program on
// the device (starting one when none answers, reusing it after), passes the program's status
// on, and the device it started stops after its idle timeout; `device` refuses a second device
// in the same folder.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, expect, test } from 'vitest';
import { queryInfo } from '../../kernel-sim/device/client.js';
import { runningDevice } from '../../kernel-sim/device/runtime-dir.js';
import { verbsLibDir } from '../../native/index.js';
import { ROOT } from '../child.js';
import { deviceProcess, runtimeFolder } from './fixture.js';

const cli = (args: string[], env: NodeJS.ProcessEnv = {}) =>
  spawnSync(process.execPath, [join(ROOT, 'dist/cli/main.js'), ...args], { encoding: 'utf8', timeout: 30_000, env: { ...process.env, ...env } });

const folders: ReturnType<typeof runtimeFolder>[] = [];
afterEach(async () => {
  for (const f of folders.splice(0)) {
    const pid = runningDevice(f.dir);
    if (pid && pid > 0) process.kill(pid, 'SIGTERM');
    for (let i = 0; i < 100 && runningDevice(f.dir); i++) await new Promise((r) => setTimeout(r, 20));
    f.remove();
  }
});

test('libdir prints the folder of libibverbs.so.1; a package where it was not built names what to install', () => {
  const r = cli(['libdir']);
  expect(r.status).toBe(0);
  expect(existsSync(join(r.stdout.trim(), 'libibverbs.so.1'))).toBe(true);
  const f = runtimeFolder();
  folders.push(f);
  mkdirSync(f.dir);
  writeFileSync(join(f.dir, 'package.json'), '{}');
  expect(() => verbsLibDir(f.dir)).toThrow(
    expect.objectContaining({ code: 'ERR_PFR_VERBS_MISSING', message: expect.stringContaining('apt-get install libibverbs-dev') }),
  );
});

test.runIf(existsSync('/usr/bin/ibv_devices'))(
  'exec starts a device when none answers, reuses it, and the device stops when idle',
  async () => {
    const f = runtimeFolder();
    folders.push(f);
    const first = cli(['exec', '--dir', f.dir, '--idle-timeout', '2', '--', 'ibv_devices']);
    expect(first.stderr).toBe('');
    expect(first.status).toBe(0);
    expect(first.stdout).toContain('pfr0');
    const started = await queryInfo(f.dir);
    expect(started?.pid).toBeGreaterThan(0);
    expect(existsSync(join(f.dir, 'device.log'))).toBe(true);
    const again = cli(['exec', '--dir', f.dir, '--', 'ibv_devices']);
    expect(again.stdout).toContain('pfr0');
    expect((await queryInfo(f.dir))?.pid).toBe(started!.pid);
    // Idle for 2 s: it stops, lets the folder go, removes its socket.
    for (let i = 0; i < 300 && runningDevice(f.dir); i++) await new Promise((r) => setTimeout(r, 20));
    expect(runningDevice(f.dir)).toBeUndefined();
    expect(existsSync(join(f.dir, 'device.sock'))).toBe(false);
  },
  40_000,
);

test("exec passes the program's exit status on, names a program that is not there, and --no-start does not start one", () => {
  const f = runtimeFolder();
  folders.push(f);
  expect(cli(['exec', '--dir', f.dir, '--no-start', '--', 'true']).stderr).toContain('no device answers');
  const code = cli(['exec', '--dir', f.dir, '--idle-timeout', '1', '--', 'sh', '-c', 'exit 3']);
  expect(code.status).toBe(3);
  const missing = cli(['exec', '--dir', f.dir, '--', 'no-such-program-pfr']);
  expect(missing.status).toBe(1);
  expect(missing.stderr).toContain('cannot run no-such-program-pfr');
}, 40_000);

test('a second device in the same folder refuses to start, naming the first', async () => {
  const dev = await deviceProcess();
  try {
    // This user's alone: the folder 0700, the socket 0600.
    expect(statSync(dev.dir).mode & 0o777).toBe(0o700);
    expect(statSync(join(dev.dir, 'device.sock')).mode & 0o777).toBe(0o600);
    const r = cli(['device', '--dir', dev.dir]);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain(`a device already runs for this user in ${dev.dir} (pid ${dev.child.pid})`);
  } finally {
    expect(await dev.stop()).toBe(0);
  }
  expect(dev.log.join('\n')).toMatch(/stopped \(SIGTERM\): connections \d+/);
});

test('a runtime folder others may write is refused', () => {
  const f = runtimeFolder();
  folders.push(f);
  spawnSync('mkdir', ['-m', '777', f.dir]);
  const r = cli(['device', '--dir', f.dir]);
  expect(r.status).toBe(1);
  expect(r.stderr).toContain('may be written by others');
});
