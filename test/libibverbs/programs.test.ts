// Debian's verbs programs, unmodified, on the project's libibverbs.so.1 and the device process
// (`pagefault-rdma device`, started and stopped here in a folder of this run's own): they list
// the device, show its ODP capabilities, port and RoCEv2 GIDs, and get through every control
// verb; a program that ends without destroying its objects has them released by the device.
// (The data path, program against program: data-path.test.ts.)
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { hostGids } from '../../kernel-sim/device/attributes.js';
import { queryInfo, queryStats } from '../../kernel-sim/device/client.js';
import { deviceProcess, runVerbs, verbsEnv } from '../device/fixture.js';

let dev: Awaited<ReturnType<typeof deviceProcess>>;
beforeAll(async () => {
  dev = await deviceProcess();
}, 30_000);
afterAll(async () => {
  expect(await dev.stop()).toBe(0);
});

const has = (p: string): boolean => existsSync(p);

/** A TCP socket listens on `port` (from /proc/net/tcp*: a probe connection would be taken for a client). */
function listening(port: number): boolean {
  const hex = `:${port.toString(16).toUpperCase().padStart(4, '0')} `;
  return ['/proc/net/tcp', '/proc/net/tcp6'].some(
    (f) =>
      existsSync(f) &&
      readFileSync(f, 'utf8')
        .split('\n')
        .some((l) => l.includes(hex) && / 0A /.test(l)),
  );
}

/** A TCP port nobody listens on. */
function closedPort(): number {
  for (let p = 30000 + (process.pid % 20000); ; p++) if (!listening(p)) return p;
}

async function settled(): Promise<void> {
  for (let i = 0; i < 300 && (await queryStats(dev.dir)).openContexts > 0; i++) await new Promise((r) => setTimeout(r, 10));
}

test.runIf(has('/usr/bin/ibv_devices'))('ibv_devices lists pfr0 with its node GUID', async () => {
  const r = runVerbs(dev.dir, 'ibv_devices');
  expect(r.status).toBe(0);
  const info = await queryInfo(dev.dir);
  expect(r.stdout).toMatch(new RegExp(`pfr0\\s+${info!.nodeGuid.toString(16).padStart(16, '0')}`));
});

test.runIf(has('/usr/bin/ibv_devinfo'))('ibv_devinfo -v shows the ODP caps, an active Ethernet port, MTU 4096 and RoCEv2 GIDs', () => {
  const r = runVerbs(dev.dir, 'ibv_devinfo', ['-v']);
  expect(r.stderr).toBe('');
  expect(r.status).toBe(0);
  const out = r.stdout;
  expect(out).toMatch(/hca_id:\s+pfr0/);
  expect(out).toMatch(/fw_ver:\s+\d+\.\d+\.\d+/);
  expect(out).toMatch(/general_odp_caps:\s+ODP_SUPPORT\s+ODP_SUPPORT_IMPLICIT/);
  const caps = (name: string): string[] =>
    [...(new RegExp(`${name}:\\n((?:\\t{5}\\S.*\\n)+)`).exec(out)?.[1] ?? '').matchAll(/(\S+)/g)].map((m) => m[1]!);
  const rc = ['SUPPORT_SEND', 'SUPPORT_RECV', 'SUPPORT_WRITE', 'SUPPORT_READ', 'SUPPORT_ATOMIC', 'SUPPORT_SRQ'];
  expect(caps('rc_odp_caps')).toEqual(rc);
  expect(caps('xrc_odp_caps')).toEqual(rc);
  expect(caps('ud_odp_caps')).toEqual(['SUPPORT_SEND', 'SUPPORT_RECV', 'SUPPORT_SRQ']);
  expect(caps('uc_odp_caps')).toEqual(['NO', 'SUPPORT']);
  expect(out).toMatch(/state:\s+PORT_ACTIVE \(4\)/);
  expect(out).toMatch(/max_mtu:\s+4096 \(5\)/);
  expect(out).toMatch(/active_mtu:\s+4096 \(5\)/);
  expect(out).toMatch(/link_layer:\s+Ethernet/);
  expect(out).toMatch(/max_qp:\s+65536/);
  const gids = [...out.matchAll(/GID\[\s*(\d+)\]:\s+(\S+), RoCE v2/g)].map((m) => m[2]);
  expect(gids).toEqual(hostGids().map((g) => g.text));
  expect(gids.filter((g) => g!.startsWith('::ffff:')).length).toBeGreaterThan(0);
});

