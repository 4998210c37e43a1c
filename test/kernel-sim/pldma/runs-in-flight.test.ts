// A transfer's runs on the wire: a write carries a run of blocks as one entry, RUNS_IN_FLIGHT
// runs of a transfer are out at once, their ACKs come back in the order of the writes, and a
// run that stops at a block (a fault, a refusal) has the transfer's later runs returned
// unanswered, as an RC responder drops packets after a NAK. Observed on the real fabric's
// packets (a tap on the transport) and on real memory.
import { describe, expect, test } from 'vitest';
import { type AckPacket, DmaStatus, type Packet, type SimSystem, type WritePacket } from '../../../kernel-sim/index.js';
import { MAX_RUN_BLOCKS, RUNS_IN_FLIGHT } from '../../../kernel-sim/pldma/types.js';
import { twoNode } from '../../fixtures/two-node.js';
import { bytesOf, FaultLibrary, P, post, useEnv, within } from '../helpers.js';

const env = useEnv();
const RUN = MAX_RUN_BLOCKS;

/** Every write and ACK the fabric carries, in the order it was handed over (and when, relative to the others). */
function tap(sys: SimSystem): Packet[] {
  const seen: Packet[] = [];
  const fabric = sys.fabric;
  const deliver = fabric.deliver.bind(fabric);
  fabric.deliver = (p: Packet) => {
    seen.push(p);
    deliver(p);
  };
  return seen;
}

function rig(srcPages: number, dstPages: number) {
  const r = twoNode(env, { pages: srcPages, dstPages, faultTimeoutMs: 60_000, fill: 0x45, dstResident: true });
  return { ...r, packets: tap(r.sys) };
}

const writes = (ps: Packet[]) => ps.filter((p): p is WritePacket => p.type === 'write');
/** The answers to writes (not a fault library's RESOLVED). */
const acks = (ps: Packet[]) => ps.filter((p): p is AckPacket => p.type === 'ack' && p.verdicts !== undefined);

