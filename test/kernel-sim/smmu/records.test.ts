// Record and command layouts (SMMUv3 IHI0070, Linux arm-smmu-v3.h EVTQ_* / CMDQ_RESUME_*),
// the IOPF form of a fault (include/linux/iommu.h, io-pgfault.c), and the two small queues
// of the SMMU: the event queue and the IOTLB.
import { describe, expect, test } from 'vitest';
import {
  CMD_RESUME,
  CMD_STALL_TERM,
  decodeEvent,
  encodeEvent,
  encodeResume,
  EvtClass,
  EvtId,
  eventName,
  EventQueue,
  Iotlb,
  IOMMU_FAULT_PAGE_REQ,
  IOMMU_FAULT_PAGE_REQUEST_LAST_PAGE,
  IOMMU_FAULT_PAGE_REQUEST_PASID_VALID,
  IOMMU_FAULT_PERM_EXEC,
  IOMMU_FAULT_PERM_PRIV,
  IOMMU_FAULT_PERM_READ,
  IOMMU_FAULT_PERM_WRITE,
  IommuPageResponseCode,
  isRecoverable,
  resumeFor,
  ResumeResp,
  toPageRequest,
  type SmmuEventRecord,
} from '../../../kernel-sim/index.js';

const base: SmmuEventRecord = {
  id: EvtId.F_TRANSLATION,
  sid: 0,
  ssv: false,
  ssid: 0,
  stag: 0,
  stall: false,
  pnu: false,
  ind: false,
  rnw: false,
  s2: false,
  class: EvtClass.IN,
  addr: 0n,
};

const bitsOf = (v: bigint): number[] => {
  const out: number[] = [];
  for (let i = 0; i < 64; i++) if ((v >> BigInt(i)) & 1n) out.push(i);
  return out;
};

describe('event records', () => {
  test('the fault ids have the spec values', () => {
    expect([EvtId.F_TRANSLATION, EvtId.F_ADDR_SIZE, EvtId.F_ACCESS, EvtId.F_PERMISSION]).toEqual([0x10, 0x11, 0x12, 0x13]);
    expect(eventName(EvtId.F_PERMISSION)).toBe('F_PERMISSION');
    expect(eventName(0x7f as EvtId)).toBe('0x7f');
  });

  test('a record is 4 × u64 and round-trips through encode/decode', () => {
    const samples: SmmuEventRecord[] = [
      base,
      {
        ...base,
        id: EvtId.F_PERMISSION,
        sid: 0xffffffff,
        ssv: true,
        ssid: 0xfffff,
        stag: 0xffff,
        stall: true,
        pnu: true,
        ind: true,
        rnw: true,
        s2: true,
        class: EvtClass.TT,
        addr: 0xffff_ffff_ffff_f000n,
      },
      { ...base, id: EvtId.F_ADDR_SIZE, sid: 0x1234, ssid: 0x5678, stag: 0x9abc, rnw: true, class: EvtClass.CD, addr: 0x7f12_3456_7000n },
      { ...base, id: EvtId.F_ACCESS, sid: 1, stall: true, stag: 1, addr: 1n },
    ];
    for (const r of samples) {
      const d = encodeEvent(r);
      expect(d).toBeInstanceOf(BigUint64Array);
      expect(d.length).toBe(4);
      expect(d.byteLength).toBe(32);
      expect(decodeEvent(d)).toEqual(r);
    }
  });

  test('each field sits at its EVTQ_* position', () => {
    const one = (r: Partial<SmmuEventRecord>) => encodeEvent({ ...base, id: 0 as EvtId, class: EvtClass.CD, ...r });
    // dword 0: ID [7:0], SSV [11], SSID [31:12], SID [63:32]
    expect(one({ id: EvtId.F_PERMISSION })[0]).toBe(0x13n);
    expect(bitsOf(one({ ssv: true })[0]!)).toEqual([11]);
    expect(one({ ssid: 1 })[0]).toBe(1n << 12n);
    expect(one({ ssid: 0xfffff })[0]).toBe(0xfffffn << 12n);
    expect(one({ sid: 1 })[0]).toBe(1n << 32n);
    expect(one({ sid: 0xffffffff })[0]).toBe(0xffffffffn << 32n);
    // dword 1: STAG [15:0], STALL [31], PnU [33], InD [34], RnW [35], S2 [39], CLASS [41:40]
    expect(one({ stag: 0xffff })[1]).toBe(0xffffn);
    expect(bitsOf(one({ stall: true })[1]!)).toEqual([31]);
    expect(bitsOf(one({ pnu: true })[1]!)).toEqual([33]);
    expect(bitsOf(one({ ind: true })[1]!)).toEqual([34]);
    expect(bitsOf(one({ rnw: true })[1]!)).toEqual([35]);
    expect(bitsOf(one({ s2: true })[1]!)).toEqual([39]);
    expect(one({ class: EvtClass.TT })[1]).toBe(1n << 40n);
    expect(one({ class: EvtClass.IN })[1]).toBe(2n << 40n);
    // dword 2: the input address, all 64 bits; dword 3 unused here
    const d = one({ addr: 0xdead_beef_cafe_f000n });
    expect(d[2]).toBe(0xdead_beef_cafe_f000n);
    expect(d[3]).toBe(0n);
    // Nothing leaks into other dwords
    expect([...one({ rnw: true, stall: true, stag: 5 })].map((x, i) => (i === 1 ? 0n : x))).toEqual([0n, 0n, 0n, 0n]);
  });

  test('out-of-range values are masked to their field, not spilled into neighbours', () => {
    const d = encodeEvent({ ...base, id: 0x1ff as EvtId, ssid: 0x1fffff, stag: 0x1ffff });
    expect(d[0]! & 0xffn).toBe(0xffn);
    expect(bitsOf(d[0]!).includes(8)).toBe(false);
    expect(d[0]! >> 32n).toBe(0n); // SSID overflow did not reach SID
    expect(d[1]).toBe(0xffffn | (2n << 40n)); // STAG overflow did not reach bit 16
  });
});

