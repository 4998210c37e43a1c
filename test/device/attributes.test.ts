// What the device says of itself is what the engine offers: its limits and ODP capabilities are
// lib/verbs' queryDevice's (the bits rdma-core 44's headers have: FLUSH and ATOMIC_WRITE have
// no ODP bit there), and its GIDs are the host's addresses, IPv4-mapped for RoCEv2.
import { networkInterfaces } from 'node:os';
import { expect, test } from 'vitest';
import { hostGids, LIMITS, ODP_CAPS } from '../../kernel-sim/device/attributes.js';
import { Cluster, SIZE_MAX } from '../../lib/index.js';
import { binding } from '../../native/index.js';

test("the device's limits and ODP caps are lib/verbs' queryDevice's", () => {
  const cluster = Cluster.create({ nodes: 1 });
  try {
    const a = cluster.openDevice(0).queryDevice();
    expect({ maxQp: LIMITS.maxQp, maxCqe: LIMITS.maxCqe, maxMr: LIMITS.maxMr, maxSge: LIMITS.maxSge, pageSize: LIMITS.pageSize }).toEqual({
      maxQp: a.maxQp,
      maxCqe: a.maxCqe,
      maxMr: a.maxMr,
      maxSge: a.maxSge,
      pageSize: a.pageSizeCap,
    });
    expect(a.maxMrSize).toBe(SIZE_MAX);
    const v44 = 0x3f; // SEND .. SRQ_RECV: the transport bits of rdma-core 44's enum ibv_odp_transport_cap_bits
    expect({
      general: ODP_CAPS.generalCaps,
      rc: ODP_CAPS.rcOdpCaps,
      uc: ODP_CAPS.ucOdpCaps,
      ud: ODP_CAPS.udOdpCaps,
    }).toEqual({ general: a.odpCaps.generalCaps, rc: a.odpCaps.rcOdpCaps & v44, uc: a.odpCaps.ucOdpCaps, ud: a.odpCaps.udOdpCaps & v44 });
    expect(ODP_CAPS.xrcOdpCaps).toBe(ODP_CAPS.rcOdpCaps);
  } finally {
    cluster.close();
  }
});

test('the page size is the machine page size', () => {
  expect(LIMITS.pageSize).toBe(binding.pageSize);
});

test("the GIDs are the host's addresses: IPv4-mapped first, interfaces with a link before loopback", () => {
  const gids = hostGids();
  const v4 = Object.values(networkInterfaces())
    .flatMap((a) => a ?? [])
    .filter((a) => a.family === 'IPv4');
  expect(
    gids
      .filter((g) => g.text.startsWith('::ffff:'))
      .map((g) => g.text.slice(7))
      .sort(),
  ).toEqual(v4.map((a) => a.address).sort());
  for (const g of gids.filter((x) => x.text.startsWith('::ffff:'))) {
    expect([...g.raw.subarray(0, 12)]).toEqual([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
    expect([...g.raw.subarray(12)].join('.')).toBe(g.text.slice(7));
  }
  const firstLoopback = gids.findIndex((g) => g.ifname === 'lo');
  if (firstLoopback >= 0)
    expect(
      gids
        .slice(0, firstLoopback)
        .filter((g) => g.text.startsWith('::ffff:'))
        .every((g) => g.ifname !== 'lo'),
    ).toBe(true);
});
