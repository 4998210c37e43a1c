// The fault unit's waiters on one node: several blocks that fault on the same page of a stream
// are answered together by the one answer, and an answer nobody recorded (a stall-mode
// fault, or one answered twice) still speaks for the fault it carries.
import { describe, expect, test } from 'vitest';
import { Faults } from '../../../kernel-sim/rc/faults.js';
import type { EngineState, FaultInfo } from '../../../kernel-sim/pldma/types.js';
import { Tracer } from '../../../kernel-sim/trace.js';

/** A fault unit whose waiters alone are used: nothing is traced, no transfer is ended. */
const unit = () => new Faults({ node: 0, tracer: new Tracer() } as unknown as EngineState, () => undefined);

function info(sid: number, va: bigint, tid: number): FaultInfo {
  return {
    node: 0,
    sid,
    side: 'source',
    srcNode: 0,
    tid,
    channel: 0,
    seq: 0,
    va,
    write: false,
    lengthHint: 4096,
    modelUs: 0,
    detectedMs: 0,
    issuedUs: 0,
    issuedMs: 0,
  };
}

describe("the fault unit's waiters", () => {
  test('one answer takes every block waiting on its stream and page, once, in the order they faulted', () => {
    const w = unit();
    const a = info(1, 0x1000n, 1);
    const b = info(1, 0x1000n, 2);
    const otherPage = info(1, 0x2000n, 3);
    const otherStream = info(2, 0x1000n, 4);
    for (const x of [a, otherPage, b, otherStream]) w.wait(x);
    expect(w.take(info(1, 0x1000n, 9))).toEqual([a, b]);
    // Taken: a second answer for that page finds only itself.
    const again = info(1, 0x1000n, 9);
    expect(w.take(again)).toEqual([again]);
    expect(w.take(otherPage)).toEqual([otherPage]);
    expect(w.take(otherStream)).toEqual([otherStream]);
  });

  test('an answer for a fault nobody recorded is taken as that fault alone', () => {
    const w = unit();
    const stall = info(3, 0x5000n, 7);
    expect(w.take(stall)).toEqual([stall]);
  });
});