describe('commands', () => {
  test('CMD_RESUME / CMD_STALL_TERM opcodes and RESP values', () => {
    expect(CMD_RESUME).toBe(0x44);
    expect(CMD_STALL_TERM).toBe(0x45);
    expect([ResumeResp.TERM, ResumeResp.RETRY, ResumeResp.ABORT]).toEqual([0, 1, 2]);
  });

  test('CMD_RESUME: opcode [7:0], RESP [13:12], SID [63:32]; STAG in dword 1 [15:0]', () => {
    const d = encodeResume({ opcode: CMD_RESUME, sid: 0xabcd1234, stag: 0xbeef, resp: ResumeResp.ABORT });
    expect(d.length).toBe(2);
    expect(d[0]! & 0xffn).toBe(0x44n);
    expect((d[0]! >> 12n) & 3n).toBe(2n);
    expect(d[0]! >> 32n).toBe(0xabcd1234n);
    expect(d[1]).toBe(0xbeefn);
    expect(encodeResume({ opcode: CMD_RESUME, sid: 0, stag: 0, resp: ResumeResp.RETRY })[0]).toBe(0x44n | (1n << 12n));
    expect(encodeResume({ opcode: CMD_RESUME, sid: 0, stag: 0, resp: ResumeResp.TERM })[0]).toBe(0x44n);
  });
});

