// Two defects the random-WR oracle found (issue 35), each as a plain test: an RDMA READ whose
// SGE list has a zero-length entry first (rxe's copy_data skips a zero-length SGE wherever it
// stands), and a WRITE or atomic whose remote range passes 2^64 (no MR covers it: an R_Key
// violation, REM_ACCESS_ERR, never a throw in the engine). And RC's local ACK timeout: a READ
// or an atomic whose response never comes ends in RETRY_EXC_ERR after timeout × (retry_cnt + 1).
import { afterEach, describe, expect, test } from 'vitest';
import { Fabric, DEFAULT_COSTS, RcOp, type Packet } from '../../kernel-sim/index.js';
import { QpState, SendFlags, WcStatus, WrOpcode, type SendWr, type WorkCompletion } from '../../lib/index.js';
import { closeAll, createPlayers, next, P, PINNED_ACCESS, type Player } from './helpers.js';

afterEach(closeAll);

async function run(p: Player, wr: Omit<SendWr, 'wrId' | 'sendFlags'>, timeoutMs?: number): Promise<WorkCompletion> {
  p.qp.postSend({ wrId: 1, sendFlags: SendFlags.SIGNALED, ...wr });
  return next(p.cq, timeoutMs);
}

const TOP = 1n << 64n;

describe('an RDMA READ with zero-length SGEs', () => {
  test.each([
    ['first', [0, 43, 6964]],
    ['first two', [0, 0, 7007]],
    ['middle', [43, 0, 6964]],
    ['last', [43, 6964, 0]],
    ['all', [0, 0, 0]],
  ])('zero-length SGE %s, ODP and pinned sinks: SUCCESS with every byte, then the QP goes on', async (_, lengths) => {
    for (const pinned of [false, true]) {
      const { client, server } = createPlayers({ size: 4 * P, shared: true, cap: { maxSendSge: 3 }, ...(pinned ? { access: PINNED_ACCESS } : {}) });
      for (let i = 0; i < 2 * P; i++) server.bytes(0, 2 * P)[i] = (i * 31 + 7) & 0xff;
      client.fill(0xee, 0, 4 * P);
      // ODP sinks unmapped (memfd: their bytes stay): the first response packet faults at the sink and is NACKed.
      if (!pinned) client.region.unmapPages(0, 4 * P);
      let off = 0;
      // A zero-length SGE names an address of its own (nothing of it is touched).
      const sgList = lengths.map((n) => {
        const s = n === 0 ? client.sge(3 * P + 100, 0) : client.sge(off, n);
        off += n;
        return s;
      });
      const total = off;
      const wc = await run(client, { opcode: WrOpcode.RDMA_READ, sgList, rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey } });
      expect(wc, `${pinned ? 'pinned' : 'ODP'} ${lengths.join(',')}`).toMatchObject({ status: WcStatus.SUCCESS, byteLen: total });
      expect(client.bytes(0, total).equals(server.bytes(0, total))).toBe(true);
      expect(client.bytes(total, 4 * P - total).every((b) => b === 0xee)).toBe(true);
      // The QP is not stuck behind it.
      const after = await run(client, {
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [client.sge(0, 64)],
        rdma: { remoteAddr: server.at(3 * P), rkey: server.mr.rkey },
      });
      expect(after.status).toBe(WcStatus.SUCCESS);
      closeAll();
    }
  });
});