describe('runs in flight', () => {
  test('a resident write: runs of MAX_RUN_BLOCKS, two on the wire at once, answered in the order sent, one verdict per run', async () => {
    expect(RUNS_IN_FLIGHT).toBe(2);
    const { sys, packets, src, dst, data } = rig(4 * RUN, 4 * RUN);
    const cpl = await within('transfer', post(sys.node(0), src, dst), 20_000);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    const w = writes(packets);
    expect(w.map((p) => [p.seq, p.count])).toEqual([0, 1, 2, 3].map((k) => [k * RUN, RUN]));
    const a = acks(packets);
    // In the order of the writes, each with one verdict for its whole run and nothing returned.
    expect(a.map((p) => p.seq)).toEqual(w.map((p) => p.seq));
    for (const p of a) {
      expect(p.verdicts).toHaveLength(1);
      expect(p.verdicts![0]).toMatchObject({ seq: p.seq, count: RUN });
      expect(p.returned).toBeUndefined();
    }
    // The second run went out before the first was answered; never more than RUNS_IN_FLIGHT at once.
    let out = 0;
    let most = 0;
    for (const p of packets) {
      out += p.type === 'write' ? 1 : -1;
      most = Math.max(most, out);
    }
    expect(most).toBe(RUNS_IN_FLIGHT);
    expect(packets.indexOf(w[1]!)).toBeLessThan(packets.indexOf(a[0]!));
    expect(sys.node(0).pldma.counters()).toMatchObject({ blocksIssued: 4 * RUN, blocksAcked: 4 * RUN, retransmittedBlocks: 0 });
  });

  test('an evicted page in the middle of run 2 while run 3 is on the wire: one fault, run 3 returned whole, each block sent again once', async () => {
    const { sys, packets, src, dst, data, b } = rig(3 * RUN, 3 * RUN);
    const evicted = RUN + RUN / 2;
    dst.evict(evicted * P, P);
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    // How many packets had gone out when the NACK reached the source.
    let sentAtNack = -1;
    sys.tracer.on((e) => {
      if (e.kind === 'nack') sentAtNack = packets.length;
    });
    let answeredAtCompletion = -1;
    const cpl = await within(
      'transfer',
      post(sys.node(0), src, dst).then((c) => ((answeredAtCompletion = acks(packets).length), c)),
      20_000,
    );
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(cpl.faults).toEqual({ source: 0, destination: 1 });
    expect(lib.faults.map((f) => f.offset / P)).toEqual([evicted]);
    expect(cpl.nacks).toBe(1);
    expect(cpl.retransmittedBlocks).toBe(1);
    const w = writes(packets);
    const a = acks(packets);
    // Run 3 was on the wire when run 2's NACK reached the source.
    const run3 = w.find((p) => p.seq === 2 * RUN)!;
    const ack2 = a.find((p) => p.seq === RUN)!;
    expect(packets.indexOf(run3)).toBeLessThan(sentAtNack);
    // Run 2: the blocks before the page written (one verdict), the page NACKed, the rest returned.
    expect(ack2.verdicts!.map((v) => [v.seq, v.count, v.resp])).toEqual([
      [RUN, RUN / 2, 0],
      [evicted, 1, 1],
    ]);
    expect(ack2.returned).toEqual({ seq: evicted + 1, count: RUN / 2 - 1 });
    // Run 3: dropped behind the NACK, returned whole, nothing written.
    const ack3 = a[a.indexOf(ack2) + 1]!;
    expect([ack3.seq, ack3.verdicts, ack3.returned]).toEqual([2 * RUN, [], { seq: 2 * RUN, count: RUN }]);
    // Answers in the order of the writes, every write answered before the completion.
    expect(a.map((p) => p.seq)).toEqual(w.map((p) => p.seq));
    expect(answeredAtCompletion).toBe(w.length);
    // Each block after the fault went out twice (once returned), every other block once.
    const sent = new Array<number>(3 * RUN).fill(0);
    for (const p of w) for (let s = p.seq; s < p.seq + p.count; s++) sent[s]!++;
    expect(sent.slice(0, evicted).every((n) => n === 1)).toBe(true);
    expect(sent.slice(evicted + 1).every((n) => n === 2)).toBe(true);
    expect(sent[evicted]).toBe(2);
    // Returned blocks are not issued blocks: only the faulting block counts twice.
    expect(sys.node(0).pldma.counters()).toMatchObject({ blocksIssued: 3 * RUN + 1, blocksAcked: 3 * RUN, nacksReceived: 1 });
    expect(sys.node(1).pldma.counters()).toMatchObject({ nacksSent: 1, faults: { source: 0, destination: 1 } });
  });

  test('a transfer refused in the middle of run 2 while run 3 is on the wire ends after run 3 is back, counting exactly the bytes that landed', async () => {
    // The destination region ends in the middle of run 2: its next block is in no region.
    const end = RUN + RUN / 2;
    const { sys, packets, src, dst, data } = rig(3 * RUN, end);
    // Run 3's answer is held back 50 ms: the refusal in run 2's answer comes well before it.
    const deliver = sys.fabric.deliver.bind(sys.fabric);
    sys.fabric.deliver = (p) => {
      if (p.type === 'ack' && p.seq === 2 * RUN && p.verdicts) setTimeout(() => deliver(p), 50);
      else deliver(p);
    };
    let answeredAtCompletion = -1;
    const cpl = await within(
      'transfer',
      post(sys.node(0), src, dst, { length: src.size }).then((c) => ((answeredAtCompletion = acks(packets).length), c)),
      20_000,
    );
    expect(cpl.status).toBe(DmaStatus.DST_ADDR_ERR);
    expect(cpl.side).toBe('destination');
    expect(cpl.bytes).toBe(end * P);
    expect(bytesOf(dst).equals(data.subarray(0, end * P))).toBe(true);
    const w = writes(packets);
    expect(w.map((p) => p.seq)).toEqual([0, RUN, 2 * RUN]);
    const a = acks(packets);
    expect(a.map((p) => p.seq)).toEqual([0, RUN, 2 * RUN]);
    const ack3 = a[2]!;
    expect([ack3.verdicts, ack3.returned]).toEqual([[], { seq: 2 * RUN, count: RUN }]);
    expect(answeredAtCompletion).toBe(3);
    expect(sys.node(0).pldma.counters()).toMatchObject({ blocksAcked: end, errors: 1, completed: 0 });
    expect(sys.node(0).pldma.inflight).toBe(0);
  });

  test("the source's stream gone while runs 1 and 2 are on the wire: FLUSHED only after run 2 is answered, counting both runs' bytes", async () => {
    const { sys, packets, src, dst, data, a } = rig(4 * RUN, 4 * RUN);
    // Once run 2 is handed to the fabric, the posting process's protection domain goes away:
    // run 3 is never sent, but runs 1 and 2 are on the wire and land. Run 2's answer is held
    // back 50 ms, so the requester finds the stream gone (at run 1's answer) well before it.
    const deliver = sys.fabric.deliver.bind(sys.fabric);
    sys.fabric.deliver = (p) => {
      if (p.type === 'write' && p.seq === RUN) sys.node(0).smmu.detach(a.stream.sid);
      if (p.type === 'ack' && p.seq === RUN && p.verdicts) setTimeout(() => deliver(p), 50);
      else deliver(p);
    };
    let answeredAtCompletion = -1;
    const cpl = await within(
      'transfer',
      post(sys.node(0), src, dst).then((c) => ((answeredAtCompletion = acks(packets).length), c)),
      20_000,
    );
    expect(cpl).toMatchObject({ status: DmaStatus.FLUSHED, side: 'source', bytes: 2 * RUN * P });
    expect(writes(packets).map((p) => [p.seq, p.count])).toEqual([
      [0, RUN],
      [RUN, RUN],
    ]);
    expect(answeredAtCompletion).toBe(2);
    expect(bytesOf(dst, 0, 2 * RUN * P).equals(data.subarray(0, 2 * RUN * P))).toBe(true);
    expect(bytesOf(dst, 2 * RUN * P).every((x) => x === 0)).toBe(true);
    expect(sys.node(0).pldma.counters()).toMatchObject({ blocksAcked: 2 * RUN, errors: 1, completed: 0 });
    expect(sys.node(0).pldma.inflight).toBe(0);
  });

  test('a source page found gone by the copy of run 1 after run 2 was translated: run 2 answered as returned, one fault, bytes exact', async () => {
    // The source SMMU caches every page (a big IOTLB) and stops hearing about evictions, so
    // only run 1's copy can find the page gone: after run 2 was already translated there.
    const { sys, src, dst, data, a } = twoNode(env, { pages: 3 * RUN, fill: 0x17, dstResident: true, system: { iotlbEntries: 4 * RUN } });
    const packets = tap(sys);
    const lib = env.track(
      new FaultLibrary(a.socket, { regions: [src], resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)) }),
    );
    expect((await within('first transfer', post(sys.node(0), src, dst), 20_000)).status).toBe(DmaStatus.SUCCESS);
    src.unobserve(sys.node(0).smmu);
    const gone = RUN / 2;
    src.evict(gone * P, P);
    new Uint8Array(dst.buffer).fill(0);
    packets.length = 0;
    const cpl = await within('second transfer', post(sys.node(0), src, dst), 20_000);
    src.observe(sys.node(0).smmu);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(cpl.faults).toEqual({ source: 1, destination: 0 });
    expect(cpl.retransmittedBlocks).toBe(1);
    expect(lib.faults.map((f) => [f.side, f.offset / P])).toEqual([['source', gone]]);
    expect(bytesOf(dst).equals(data)).toBe(true);
    const w = writes(packets);
    const an = acks(packets);
    expect(an.map((p) => p.seq)).toEqual(w.map((p) => p.seq));
    // Run 1: the blocks before the page written, the page a SOURCE_FAULT, the rest returned.
    expect(an[0]!.verdicts!.map((v) => [v.seq, v.count, v.resp])).toEqual([
      [0, gone, 0],
      [gone, 1, 8],
    ]);
    // Run 2 was on the wire and translated before run 1's copy stopped: returned whole.
    expect([an[1]!.seq, an[1]!.verdicts, an[1]!.returned]).toEqual([RUN, [], { seq: RUN, count: RUN }]);
    expect(sys.node(0).pldma.counters()).toMatchObject({ blocksAcked: 3 * RUN * 2, retransmittedBlocks: 1 });
  });
});
