// Resolution policies seen through the verbs API: the same 64-page RDMA WRITE into an
// evicted destination takes 64 faults under touch, 1 under touch-ahead, a few under prefetch
// (its window grows 4 → 8 → 16 → 32 → 64 pages on sequential faults), and none when the
// memory is pinned or prefaulted. Changing an MR's policy at run time takes effect on the
// next transfer.
import { afterEach, describe, expect, test } from 'vitest';
import { Access, SendFlags, WrOpcode, type PolicyName } from '../../lib/index.js';
import { allBytes, closeAll, createPlayers, delta, P, PINNED_ACCESS, pollOk, thrown, type Player } from './helpers.js';

afterEach(closeAll);

const PAGES = 64;

/** Write 64 pages of 0x5a (client, resident) into the server's evicted buffer. */
async function write64(client: Player, server: Player, byte = 0x5a) {
  client.fill(byte, 0, PAGES * P);
  if (!server.mr.pinned) server.region.evict();
  const before = server.ctx.faultLibrary.stats();
  client.qp.postSend({
    wrId: 1,
    opcode: WrOpcode.RDMA_WRITE,
    sgList: [client.sge(0, PAGES * P)],
    sendFlags: SendFlags.SIGNALED,
    rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
  });
  const wc = await pollOk(client.cq);
  allBytes(server.bytes(0, PAGES * P), byte);
  expect(server.region.residentPages()).toBe(PAGES);
  return { wc, lib: delta(server.ctx.faultLibrary.stats(), before) };
}

describe('the same evicted 64-page transfer under each policy', () => {
  // Prefetch, fresh MR: fault at page 0 (no pattern yet: window 4), then at 4, 12, 28 and 60,
  // each right after the previous window: the window doubles to 8, 16, 32, 64.
  const expected: Array<[PolicyName, number, number]> = [
    ['touch', 64, 64],
    ['touch-ahead', 1, 1],
    ['prefetch', 5, 5],
    ['prefault', 0, 0],
  ];
  test.each(expected)('%s: %i destination faults', async (policy, faults, notifications) => {
    const { client, server } = createPlayers({ policy, size: PAGES * P });
    expect(server.mr.policy).toBe(policy);
    const { wc, lib } = await write64(client, server);
    expect(wc.odp!.faults).toEqual({ source: 0, destination: faults });
    expect(wc.odp!.retransmittedBlocks).toBe(faults);
    expect(lib.destination).toBe(notifications);
    // Faults resolved by the library made every page resident; prefault did it beforehand.
    expect(lib.pages).toBe(policy === 'prefault' ? 0 : PAGES);
    expect(server.mr.registration!.stats.faults.destination).toBe(notifications);
  });

  test('pin (an MR without ON_DEMAND): resident from registration on, zero faults', async () => {
    const { client, server } = createPlayers({ access: PINNED_ACCESS, size: PAGES * P });
    expect(server.mr.policy).toBe('pin');
    expect(server.mr.pinned).toBe(true);
    expect(server.region.residentPages()).toBe(PAGES);
    const { wc, lib } = await write64(client, server);
    expect(wc.odp!.faults).toEqual({ source: 0, destination: 0 });
    expect(lib.destination).toBe(0);
  });

  test("policy 'pin' on an ODP registration pins the range too: zero faults", async () => {
    const { client, server } = createPlayers({ policy: 'pin', size: PAGES * P });
    expect(server.mr.policy).toBe('pin');
    expect(server.region.residentPages()).toBe(PAGES);
    const { wc } = await write64(client, server);
    expect(wc.odp!.faults).toEqual({ source: 0, destination: 0 });
  });

  test('touch-ahead with a cap of 16 pages: 4 faults', async () => {
    const { client, server } = createPlayers({ size: PAGES * P });
    server.mr.setPolicy('touch-ahead', { cap: 16 * P });
    const { wc } = await write64(client, server);
    expect(wc.odp!.faults.destination).toBe(4);
  });

  test('the order touch > prefetch > touch-ahead > prefault = pin = 0 holds in modelled time too', async () => {
    const us: Record<string, number> = {};
    for (const policy of ['touch', 'prefetch', 'touch-ahead', 'prefault'] as const) {
      const { client, server } = createPlayers({ policy, size: PAGES * P });
      us[policy] = (await write64(client, server)).wc.odp!.modelUs;
      closeAll();
    }
    expect(us['touch']!).toBeGreaterThan(us['prefetch']!);
    expect(us['prefetch']!).toBeGreaterThan(us['touch-ahead']!);
    expect(us['touch-ahead']!).toBeGreaterThan(us['prefault']!);
  });
});

describe('changing the policy at run time (mr.setPolicy)', () => {
  test('touch → touch-ahead → prefault → touch on one MR: each next transfer follows the new policy', async () => {
    const { client, server } = createPlayers({ policy: 'touch', size: PAGES * P });
    expect((await write64(client, server, 1)).wc.odp!.faults.destination).toBe(64);
    server.mr.setPolicy('touch-ahead');
    expect(server.mr.policy).toBe('touch-ahead');
    expect((await write64(client, server, 2)).wc.odp!.faults.destination).toBe(1);
    server.mr.setPolicy('prefault');
    expect((await write64(client, server, 3)).wc.odp!.faults.destination).toBe(0);
    server.mr.setPolicy('touch');
    expect((await write64(client, server, 4)).wc.odp!.faults.destination).toBe(64);
    // The registration's own stats add up: 64 + 1 + 0 + 64.
    expect(server.mr.registration!.stats.faults.destination).toBe(129);
  });

  test('switching to pin pins the range (zero faults, eviction refused); switching away unpins it', async () => {
    const { client, server } = createPlayers({ policy: 'touch', size: PAGES * P });
    server.mr.setPolicy('pin');
    expect(server.mr.pinned).toBe(true);
    expect(server.region.residentPages()).toBe(PAGES);
    expect(() => server.region.evict()).toThrow(expect.objectContaining({ code: 'EINVAL' }));
    expect((await write64(client, server, 1)).wc.odp!.faults.destination).toBe(0);
    server.mr.setPolicy('touch');
    expect(server.mr.pinned).toBe(false);
    expect((await write64(client, server, 2)).wc.odp!.faults.destination).toBe(64);
  });

  test('the source side follows its own MR policy', async () => {
    const { client, server } = createPlayers({ policy: 'touch', size: PAGES * P });
    server.region.populate();
    client.region.evict();
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, PAGES * P)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect((await pollOk(client.cq)).odp!.faults).toEqual({ source: 64, destination: 0 });
    client.mr.setPolicy('touch-ahead');
    client.region.evict();
    client.qp.postSend({
      wrId: 2,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, PAGES * P)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect((await pollOk(client.cq)).odp!.faults).toEqual({ source: 1, destination: 0 });
  });

  test('setPolicy refuses unknown policies, pinned MRs and implicit MRs', () => {
    const { client } = createPlayers();
    expect(thrown(() => client.mr.setPolicy('eager' as PolicyName)).code).toBe('ERR_INVALID_ARG_VALUE');
    expect(client.mr.policy).toBe('touch-ahead');
    const pinned = client.ctx.regMr(client.pd, client.region, 0, 4 * P, Access.LOCAL_WRITE);
    expect(thrown(() => pinned.setPolicy('touch'))).toBeInstanceOf(TypeError);
    const implicit = createPlayers({ implicit: true }).client.mr;
    expect(thrown(() => implicit.setPolicy('touch'))).toBeInstanceOf(TypeError);
  });
});