describe('IOPF form (iommu_fault_page_request)', () => {
  test('a read fault asks for READ, a write fault for WRITE; LAST_PAGE always; grpid = STAG', () => {
    const r = toPageRequest({ ...base, rnw: true, stag: 42, addr: 0x1000n }, 8192);
    expect(r).toEqual({
      type: IOMMU_FAULT_PAGE_REQ,
      flags: IOMMU_FAULT_PAGE_REQUEST_LAST_PAGE,
      pasid: 0,
      grpid: 42,
      perm: IOMMU_FAULT_PERM_READ,
      addr: 0x1000n,
      length: 8192,
    });
    expect(toPageRequest({ ...base, rnw: false }, 0).perm).toBe(IOMMU_FAULT_PERM_WRITE);
  });

  test('InD adds EXEC, PnU adds PRIV, SSV gives PASID_VALID with the SSID as PASID', () => {
    const r = toPageRequest({ ...base, rnw: true, ind: true, pnu: true, ssv: true, ssid: 77 }, 0);
    expect(r.perm).toBe(IOMMU_FAULT_PERM_READ | IOMMU_FAULT_PERM_EXEC | IOMMU_FAULT_PERM_PRIV);
    expect(r.flags).toBe(IOMMU_FAULT_PAGE_REQUEST_LAST_PAGE | IOMMU_FAULT_PAGE_REQUEST_PASID_VALID);
    expect(r.pasid).toBe(77);
  });

  test('page responses map to CMD_RESUME: SUCCESS → RETRY, INVALID / FAILURE → ABORT', () => {
    expect([IommuPageResponseCode.SUCCESS, IommuPageResponseCode.INVALID, IommuPageResponseCode.FAILURE]).toEqual([0, 1, 2]);
    expect(resumeFor(IommuPageResponseCode.SUCCESS)).toBe(ResumeResp.RETRY);
    expect(resumeFor(IommuPageResponseCode.INVALID)).toBe(ResumeResp.ABORT);
    expect(resumeFor(IommuPageResponseCode.FAILURE)).toBe(ResumeResp.ABORT);
    expect(resumeFor(9 as IommuPageResponseCode)).toBe(ResumeResp.TERM);
  });

  test('recoverable: translation and access faults; permission faults only when stalled; address size never', () => {
    expect(isRecoverable({ ...base, id: EvtId.F_TRANSLATION })).toBe(true);
    expect(isRecoverable({ ...base, id: EvtId.F_ACCESS })).toBe(true);
    expect(isRecoverable({ ...base, id: EvtId.F_PERMISSION })).toBe(false);
    expect(isRecoverable({ ...base, id: EvtId.F_PERMISSION, stall: true })).toBe(true);
    expect(isRecoverable({ ...base, id: EvtId.F_ADDR_SIZE })).toBe(false);
    expect(isRecoverable({ ...base, id: EvtId.F_ADDR_SIZE, stall: true })).toBe(false);
  });
});

describe('event queue', () => {
  test('bounded: a full queue loses the record and counts it; drain decodes in order', () => {
    const q = new EventQueue(2);
    expect(q.push({ ...base, sid: 1, addr: 0x1000n })).toBe(true);
    expect(q.push({ ...base, sid: 2, addr: 0x2000n, rnw: true })).toBe(true);
    expect(q.push({ ...base, sid: 3 })).toBe(false);
    expect(q.push({ ...base, sid: 4 })).toBe(false);
    expect([q.length, q.recorded, q.overflows]).toEqual([2, 2, 2]);
    const out = q.drain();
    expect(out.map((r) => [r.sid, r.addr, r.rnw])).toEqual([
      [1, 0x1000n, false],
      [2, 0x2000n, true],
    ]);
    expect(q.length).toBe(0);
    expect(q.push({ ...base, sid: 5 })).toBe(true);
    expect([q.recorded, q.overflows]).toEqual([3, 2]);
  });

  test.each([0, -1, 1.5, Number.NaN])('capacity %s is refused', (cap) => {
    expect(() => new EventQueue(cap)).toThrow(RangeError);
  });
});