describe('a remote range that passes 2^64', () => {
  const cases: Array<[string, (c: Player, rkey: number) => Omit<SendWr, 'wrId' | 'sendFlags'>]> = [
    ['WRITE at 2^64-8, 16 bytes', (c, rkey) => ({ opcode: WrOpcode.RDMA_WRITE, sgList: [c.sge(0, 16)], rdma: { remoteAddr: TOP - 8n, rkey } })],
    [
      'WRITE_WITH_IMM at 2^64-8',
      (c, rkey) => ({ opcode: WrOpcode.RDMA_WRITE_WITH_IMM, immData: 5, sgList: [c.sge(0, 16)], rdma: { remoteAddr: TOP - 8n, rkey } }),
    ],
    [
      '2-SGE WRITE whose second piece starts at 2^64',
      (c, rkey) => ({ opcode: WrOpcode.RDMA_WRITE, sgList: [c.sge(0, 8), c.sge(64, 8)], rdma: { remoteAddr: TOP - 8n, rkey } }),
    ],
    ['ATOMIC_WRITE at 2^64-4', (c, rkey) => ({ opcode: WrOpcode.ATOMIC_WRITE, sgList: [c.sge(0, 8)], rdma: { remoteAddr: TOP - 4n, rkey } })],
    ['ATOMIC_WRITE at 2^64-8', (c, rkey) => ({ opcode: WrOpcode.ATOMIC_WRITE, sgList: [c.sge(0, 8)], rdma: { remoteAddr: TOP - 8n, rkey } })],
    ['READ at 2^64-8, 16 bytes', (c, rkey) => ({ opcode: WrOpcode.RDMA_READ, sgList: [c.sge(0, 16)], rdma: { remoteAddr: TOP - 8n, rkey } })],
    [
      'FETCH_ADD at 2^64-8',
      (c, rkey) => ({ opcode: WrOpcode.ATOMIC_FETCH_AND_ADD, sgList: [c.sge(0, 8)], atomic: { remoteAddr: TOP - 8n, rkey, compareAdd: 1n } }),
    ],
  ];
  test.each(cases)('%s: REM_ACCESS_ERR, nothing lands, the process lives', async (what, wr) => {
    const { client, server, cluster } = createPlayers({ size: 4 * P, cap: { maxSendSge: 2 } });
    server.fill(0x5a, 0, 4 * P);
    client.fill(0x11, 0, 4 * P);
    server.qp.postRecv({ wrId: 9, sgList: [server.sge(0, 64)] });
    const wc = await run(client, wr(client, server.mr.rkey));
    expect(wc.status, what).toBe(WcStatus.REM_ACCESS_ERR);
    expect(wc.byteLen).toBe(0);
    expect(server.bytes(0, 4 * P).every((b) => b === 0x5a)).toBe(true);
    expect(client.bytes(0, 4 * P).every((b) => b === 0x11)).toBe(true);
    expect(client.qp.state).toBe(QpState.ERR);
    // The engine is fine: a new connection works.
    expect(cluster.closed).toBe(false);
  });
});

describe("RC's local ACK timeout of a READ and an atomic", () => {
  // A link that loses every response (READ_RESPONSE, ATOMIC_ACK) while `lose` is set.
  class LossyFabric extends Fabric {
    lose = false;
    lost = 0;
    override deliver(p: Packet): void {
      if (this.lose && p.type === 'write' && (p.opcode === RcOp.READ_RESPONSE || p.opcode === RcOp.ATOMIC_ACK)) {
        this.lost++;
        return;
      }
      super.deliver(p);
    }
  }
  test.each([
    ['RDMA_READ', WrOpcode.RDMA_READ],
    ['FETCH_ADD', WrOpcode.ATOMIC_FETCH_AND_ADD],
  ])('%s whose response is lost: RETRY_EXC_ERR after about timeout × (retry_cnt + 1), then the QP is in ERR', async (_, opcode) => {
    const fabric = new LossyFabric({ ...DEFAULT_COSTS });
    const { client, server } = createPlayers({ size: 4 * P, cluster: { transport: fabric, faultTimeoutMs: 50 }, rc: { retryCnt: 2, timeout: 12 } });
    fabric.lose = true;
    const t0 = performance.now();
    const wr: Omit<SendWr, 'wrId' | 'sendFlags'> =
      opcode === WrOpcode.RDMA_READ
        ? { opcode, sgList: [client.sge(0, 64)], rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey } }
        : { opcode, sgList: [client.sge(0, 8)], atomic: { remoteAddr: server.at(0), rkey: server.mr.rkey, compareAdd: 1n } };
    const wc = await run(client, wr, 10_000);
    const ms = performance.now() - t0;
    expect(wc.status).toBe(WcStatus.RETRY_EXC_ERR);
    expect(fabric.lost).toBeGreaterThan(0);
    // timeout 12: 16.8 ms a period, floored at the engine's fault timeout (50 ms); 3 periods.
    expect(ms).toBeGreaterThanOrEqual(140);
    expect(ms).toBeLessThan(5_000);
    expect(client.qp.state).toBe(QpState.ERR);
  });
});

describe('an ATOMIC WRITE takes no receive (found by the random-WR oracle)', () => {
  test('with a receive posted, ATOMIC_WRITE succeeds and the receive stays posted (then flushed by ERR)', async () => {
    const { client, server } = createPlayers({ size: 4 * P });
    server.qp.postRecv({ wrId: 7, sgList: [server.sge(64, 16)] });
    const wc = await run(client, {
      opcode: WrOpcode.ATOMIC_WRITE,
      sgList: [client.sge(0, 8)],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect(wc).toMatchObject({ status: WcStatus.SUCCESS, byteLen: 8 });
    expect(server.cq.poll(4)).toEqual([]);
    server.qp.modify({ qpState: QpState.ERR });
    const flushed = await next(server.cq);
    expect([flushed.wrId, flushed.status]).toEqual([7n, WcStatus.WR_FLUSH_ERR]);
  });
});
