// compare-hardware (issue 41): every preset runs the same workloads on real evicted memory;
// each preset's fault handling shows in its counters (NACK re-sends, RNR waits, stalls).
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { beforeAll, describe, expect, test } from 'vitest';
import { compareHardware } from '../cli/programs/compare-hardware.js';
import { requireDist, ROOT } from './child.js';

describe('compare-hardware', () => {
  test('the same workloads under every preset: no errors, a fault per evicted buffer, each preset its own fault handling', async () => {
    const rows = await compareHardware({ iters: 3 });
    expect(rows).toHaveLength(10);
    const at = (w: string, p: string) => rows.find((r) => r.workload === w && r.preset === p)!;
    for (const r of rows) {
      expect(r.errors).toBe(0);
      expect(r.faults.destination).toBeGreaterThan(0);
      expect(r.modelUs).toBeGreaterThan(0);
    }
    // Ping-pong: both buffers evicted before each of the 6 messages.
    expect(at('pingpong', 'exanest-pldma').faults).toEqual({ source: 6, destination: 6 });
    expect(at('pingpong', 'exanest-pldma').retransmissions).toBeGreaterThan(0);
    expect(at('pingpong', 'mlx5-odp').rnrWaits).toBeGreaterThan(0);
    expect(at('pingpong', 'smmuv3-stall').stalls).toBe(6);
    expect(at('pingpong', 'smmuv3-stall').retransmissions).toBe(0);
    expect(at('pingpong', 'rxe-odp').stalls).toBe(6);
    // The default preset's ping-pong is today's (pingpong's 76.51 µs one way, evicted).
    expect(at('pingpong', 'exanest-pldma').modelUs).toBeCloseTo(76.51, 2);
    // NP-RDMA's software path is cheaper than PLDMA's, mlx5 ODP's is dearer.
    expect(at('pingpong', 'np-rdma').modelUs).toBeLessThan(at('pingpong', 'exanest-pldma').modelUs);
    expect(at('pingpong', 'mlx5-odp').modelUs).toBeGreaterThan(at('pingpong', 'exanest-pldma').modelUs);
  });

  describe('the program', () => {
    beforeAll(() => requireDist());
    const cli = (...args: string[]) =>
      spawnSync(process.execPath, [join(ROOT, 'dist/cli/main.js'), ...args], {
        encoding: 'utf8',
        timeout: 60_000,
        env: { ...process.env, FORCE_COLOR: '0' },
      });

    test('prints its table at its defaults in under a minute, the presets named, time labelled modelled', () => {
      const t = Date.now();
      const r = cli('compare-hardware');
      expect(r.status).toBe(0);
      expect(Date.now() - t).toBeLessThan(60_000);
      for (const p of ['exanest-pldma', 'smmuv3-stall', 'np-rdma', 'mlx5-odp', 'rxe-odp']) expect(r.stdout).toContain(p);
      expect(r.stdout).toContain('modelled');
      // Every workload under every preset, app halo included.
      for (const w of ['pingpong', 'write-1m', 'halo']) expect(r.stdout.split('\n').filter((l) => l.startsWith(`${w} `))).toHaveLength(5);
      expect(r.stdout).toMatch(/^halo +mlx5-odp +rnr-nak +[\d.]+ +0\+\d+ +\d+ +[1-9]\d* +0$/m);
      expect(r.stdout.split('\n').filter((l) => l.length > 100)).toEqual([]);
    });

    test('an unknown preset is refused with the list', () => {
      const r = cli('compare-hardware', '--presets', 'exanest-pldma,cx7');
      expect(r.status).not.toBe(0);
      expect(r.stderr).toMatch(/--presets must be among exanest-pldma, .*got 'cx7'/);
      const h = cli('pingpong', '--hardware', 'cx7', '-n', '1');
      expect(h.status).not.toBe(0);
      expect(h.stderr).toMatch(/hardware must be one of exanest-pldma, smmuv3-stall, np-rdma, mlx5-odp, rxe-odp, got 'cx7'/);
    });

    test('pagefault-rdma hardware lists every preset with its source, lines under 100 columns', () => {
      const r = cli('hardware');
      expect(r.status).toBe(0);
      for (const p of ['exanest-pldma', 'smmuv3-stall', 'np-rdma', 'mlx5-odp', 'rxe-odp']) expect(r.stdout).toContain(p);
      expect(r.stdout).toContain('arXiv 2310.11062');
      expect(r.stdout).toContain('ASPLOS 2017');
      expect(r.stdout.split('\n').filter((l) => l.length > 100)).toEqual([]);
    });
  });
});