describe('IOTLB', () => {
  test('per-stream entries, LRU eviction at capacity, hit/miss counts', () => {
    const t = new Iotlb(2);
    t.insert(1, 0x1000n);
    t.insert(1, 0x2000n);
    expect(t.lookup(2, 0x1000n)).toBe(false); // another stream's translation is not shared
    expect(t.lookup(1, 0x1000n)).toBe(true); // 0x1000 is now the most recent
    t.insert(1, 0x3000n); // evicts 0x2000
    expect(t.lookup(1, 0x2000n)).toBe(false);
    expect(t.lookup(1, 0x1000n)).toBe(true);
    expect(t.lookup(1, 0x3000n)).toBe(true);
    expect([t.hits, t.misses, t.size]).toEqual([3, 2, 2]);
  });

  test('insertMissedAt (after a miss) caches and evicts as insertAt does', () => {
    const t = new Iotlb(2);
    for (const p of [0x1000, 0x2000, 0x3000]) {
      expect(t.lookupAt(1, p)).toBe(false);
      t.insertMissedAt(1, p, p / 0x1000);
    }
    expect([t.lookupAt(1, 0x1000), t.lookupAt(1, 0x2000), t.lookupAt(1, 0x3000)]).toEqual([false, true, true]);
    expect(t.entriesIn(0n, 0x4000).map((e) => e.frame)).toEqual([2, 3]);
    expect(t.invalidateRange(0n, 0x4000, 4096)).toBe(2);
  });

  test('random lookups, inserts and invalidations: the same answers, order and counters as a Map-ordered LRU', () => {
    // The reference: a Map whose insertion order is the LRU order (what the IOTLB was first).
    let seed = 1;
    const rnd = (n: number): number => (seed = (seed * 1103515245 + 12345) % 2147483648) % n;
    const base = 0x7f1234500000;
    for (const cap of [1, 3, 17, 100]) {
      const t = new Iotlb(cap);
      const ref = new Map<string, { sid: number; page: number; frame: number }>();
      let hits = 0;
      let invalidations = 0;
      const look = (sid: number, page: number): boolean => {
        const e = ref.get(`${sid}:${page}`);
        if (!e) return false;
        ref.delete(`${sid}:${page}`);
        ref.set(`${sid}:${page}`, e);
        hits++;
        return true;
      };
      const insert = (sid: number, page: number, frame: number): void => {
        ref.delete(`${sid}:${page}`);
        ref.set(`${sid}:${page}`, { sid, page, frame });
        if (ref.size > cap) ref.delete(ref.keys().next().value!);
      };
      for (let i = 0; i < 20000; i++) {
        const op = rnd(100);
        const sid = 1 + rnd(3);
        const page = base + rnd(300) * 4096;
        if (op < 45) expect(t.lookupAt(sid, page)).toBe(look(sid, page));
        else if (op < 75) {
          t.insertAt(sid, page, i);
          insert(sid, page, i);
        } else if (op < 93) {
          const hit = look(sid, page);
          expect(t.lookupAt(sid, page)).toBe(hit);
          if (!hit) {
            t.insertMissedAt(sid, page, i);
            insert(sid, page, i);
          }
        } else if (op < 97) {
          const length = rnd(20) * 4096;
          const gone = [...ref].filter(([, e]) => e.page >= page && e.page < page + length);
          for (const [k] of gone) ref.delete(k);
          invalidations += gone.length;
          expect(t.invalidateRange(BigInt(page), length, 4096)).toBe(gone.length);
        } else if (op < 98) {
          t.invalidateStream(sid);
          for (const [k, e] of [...ref]) if (e.sid === sid) ref.delete(k);
        } else {
          const held = t.entriesIn(BigInt(base), 300 * 4096).map((e) => ({ sid: e.sid, page: Number(e.page), frame: e.frame }));
          expect(held).toEqual([...ref.values()]);
        }
        expect(t.size).toBe(ref.size);
      }
      expect([t.hits, t.invalidations]).toEqual([hits, invalidations]);
    }
  });

  test("invalidateRange drops every stream's pages of the range, and only those", () => {
    const t = new Iotlb(100);
    for (let p = 0; p < 8; p++) {
      t.insert(1, BigInt(p * 4096));
      t.insert(2, BigInt(p * 4096));
    }
    // A range not aligned to pages covers every page it touches.
    expect(t.invalidateRange(4096n + 100n, 2 * 4096, 4096)).toBe(6);
    expect(t.invalidations).toBe(6);
    for (const s of [1, 2]) {
      expect([0, 1, 2, 3, 4, 5, 6, 7].map((p) => t.lookup(s, BigInt(p * 4096)))).toEqual([true, false, false, false, true, true, true, true]);
    }
    // Both strategies (few entries vs a large range) give the same answer.
    expect(t.invalidateRange(0n, 1 << 30, 4096)).toBe(10);
    expect(t.size).toBe(0);
  });

  test('invalidateStream drops one stream only', () => {
    const t = new Iotlb(10);
    t.insert(1, 0n);
    t.insert(11, 0n);
    t.invalidateStream(1);
    expect(t.lookup(1, 0n)).toBe(false);
    expect(t.lookup(11, 0n)).toBe(true);
  });
});
