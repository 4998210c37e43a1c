// The in-process rings (kernel-sim/device/rings.ts, cq-ring.ts): entries at the ABI's offsets,
// free-running indices that wrap, a CQ full at the depth asked for.
import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import { cqe, QUEUE_DATA_OFFSET, QUEUE_MAGIC, QueueKind, queueBuf, recvWqe, rxeSge, sendWqe } from '../../../kernel-sim/device/abi.js';
import { CompletionRing } from '../../../kernel-sim/device/cq-ring.js';
import { WrOpcode } from '../../../kernel-sim/device/ib.js';
import { RecvRing } from '../../../kernel-sim/device/recv-ring.js';
import { SendRing } from '../../../kernel-sim/device/send-ring.js';

describe('CompletionRing', () => {
  test('the header carries the geometry; a CQE lands at struct pfr_cqe offsets, imm in network order', () => {
    const r = new CompletionRing(5, 42);
    const v = new DataView(r.buffer);
    expect(v.getUint32(queueBuf.offset('magic'), true)).toBe(QUEUE_MAGIC);
    expect(v.getUint16(queueBuf.offset('kind'), true)).toBe(QueueKind.CQ);
    expect(v.getUint32(queueBuf.offset('num_elems'), true)).toBe(8);
    expect(v.getUint32(queueBuf.offset('handle'), true)).toBe(42);
    const odp = { faults: { source: 1, destination: 2 }, majorFaults: 3, retransmittedBlocks: 4, modelUs: 5.5, realUs: 6.25 };
    expect(r.write(0x1234_5678_9abc_def0n, 0, 128, 64, 7, 9, 0x01020304, odp)).toBe(true);
    const at = QUEUE_DATA_OFFSET;
    expect(v.getBigUint64(at + cqe.offset('wc.wr_id'), true)).toBe(0x1234_5678_9abc_def0n);
    expect(v.getUint32(at + cqe.offset('wc.opcode'), true)).toBe(128);
    expect(v.getUint32(at + cqe.offset('wc.byte_len'), true)).toBe(64);
    expect(v.getUint32(at + cqe.offset('wc.qp_num'), true)).toBe(7);
    expect(v.getUint32(at + cqe.offset('wc.src_qp'), true)).toBe(9);
    expect(v.getUint8(at + cqe.offset('wc.ex.imm_data'))).toBe(1); // big-endian: 0x01 first
    expect(v.getUint32(at + cqe.offset('wc.wc_flags'), true)).toBe(2); // IBV_WC_WITH_IMM
    expect(v.getFloat64(at + cqe.offset('odp.model_us'), true)).toBe(5.5);
    expect(v.getUint32(queueBuf.offset('producer_index'), true)).toBe(1);
  });

  test('any interleaving of writes and reads: FIFO order, full at the depth, indices wrap past 2^32', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 40 }), fc.array(fc.boolean(), { maxLength: 300 }), fc.boolean(), (depth, ops, nearWrap) => {
        const r = new CompletionRing(depth);
        if (nearWrap) {
          const idx = new Uint32Array(r.buffer, 0, QUEUE_DATA_OFFSET / 4);
          idx[queueBuf.offset('producer_index') / 4] = 0xffff_fff0;
          idx[queueBuf.offset('consumer_index') / 4] = 0xffff_fff0;
        }
        let next = 0n;
        let expected = 0n;
        let held = 0;
        for (const write of ops) {
          if (write) {
            const ok = r.write(next, 0, 0, 0, 0, 0, undefined, undefined);
            expect(ok).toBe(held < depth);
            if (ok) {
              next++;
              held++;
            }
          } else if (held > 0) {
            expect(r.view.getBigUint64(r.slot(r.consumer) + cqe.offset('wc.wr_id'), true)).toBe(expected++);
            expect(Number.isNaN(r.view.getFloat64(r.slot(r.consumer) + cqe.offset('odp.model_us'), true))).toBe(true);
            r.consumed();
            held--;
          }
          expect(r.count).toBe(held);
        }
      }),
    );
  });
});

