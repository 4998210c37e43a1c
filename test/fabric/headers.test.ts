// The wire layout (kernel-sim/fabric/wire-codec.ts, packet-layout.ts, framing.ts, exchange-codec.ts): every packet type survives encode and
// decode field for field, and every malformed field, short or long frame, unknown opcode or
// flag is refused with a WireError that names it, before anything is built from it.
import { describe, expect, it } from 'vitest';
import { encodeExchange } from '../../kernel-sim/fabric/exchange-codec.js';
import {
  decodeFrame,
  encodeBatch,
  encodeChunk,
  encodeHello,
  Outbox,
  BATCH_ENTRY_BYTES,
  BATCH_HEADER_BYTES,
  encodePing,
} from '../../kernel-sim/fabric/framing.js';
import { checkPacket, encodePacket } from '../../kernel-sim/fabric/packet-layout.js';
import { Op, WIRE_MAX_BLOCKS, WireError } from '../../kernel-sim/fabric/wire-codec.js';
import { AckResp, type AckPacket, RcOp, type WritePacket } from '../../kernel-sim/fabric/packets.js';
import { MAX_RUN_BLOCKS } from '../../kernel-sim/pldma/types.js';
import { costModel } from '../../kernel-sim/cost-model/index.js';
import { Fabric } from '../../kernel-sim/fabric/fabric.js';
import type { MemoryLike } from '../../kernel-sim/memory.js';

const BS = 4096;

function write(over: Partial<WritePacket> = {}): WritePacket {
  const count = over.count ?? 3;
  return {
    type: 'write',
    src: 0,
    dst: 1,
    pd: 7,
    va: 0x7f00_0000_1000n,
    tid: 42,
    seq: 5,
    length: 2 * BS + 100,
    arrivesAt: 12.5,
    channel: 3,
    count,
    blockSize: BS,
    payload: { region: undefined as unknown as MemoryLike, offset: 0 },
    lengthHint: 10 * BS,
    issuedUs: over.issuedUs ?? Float64Array.from({ length: count }, (_, i) => i + 0.25),
    arrivals: over.arrivals ?? Float64Array.from({ length: count }, (_, i) => i + 2.5),
    issuedMs: 1234.5,
    sourceStall: false,
    ...over,
  };
}

function payload(n: number): Uint8Array {
  return Uint8Array.from({ length: n }, (_, i) => (i * 7 + 3) & 0xff);
}

const ack: AckPacket = {
  type: 'ack',
  src: 1,
  dst: 0,
  pd: 7,
  va: 0x1000n,
  tid: 42,
  seq: 5,
  length: 3 * BS,
  arrivesAt: 30,
  resp: AckResp.OK,
  returned: { seq: 7, count: 1 },
  verdicts: [
    { seq: 5, count: 2, resp: AckResp.OK, walkUs: 0.5, walks: Float64Array.of(0.5, 0.75), stalls: 0, copyThread: 1234, copyNs: 999.5 },
    { seq: 7, count: 1, resp: AckResp.FAULT, walkUs: 1, late: true, reason: 'destination page evicted — before the write', faultOffset: 8192 },
    { seq: 8, count: 1, resp: AckResp.FAULT, walkUs: 1, resolved: { atUs: 41.5, fetched: 2, heldUs: 12.25 } },
  ],
};

/** An RC ATOMIC request: no payload, AtomicETH and the requester's sink. */
const atomic = (over: Partial<WritePacket> = {}): WritePacket =>
  write({
    count: 1,
    seq: 0,
    length: 0,
    lengthHint: 0,
    opcode: RcOp.ATOMIC,
    qpn: 0xffffff,
    srcQpn: 0x12,
    psn: 9,
    key: 0xdeadbeef,
    va: (1n << 64n) - 8n,
    sinks: [{ addr: 0x2000n, length: 8, lkey: 5 }],
    atomic: { fetchAdd: false, compareAdd: (1n << 64n) - 1n, swap: 0n },
    ...over,
  });

/** Whether decoding `bytes` is refused with a WireError whose message matches `re`. */
function refused(bytes: Uint8Array, re: RegExp): void {
  expect(() => decodeFrame(bytes)).toThrow(WireError);
  expect(() => decodeFrame(bytes)).toThrow(re);
}

