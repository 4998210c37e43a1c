// odp-pitfalls (issue 41): the min_rnr_timer sweep under mlx5-odp shows the cliff at 0 and the
// knee where the timer passes the fault's service time; the timeout path (Fukuoka et al.) costs
// three to four orders of magnitude over a common-case fault at large QP timeouts.
import { describe, expect, test } from 'vitest';
import { odpPitfalls, pitfallsReport } from '../cli/programs/odp-pitfalls.js';
import { RNR_TIMER_US } from '../lib/index.js';

describe('odp-pitfalls', () => {
  test('the cliff at min_rnr_timer 0, the knee past the service time, the timeout path 10^3..10^4 over a common fault', async () => {
    const r = await odpPitfalls({ writes: 1 });
    expect(r.rnr).toHaveLength(32);
    // The cliff: code 0 costs one 655.36 ms wait per receive fault.
    expect(r.rnr[0]!.modelUs).toBeGreaterThan(655360);
    expect(r.rnr[0]!.modelUs).toBeLessThan(655360 * 1.01);
    // Below the knee, many short waits and a cost near the service time; at and past it one wait, the timer.
    expect(r.rnr[1]!.waitsPerWrite).toBeGreaterThan(10);
    expect(r.rnr[1]!.modelUs).toBeLessThan(r.serviceUs * 1.1);
    expect(RNR_TIMER_US[r.kneeCode]!).toBeGreaterThanOrEqual(r.serviceUs);
    expect(RNR_TIMER_US[r.kneeCode - 1]!).toBeLessThan(r.serviceUs);
    for (const p of r.rnr.slice(r.kneeCode)) expect(p.waitsPerWrite).toBe(1);
    for (const p of r.rnr.slice(r.kneeCode + 2)) expect(p.modelUs).toBeGreaterThan(p.timerUs);
    // mlx5-odp's common-case fault near its calibrated 220 µs.
    expect(r.commonFaultUs).toBeGreaterThan(198);
    expect(r.commonFaultUs).toBeLessThan(242);
    // The timeout path: 3..4 orders of magnitude at timeout 16..19; one try once the timer passes the service.
    for (const t of r.timeouts.filter((x) => x.timeout >= 16 && x.timeout <= 19)) {
      expect(t.orders).toBeGreaterThanOrEqual(3);
      expect(t.orders).toBeLessThanOrEqual(4);
    }
    const small = r.timeouts.find((x) => x.timeout === 4)!;
    expect(small.tries).toBeGreaterThan(1);
    const report = pitfallsReport(r);
    expect(report).toContain('the cliff');
    expect(report).toContain('the knee');
    expect(report).toContain('modelled');
    expect(report.split('\n').filter((l) => l.length > 100)).toEqual([]);
  });

  test('a retry_cnt the timeout path outlasts ends in RETRY_EXC_ERR, not a wait', async () => {
    const r = await odpPitfalls({ writes: 1, retryCnt: 1, timeouts: [4, 14] });
    expect(r.timeouts[0]!.pathUs).toBe(Infinity);
    expect(Number.isFinite(r.timeouts[1]!.pathUs)).toBe(true);
  });
});