test.runIf(has('/usr/bin/ibv_rc_pingpong'))(
  'ibv_rc_pingpong with no peer posts its receives, finds no server and exits; its objects are released',
  async () => {
    const before = await queryStats(dev.dir);
    // A client of a port nobody listens on: context, PD, MR, CQ, QP to INIT, receives posted, then no server.
    const r = runVerbs(dev.dir, 'ibv_rc_pingpong', ['-g', '0', '-p', String(closedPort()), '127.0.0.1']);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain("Couldn't connect to 127.0.0.1");
    await settled();
    const after = await queryStats(dev.dir);
    // The program exits without destroying them: its socket closing releases them (PD, MR, CQ, QP).
    expect(after.releasedObjects - before.releasedObjects).toBe(4);
    expect(after.openContexts).toBe(0);
    expect(after.refused).toEqual(before.refused);
  },
);

test.runIf(has('/usr/bin/ibv_ud_pingpong') && has('/usr/bin/ibv_srq_pingpong'))(
  'ibv_ud_pingpong and ibv_srq_pingpong post their receives, then find no server',
  () => {
    for (const p of ['ibv_ud_pingpong', 'ibv_srq_pingpong']) {
      const r = runVerbs(dev.dir, p, ['-g', '0', '-p', String(closedPort()), '127.0.0.1']);
      expect({ p, status: r.status }).toEqual({ p, status: 1 });
      expect(r.stderr).not.toContain("Couldn't post receive");
      expect(r.stderr).toContain("Couldn't connect to 127.0.0.1");
    }
  },
);

describe.runIf(has('/usr/bin/ib_write_bw'))('perftest', () => {
  test('ib_write_bw (with --odp too) runs to its end on both sides: its results line, exit 0', async () => {
    for (const odp of [[], ['--odp']]) {
      const port = 20000 + ((process.pid * 2) % 20000) + odp.length;
      const server = spawn('ib_write_bw', ['-p', String(port), '-n', '100', ...odp], { env: verbsEnv(dev.dir), stdio: 'ignore' });
      const serverExit = new Promise<number | null>((r) => server.once('exit', (c) => r(c)));
      for (let i = 0; i < 400 && !listening(port); i++) await new Promise((r) => setTimeout(r, 25));
      const client = spawnSync('ib_write_bw', ['-p', String(port), '-n', '100', ...odp, '127.0.0.1'], {
        env: verbsEnv(dev.dir),
        encoding: 'utf8',
        timeout: 30_000,
      });
      const out = client.stdout + client.stderr;
      expect(out).toContain('RDMA_Write BW Test');
      expect(out).toMatch(/Device\s+: pfr0/);
      expect(out).toMatch(/Link type\s+: Ethernet/);
      expect(out).toMatch(/remote address: LID 0000 QPN 0x[0-9a-f]+ PSN/);
      expect(out).toMatch(/^\s*65536\s+100\s+[\d.]+\s+[\d.]+/m);
      expect(client.status).toBe(0);
      expect(await serverExit).toBe(0);
    }
  }, 60_000);
});

test.runIf(has('/usr/lib/python3/dist-packages/pyverbs'))(
  "pyverbs (python3-pyverbs) lists the device and reads its ODP caps; its mlx5 and efa modules load with Debian's providers",
  () => {
    const script = [
      'import pyverbs.device as d',
      'from pyverbs.enums import IBV_ODP_SUPPORT, IBV_ODP_SUPPORT_WRITE',
      'import pyverbs.providers.mlx5.mlx5dv, pyverbs.providers.efa.efadv',
      'names = [x.name.decode() for x in d.get_device_list()]',
      'ctx = d.Context(name=names[0])',
      'a = ctx.query_device_ex()',
      'print(names, bool(a.odp_caps.general_caps & IBV_ODP_SUPPORT), bool(a.odp_caps.rc_odp_caps & IBV_ODP_SUPPORT_WRITE))',
      'ctx.close()',
    ].join('\n');
    const r = spawnSync('/usr/bin/python3', ['-c', script], { env: verbsEnv(dev.dir), encoding: 'utf8', timeout: 30_000 });
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toBe("['pfr0'] True True");
  },
);

test.runIf(has('/usr/bin/ibv_devices'))('with no device process, ibv_devices lists none and the library says how to start one', () => {
  const r = spawnSync('ibv_devices', [], { env: verbsEnv(`${dev.dir}-none`), encoding: 'utf8' });
  expect(r.status).toBe(0);
  expect(r.stdout).not.toContain('pfr0');
  expect(r.stderr).toContain('no device process at');
  expect(r.stderr).toContain('pagefault-rdma device');
});