// Offsets in a write frame: opcode, flags, then the header (src 2, dst 4, pd 6, va 10, tid 18,
// seq 22, length 26, arrivesAt 30), channel 38, count 40, blockSize 42.
const COUNT_AT = 40;
const BLOCK_AT = 42;

describe('wire layout: round trips', () => {
  it('a write with every optional field, and its payload bytes', () => {
    const p = write({ key: 0xabc, qpn: 0x123456, sourceStall: true, sourceFault: { seq: 7, faultOffset: 3 * BS } });
    const bytes = payload(2 * BS);
    const f = decodeFrame(encodePacket(p, bytes));
    expect(f.op).toBe(Op.WRITE);
    if (f.op !== Op.WRITE) return;
    // No payload until the transport places the bytes; the issue time is this side's (below).
    expect({ ...f.packet, issuedMs: 0 }).toEqual({ ...p, payload: undefined, issuedMs: 0 });
    expect(f.bytes).toEqual(bytes);
  });

  it("a write's issue time is the receiver's clock (its arrival), never the sender's", () => {
    // performance.now() counts from each process's start: a peer's would make every measure of a
    // fault on its packets (detection runs from issue) off by the two processes' start times.
    const before = performance.now();
    const p = write({ issuedMs: before + 3.6e6 });
    const f = decodeFrame(encodePacket(p, payload(p.length)));
    if (f.op !== Op.WRITE) throw new Error('not a write');
    expect(f.packet.issuedMs).toBeGreaterThanOrEqual(before);
    expect(f.packet.issuedMs).toBeLessThanOrEqual(performance.now());
  });

  it('a plain write: no key, no QP, the whole run carried', () => {
    const p = write();
    const f = decodeFrame(encodePacket(p, payload(p.length)));
    if (f.op !== Op.WRITE) throw new Error('not a write');
    expect(f.packet.key).toBeUndefined();
    expect(f.packet.qpn).toBeUndefined();
    expect(f.packet.sourceFault).toBeUndefined();
    expect(f.bytes).toEqual(payload(p.length));
  });

  it('an ACK with verdicts of every kind (a fault NACK carrying its answer), returned blocks', () => {
    const f = decodeFrame(encodePacket(ack));
    expect(f).toEqual({ op: Op.ACK, packet: ack });
    const bare: AckPacket = { ...ack, resp: AckResp.UNRESOLVED, verdicts: undefined as never, returned: undefined as never };
    delete bare.verdicts;
    delete bare.returned;
    expect(decodeFrame(encodePacket(bare))).toEqual({ op: Op.ACK, packet: bare });
    // Only a fault NACK carries an answer; 5 (the separate RESOLVED ACK of old) is no resp.
    expect(() =>
      encodePacket({ ...ack, verdicts: [{ seq: 5, count: 1, resp: AckResp.OK, walkUs: 0, resolved: { atUs: 1, fetched: 0, heldUs: 0 } }] }),
    ).toThrow(/verdicts\[0\]\.resolved must be only on a FAULT verdict, got 0/);
    expect(() => encodePacket({ ...bare, resp: 5 as AckResp })).toThrow(/resp must be an AckResp, got 5/);
  });

  it('RC packets: BTH, RETH, ImmDt, a message of several transfers, READ and ATOMIC requests, an ANSWER_ERR verdict', () => {
    const decoded = (p: WritePacket, bytes: Uint8Array) => {
      const f = decodeFrame(encodePacket(p, bytes));
      expect(f.op).toBe(Op.WRITE);
      return f.op === Op.WRITE ? f.packet : undefined;
    };
    const send = write({
      opcode: RcOp.SEND_IMM,
      qpn: 0x11,
      srcQpn: 0x12,
      psn: 0xffffff,
      immData: 77,
      srcFaults: 3,
      msgOffset: 4096,
      msgLength: 100 * BS,
    });
    expect(decoded(send, payload(send.length))).toMatchObject({
      opcode: RcOp.SEND_IMM,
      qpn: 0x11,
      srcQpn: 0x12,
      psn: 0xffffff,
      immData: 77,
      srcFaults: 3,
      msgOffset: 4096,
      msgLength: 100 * BS,
    });
    // BTH SE rides the opcode byte: kept on a SEND, refused on an operation that takes no receive.
    const se = decoded({ ...send, solicited: true }, payload(send.length));
    expect([se?.opcode, se?.solicited, se?.immData]).toEqual([RcOp.SEND_IMM, true, 77]);
    expect(decoded(send, payload(send.length))?.solicited).toBeUndefined();
    expect(() => encodePacket(write({ opcode: RcOp.WRITE, qpn: 1, srcQpn: 2, psn: 0, key: 9, solicited: true }), payload(write().length))).toThrow(
      /solicited must be only on an operation that takes a receive/,
    );
    const empty = write({ count: 1, seq: 0, length: 0, lengthHint: 0, opcode: RcOp.WRITE, qpn: 1, srcQpn: 2, psn: 0, key: 9 });
    expect(decoded(empty, new Uint8Array(0))).toMatchObject({ length: 0, opcode: RcOp.WRITE, key: 9 });
    expect(decoded(atomic(), new Uint8Array(0))).toMatchObject({
      opcode: RcOp.ATOMIC,
      sinks: [{ addr: 0x2000n, length: 8, lkey: 5 }],
      atomic: { fetchAdd: false, compareAdd: (1n << 64n) - 1n, swap: 0n },
    });
    const read = atomic({ opcode: RcOp.READ_REQUEST, atomic: undefined, dmaLength: 2 ** 31, va: 0x1000n });
    expect(decoded(read, new Uint8Array(0))).toMatchObject({ opcode: RcOp.READ_REQUEST, dmaLength: 2 ** 31 });
    const refusedAnswer = {
      ...ack,
      verdicts: [
        {
          seq: 5,
          count: 1,
          resp: AckResp.OK,
          walkUs: 0,
          answered: { faults: { source: 1, destination: 2 }, retransmittedBlocks: 3, majorFaults: 4 },
          rnrTimer: 3,
        },
        { seq: 6, count: 1, resp: AckResp.ANSWER_ERR, walkUs: 0, answer: { status: 10, side: 'destination' as const } },
      ],
    };
    expect(decodeFrame(encodePacket(refusedAnswer))).toEqual({ op: Op.ACK, packet: refusedAnswer });
  });

  it("the transport's hello, ping, chunk and exchange frames", () => {
    expect(decodeFrame(encodeHello([0, 1023]))).toEqual({ op: Op.HELLO, nodes: [0, 1023] });
    expect(decodeFrame(encodePing())).toEqual({ op: Op.PING });
    expect(decodeFrame(encodeChunk(100, 40, payload(60)))).toEqual({ op: Op.CHUNK, total: 100, offset: 40, data: payload(60) });
    const body = { op: 'write', size: 4096, odp: false, addr: (1n << 64n) - 1n, neg: -5n, list: [null, true, 'ß', [1.5]], none: undefined };
    const f = decodeFrame(encodeExchange(body));
    expect(f.op).toBe(Op.EXCHANGE);
    expect({ ...(f as { body: object }).body }).toEqual(body);
    expect(decodeFrame(encodeExchange('done'))).toEqual({ op: Op.EXCHANGE, body: 'done' });
  });

  it('a batch carries each frame whole, parts gathered in order', () => {
    const w = write();
    const whole = encodePacket(w, payload(w.length));
    const frames = [[whole.subarray(0, 100), whole.subarray(100)], [encodePing()], [encodeExchange('x')]];
    const f = decodeFrame(Buffer.concat(encodeBatch(frames)));
    expect(f.op).toBe(Op.BATCH);
    if (f.op !== Op.BATCH) return;
    expect(f.frames.map((x) => Buffer.from(x))).toEqual(frames.map((x) => Buffer.concat(x)));
    const first = decodeFrame(f.frames[0]!);
    if (first.op !== Op.WRITE) throw new Error('not a write');
    expect([first.packet.tid, Buffer.from(first.bytes)]).toEqual([w.tid, Buffer.from(payload(w.length))]);
  });

  it("an Outbox's message is the batch of its frames, or a lone frame; a payload may follow it uncopied", () => {
    const w = write();
    const bytes = payload(w.length);
    const box = new Outbox();
    box.packet(w, bytes);
    // One frame: the frame itself, no batch around it.
    expect(Buffer.from(box.take())).toEqual(Buffer.from(encodePacket(w, bytes)));
    expect(box.frames).toBe(0);
    box.packet(w, bytes);
    box.frame(encodePing());
    const ack: AckPacket = { type: 'ack', src: 1, dst: 0, pd: 3, va: 4096n, tid: 2, seq: 0, length: 8192, arrivesAt: 1, resp: AckResp.OK };
    box.packet(ack);
    expect(Buffer.from(box.take())).toEqual(Buffer.concat(encodeBatch([[encodePacket(w, bytes)], [encodePing()], [encodePacket(ack)]])));
    // A payload left out of the box goes as the message's last part: the same bytes.
    box.frame(encodePing());
    box.packet(w, bytes, true);
    expect(box.bytes).toBe(BATCH_HEADER_BYTES + 2 * BATCH_ENTRY_BYTES + 2 + encodePacket(w, bytes).length - bytes.length);
    expect(Buffer.concat([box.take(), bytes])).toEqual(Buffer.concat(encodeBatch([[encodePing()], [encodePacket(w, bytes)]])));
    // The last frame taken out again; a packet that breaks the layout leaves the box as it was.
    box.frame(encodePing());
    box.packet(ack);
    expect(Buffer.from(box.popLast())).toEqual(Buffer.from(encodePacket(ack)));
    expect(() => box.packet({ ...ack, src: 5000 })).toThrow(/src must be an integer in 0\.\.1023/);
    expect(() => box.packet(w, payload(3))).toThrow(/payload must be the/);
    expect([box.frames, Buffer.from(box.take())]).toEqual([1, Buffer.from(encodePing())]);
  });

  it("the engine's runs fit the layout's block count", () => {
    expect(MAX_RUN_BLOCKS).toBeLessThanOrEqual(WIRE_MAX_BLOCKS);
  });
});