describe('RecvRing', () => {
  test('WQEs land at struct pfr_recv_wqe offsets; head is one object until consumed; given back goes first', () => {
    const r = new RecvRing(3, 2);
    expect(r.numElems).toBe(4);
    expect(
      r.push({
        wrId: 7,
        sgList: [
          { addr: 0x1000n, length: 10, lkey: 5 },
          { addr: 0x2000n, length: 20, lkey: 6 },
        ],
      }),
    ).toBe(true);
    const at = r.slot(0);
    expect(r.view.getBigUint64(at + recvWqe.offset('wr_id'), true)).toBe(7n);
    expect(r.view.getUint32(at + recvWqe.offset('dma.length'), true)).toBe(30);
    expect(r.view.getUint32(at + recvWqe.offset('dma.num_sge'), true)).toBe(2);
    expect(r.view.getBigUint64(at + recvWqe.size + rxeSge.size + rxeSge.offset('addr'), true)).toBe(0x2000n);
    const h = r.head();
    expect(h).toEqual({
      wrId: 7n,
      sgList: [
        { addr: 0x1000n, length: 10, lkey: 5 },
        { addr: 0x2000n, length: 20, lkey: 6 },
      ],
    });
    expect(r.head()).toBe(h);
    expect(r.shift()).toBe(h);
    expect(r.length).toBe(0);
    r.unshift(h!);
    r.push({ wrId: 8, sgList: [] });
    expect(r.drain().map((w) => w.wrId)).toEqual([7n, 8n]);
    expect(
      r.push({
        wrId: 9,
        sgList: [
          { addr: 0n, length: 1, lkey: 1 },
          { addr: 0n, length: 1, lkey: 1 },
          { addr: 0n, length: 1, lkey: 1 },
        ],
      }),
    ).toBe(r.maxSge >= 3);
  });

  test('any interleaving of posts, takes and give-backs keeps FIFO order, full at the slots', () => {
    fc.assert(
      fc.property(fc.array(fc.constantFrom('push', 'shift', 'back'), { maxLength: 200 }), (ops) => {
        const r = new RecvRing(8, 1);
        const model: bigint[] = [];
        let next = 0n;
        let taken: ReturnType<typeof r.shift>;
        for (const op of ops) {
          if (op === 'push') {
            const room = r.count < 8;
            const ok = r.push({ wrId: next, sgList: [{ addr: next, length: 1, lkey: 1 }] });
            expect(ok).toBe(room);
            if (ok) model.push(next++);
          } else if (op === 'shift') {
            taken = r.shift();
            expect(taken?.wrId).toBe(model.shift());
          } else if (taken) {
            r.unshift(taken);
            model.unshift(taken.wrId as bigint);
            taken = undefined;
          }
          expect(r.length).toBe(model.length);
        }
      }),
    );
  });
});

describe('SendRing', () => {
  const ah = { name: 'an AH' };
  const wrs = [
    {
      wrId: 1n,
      opcode: WrOpcode.RDMA_WRITE_WITH_IMM,
      sgList: [{ addr: 0x10n, length: 64, lkey: 3 }],
      sendFlags: 2,
      immData: 0xdeadbeef,
      rdma: { remoteAddr: 0x2000n, rkey: 9 },
    },
    {
      wrId: 2n,
      opcode: WrOpcode.ATOMIC_CMP_AND_SWP,
      sgList: [{ addr: 0x20n, length: 8, lkey: 3 }],
      sendFlags: 0,
      atomic: { remoteAddr: 0x3000n, rkey: 8, compareAdd: 5n, swap: 7n },
    },
    {
      wrId: 3n,
      opcode: WrOpcode.ATOMIC_FETCH_AND_ADD,
      sgList: [{ addr: 0x20n, length: 8, lkey: 3 }],
      sendFlags: 0,
      atomic: { remoteAddr: 0x3000n, rkey: 8, compareAdd: 2n ** 64n - 1n },
    },
    { wrId: 4n, opcode: WrOpcode.FLUSH, sgList: [], sendFlags: 0, flush: { remoteAddr: 0x4000n, rkey: 7, length: 4096, type: 1, level: 0 } },
    {
      wrId: 5n,
      opcode: WrOpcode.RDMA_READ,
      sgList: [
        { addr: 0x30n, length: 100, lkey: 4 },
        { addr: 0x40n, length: 28, lkey: 4 },
      ],
      sendFlags: 2,
      rdma: { remoteAddr: 0x5000n, rkey: 6 },
    },
  ];

  test('every kind of WR comes back from its WQE as it was posted; fields at struct pfr_send_wqe offsets', () => {
    const r = new SendRing(8, 2);
    for (const wr of wrs) expect(r.push(wr)).toBe(true);
    expect(r.view.getUint32(r.slot(0) + sendWqe.offset('wr.opcode'), true)).toBe(WrOpcode.RDMA_WRITE_WITH_IMM);
    expect(r.view.getUint8(r.slot(0) + sendWqe.offset('wr.ex.imm_data'))).toBe(0xde);
    expect(r.view.getBigUint64(r.slot(0) + sendWqe.offset('wr.wr.rdma.remote_addr'), true)).toBe(0x2000n);
    expect(r.view.getUint32(r.slot(4) + sendWqe.offset('dma.length'), true)).toBe(128);
    expect(r.drain()).toEqual(wrs);
  });

  test('UD: the AH is named by a handle and comes back as the same object; XRC: the SRQ number', () => {
    const u = new SendRing(2, 1, { ud: true });
    u.push({ wrId: 1, opcode: WrOpcode.SEND, sgList: [], ud: { ah, remoteQpn: 0x123, remoteQkey: 0x11 } });
    expect(u.head()!.ud!.ah).toBe(ah);
    expect(u.shift()!.ud).toMatchObject({ remoteQpn: 0x123, remoteQkey: 0x11 });
    const x = new SendRing(2, 1, { xrc: true });
    x.push({ wrId: 1, opcode: WrOpcode.SEND, sgList: [], xrc: { remoteSrqn: 0xabcdef } });
    expect(x.shift()!.xrc).toEqual({ remoteSrqn: 0xabcdef });
    expect(x.push({ wrId: 2, opcode: WrOpcode.SEND, sgList: [] })).toBe(true);
    expect(x.push({ wrId: 3, opcode: WrOpcode.SEND, sgList: [] })).toBe(true);
    expect(x.push({ wrId: 4, opcode: WrOpcode.SEND, sgList: [] })).toBe(false); // full
  });
});