describe('wire layout: malformed frames are refused, naming the field', () => {
  const good = encodePacket(write(), payload(write().length));

  it('an empty frame, an unknown opcode, unknown flag bits', () => {
    refused(new Uint8Array(0), /the frame ends inside opcode/);
    refused(Uint8Array.of(0x7e, 0), /unknown opcode 0x7e/);
    const a = encodePacket({ ...ack, verdicts: [], returned: undefined as never }).slice();
    a[1] = 0x80;
    refused(a, /ack: unknown flag bits 0x80/);
    // Every bit of a write's flags is defined: one that announces RC fields needs an RC opcode.
    const f = good.slice();
    f[1] |= 0x80;
    refused(f, /the frame ends inside|opcode must be present with the RC fields/);
    refused(Uint8Array.of(Op.PING, 1), /ping: unknown flag bits/);
  });

  it('a batch of fewer than two frames, a frame length past its end or under 2, bytes after its last frame', () => {
    refused(Uint8Array.of(Op.BATCH, 0, 0, 1, 0, 0, 0, 2, Op.PING, 0), /batch count must be an integer in 2\.\.65535, got 1/);
    refused(Uint8Array.of(Op.BATCH, 1, 0, 2), /batch: unknown flag bits 0x1/);
    refused(Uint8Array.of(Op.BATCH, 0, 0, 2, 0, 0, 0, 2, Op.PING, 0, 0, 0, 0, 9, Op.PING, 0), /the frame ends inside batch\[1\]/);
    refused(Uint8Array.of(Op.BATCH, 0, 0, 2, 0, 0, 0, 2, Op.PING, 0, 0, 0, 0, 1, Op.PING), /batch\[1\] length must be at least 2, got 1/);
    refused(Uint8Array.from([...Buffer.concat(encodeBatch([[encodePing()], [encodePing()]])), 0]), /1 bytes after the last field/);
  });

  it('every truncation of a write, and bytes after its last field', () => {
    for (let n = 1; n < good.length; n += n < 120 ? 1 : 997) refused(good.subarray(0, n), /the frame ends inside/);
    refused(Uint8Array.from([...good, 0]), /1 bytes after the last field/);
  });

  it('a block count of 0 or beyond the bound (no loop over a claimed 1e9 blocks)', () => {
    for (const count of [0, WIRE_MAX_BLOCKS + 1, 0xffff]) {
      const f = good.slice();
      new DataView(f.buffer).setUint16(COUNT_AT, count);
      refused(f, new RegExp(`count must be an integer in 1\\.\\.${WIRE_MAX_BLOCKS}, got ${count}`));
    }
  });

  it('a block size that is not a whole number of pages, a length that does not fit the blocks', () => {
    const f = good.slice();
    new DataView(f.buffer).setUint32(BLOCK_AT, 4097);
    refused(f, /blockSize must be a multiple of 4096, got 4097/);
    expect(() => encodePacket(write({ length: 3 * BS + 1 }), payload(3 * BS + 1))).toThrow(/length must be in 8193\.\.12288 for 3 blocks of 4096/);
    expect(() => encodePacket(write(), payload(10))).toThrow(/payload must be the 8292 bytes the run carries, got 10/);
  });

  it('a span past the end of the address space, a source fault outside the run', () => {
    expect(() => encodePacket(write({ va: (1n << 64n) - 4096n }), payload(write().length))).toThrow(
      /va \+ length must be within the 64-bit address space/,
    );
    expect(() => encodePacket(write({ sourceFault: { seq: 9, faultOffset: 0 } }))).toThrow(/sourceFault\.seq must be an integer in 5\.\.7, got 9/);
  });

  it('an ACK with an unknown resp, a verdict count of 0, a reason longer than its bound', () => {
    const f = encodePacket({ ...ack, verdicts: [], returned: undefined as never });
    const r = f.slice();
    r[2 + 36] = 99; // resp, after the 36-byte header
    refused(r, /resp must be an integer in 0\.\.14, got 99/);
    expect(() => encodePacket({ ...ack, verdicts: [{ seq: 1, count: 0, resp: 0, walkUs: 0 }] })).toThrow(
      /verdicts\[0\]\.count must be an integer in 1\.\.1024, got 0/,
    );
    expect(() => encodePacket({ ...ack, verdicts: [{ seq: 1, count: 1, resp: 0, walkUs: 0, reason: 'x'.repeat(2000) }] })).toThrow(
      /verdicts\[0\]\.reason must be a string of at most 1024 characters/,
    );
  });

  it('RC packets out of range: an unknown opcode, a request with bytes or no operands, too many sinks, fields without an opcode', () => {
    const f = encodePacket(atomic()).slice();
    // The opcode byte follows the write's fixed fields, its key and QP: find it by its value.
    const at = f.indexOf(RcOp.ATOMIC, 60);
    f[at] = 0x3f; // 63: below the XRC and SE bits
    refused(f, /opcode must be an integer in 1\.\.\d+, got 63/);
    expect(() => encodePacket(atomic({ va: 0x1000n, length: 10, lengthHint: 10 }), payload(10))).toThrow(
      /length must be 0 in a ATOMIC request, got 10/,
    );
    expect(() => encodePacket(atomic({ atomic: undefined }))).toThrow(/atomic must be present in an ATOMIC request/);
    expect(() => encodePacket(atomic({ opcode: RcOp.READ_REQUEST, atomic: undefined }))).toThrow(/dmaLength must be an integer in 0\.\.2147483648/);
    const sinks = Array.from({ length: 33 }, () => ({ addr: 0n, length: 1, lkey: 1 }));
    expect(() => encodePacket(atomic({ sinks }))).toThrow(/sinks must be an array of at most 32 entries/);
    expect(() => encodePacket(write({ psn: 3 }), payload(write().length))).toThrow(/opcode must be present with the RC fields/);
    expect(() => encodePacket(write({ opcode: RcOp.WRITE, qpn: 1, srcQpn: 2, psn: 1 << 24 }), payload(write().length))).toThrow(
      /psn must be an integer in 0\.\.16777215/,
    );
  });

  it('FLUSH (RETH range, FETH placement type and selectivity) and ATOMIC_WRITE (8 bytes) round trip; their fields out of range are refused', () => {
    const flush = atomic({
      opcode: RcOp.FLUSH,
      atomic: undefined,
      sinks: undefined,
      dmaLength: 2 * BS,
      flush: { type: 3, level: 1 },
    });
    const f = decodeFrame(encodePacket(flush, new Uint8Array(0)));
    if (f.op !== Op.WRITE) throw new Error('not a write');
    expect(f.packet).toMatchObject({ opcode: RcOp.FLUSH, dmaLength: 2 * BS, flush: { type: 3, level: 1 }, key: 0xdeadbeef });
    expect(f.packet.sinks).toBeUndefined();
    const bytes = encodePacket(flush, new Uint8Array(0)).slice();
    bytes[bytes.length - 16 - 2] = 0; // flush.type, before flush.level and the two modelled times
    refused(bytes, /flush\.type must be an integer in 1\.\.3, got 0/);
    expect(() => encodePacket({ ...flush, flush: { type: 1, level: 2 } })).toThrow(/flush\.level must be an integer in 0\.\.1, got 2/);
    expect(() => encodePacket({ ...flush, flush: undefined })).toThrow(/flush must be present in a FLUSH request/);
    expect(() => encodePacket({ ...flush, sinks: [] })).toThrow(/READ_REQUEST or ATOMIC with sinks/);
    expect(() => encodePacket(atomic({ flush: { type: 1, level: 0 } }))).toThrow(/opcode must be FLUSH with flush/);
    const aw = write({ count: 1, seq: 0, length: 8, lengthHint: 8, opcode: RcOp.ATOMIC_WRITE, qpn: 1, srcQpn: 2, psn: 3, key: 4 });
    const g = decodeFrame(encodePacket(aw, payload(8)));
    if (g.op !== Op.WRITE) throw new Error('not a write');
    expect([g.packet.opcode, g.packet.length, g.bytes]).toEqual([RcOp.ATOMIC_WRITE, 8, payload(8)]);
    expect(() => encodePacket({ ...aw, length: 16, lengthHint: 16 }, payload(16))).toThrow(/length must be 8 in an ATOMIC_WRITE, one block/);
  });

  it("ATOMIC_ACK (an atomic's response: its 8 bytes are AtomicAckETH, the word's old value) round trips; anything but one 8-byte block is refused", () => {
    const ack = write({ count: 1, seq: 0, length: 8, lengthHint: 8, opcode: RcOp.ATOMIC_ACK, qpn: 1, srcQpn: 2, psn: 3, key: 4, srcFaults: 1 });
    const f = decodeFrame(encodePacket(ack, payload(8)));
    if (f.op !== Op.WRITE) throw new Error('not a write');
    expect([f.packet.opcode, f.packet.length, f.bytes, f.packet.psn, f.packet.srcFaults]).toEqual([RcOp.ATOMIC_ACK, 8, payload(8), 3, 1]);
    expect(() => encodePacket({ ...ack, length: 4, lengthHint: 4 }, payload(4))).toThrow(/length must be 8 in an ATOMIC_ACK, one block/);
    expect(() => encodePacket({ ...ack, msgOffset: 0, msgLength: 8 }, payload(8))).toThrow(/length must be 8 in an ATOMIC_ACK, one block/);
    expect(() => encodePacket({ ...ack, srqn: 1 }, payload(8))).toThrow(/opcode must be an RC request with srqn/);
    const bytes = encodePacket(ack, payload(8)).slice();
    const at = bytes.indexOf(RcOp.ATOMIC_ACK, 60);
    bytes[at] = RcOp.ATOMIC_ACK + 1;
    expect(() => decodeFrame(bytes)).toThrow(/opcode must be an integer in 1\.\.12, got 13/);
  });

  it("UD SEND carries DETH's Q_Key, the whole message in one block; a Q_Key elsewhere or a UD message of several blocks is refused", () => {
    const ud = write({
      count: 1,
      seq: 0,
      length: 1024,
      lengthHint: 1024,
      opcode: RcOp.UD_SEND_IMM,
      qpn: 5,
      srcQpn: 6,
      psn: 7,
      qkey: 0xffff_ffff,
      immData: 3,
    });
    const f = decodeFrame(encodePacket(ud, payload(1024)));
    if (f.op !== Op.WRITE) throw new Error('not a write');
    expect([f.packet.opcode, f.packet.qkey, f.packet.immData, f.bytes]).toEqual([RcOp.UD_SEND_IMM, 0xffff_ffff, 3, payload(1024)]);
    expect(() => encodePacket({ ...ud, qkey: undefined }, payload(1024))).toThrow(/qkey must be an integer in 0\.\.4294967295/);
    expect(() => encodePacket({ ...ud, opcode: RcOp.SEND }, payload(1024))).toThrow(/opcode must be UD_SEND or UD_SEND_IMM with qkey/);
    expect(() => encodePacket({ ...ud, seq: 1 }, payload(1024))).toThrow(/a UD message of at most 4096 bytes in one block/);
  });

  it("XRC requests carry XRCETH's SRQ number (the opcode byte's top bit says so); an answer or a datagram naming one is refused", () => {
    const x = write({ count: 1, seq: 0, length: 64, lengthHint: 64, opcode: RcOp.SEND, qpn: 5, srcQpn: 6, psn: 7, srqn: 0xffffff });
    const f = decodeFrame(encodePacket(x, payload(64)));
    if (f.op !== Op.WRITE) throw new Error('not a write');
    expect([f.packet.opcode, f.packet.srqn]).toEqual([RcOp.SEND, 0xffffff]);
    const plain = decodeFrame(encodePacket({ ...x, srqn: undefined }, payload(64)));
    if (plain.op !== Op.WRITE) throw new Error('not a write');
    expect(plain.packet.srqn).toBeUndefined();
    expect(() => encodePacket({ ...x, srqn: 1 << 24 }, payload(64))).toThrow(/srqn must be an integer in 0\.\.16777215/);
    expect(() => encodePacket({ ...x, opcode: RcOp.READ_RESPONSE }, payload(64))).toThrow(/opcode must be an RC request with srqn/);
    expect(() => encodePacket({ ...x, opcode: undefined, qpn: undefined, srcQpn: undefined, psn: undefined }, payload(64))).toThrow(
      /opcode must be present with the RC fields/,
    );
  });

  it('a hello naming a node twice or beyond the node ids, a chunk past its announced size', () => {
    refused(Uint8Array.of(Op.HELLO, 0, 0, 2, 0, 1, 0, 1), /a node is named twice/);
    refused(Uint8Array.of(Op.HELLO, 0, 0, 1, 0x04, 0), /nodes\[0\] must be an integer in 0\.\.1023, got 1024/);
    refused(Uint8Array.of(Op.HELLO, 0, 0, 0), /nodes count must be an integer in 1\.\.1024, got 0/);
    refused(encodeChunk(10, 8, payload(3)), /chunk offset \+ length must be within the announced 10 bytes, got 11/);
    refused(encodeChunk(0xffffffff, 0, payload(3)), /chunk total must be an integer in 1\.\./);
  });

  it('an exchange value nested too deep, an unknown tag, a "__proto__" key that reaches no prototype', () => {
    let deep: unknown = 1;
    for (let i = 0; i < 10; i++) deep = [deep];
    expect(() => encodeExchange(deep)).toThrow(/nested deeper than 8/);
    refused(Uint8Array.of(Op.EXCHANGE, 0, 42), /unknown value tag 42/);
    expect(() => encodeExchange(new Map())).toThrow(/body must be null, a boolean, number, bigint, string, array or plain object/);
    // { "__proto__": { polluted: true } } in the tagged form.
    const key = Buffer.from('__proto__');
    const inner = Buffer.from('polluted');
    const frame = Uint8Array.from([Op.EXCHANGE, 0, 9, 0, 0, 0, 1, 0, 0, 0, key.length, ...key, 9, 0, 0, 0, 1, 0, 0, 0, inner.length, ...inner, 3]);
    const f = decodeFrame(frame) as { body: Record<string, unknown> };
    expect(Object.getPrototypeOf(f.body)).toBeNull();
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });

  it('checkPacket: a va given as a Number, a count of 1e9, a node id out of range', () => {
    expect(() => checkPacket(write({ va: 4096 as unknown as bigint }))).toThrow(/va must be a bigint in 0\.\.2\^64-1, got 4096/);
    // The per-block times of a normal run: the claimed count alone must be refused.
    const times = { issuedUs: new Float64Array(3), arrivals: new Float64Array(3) };
    expect(() => checkPacket(write({ ...times, count: 1e9 }))).toThrow(/count must be an integer in 1\.\.1024, got 1000000000/);
    expect(() => checkPacket(write({ dst: 5000 }))).toThrow(/dst must be an integer in 0\.\.1023, got 5000/);
    expect(() => checkPacket(write({ issuedUs: new Float64Array(1) }))).toThrow(/issuedUs must be a Float64Array of 3 modelled times/);
    expect(() => checkPacket({ type: 'bogus' } as never)).toThrow(WireError);
    // The in-process fabric hands over nothing the layout could not carry.
    const fabric = new Fabric(costModel());
    fabric.attach(1, () => undefined);
    expect(() => fabric.deliver(write({ va: 4096 as unknown as bigint }))).toThrow(WireError);
    try {
      checkPacket(write({ tid: -1 }));
    } catch (e) {
      expect((e as WireError).code).toBe('ERR_WIRE_MALFORMED');
    }
  });
});
