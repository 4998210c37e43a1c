// What the device says of itself (ibv_query_device_ex, ibv_query_port, the GID table): the
// engine's own limits and ODP capabilities (those lib/verbs' queryDevice reports; the test
// compares them), a RoCEv2 port on the host's Ethernet, and GIDs that are the IPv4-mapped
// addresses of the host's interfaces, so `-g N` of a Debian program names this host.
import { networkInterfaces } from 'node:os';
import { readFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import * as abi from './abi.js';
import { ReplyWriter } from './messages.js';

/** The engine's limits (lib/verbs' DEVICE_LIMITS and per-QP caps: the same numbers). */
export const LIMITS = {
  maxQp: 1 << 16,
  maxQpWr: 1 << 16,
  maxSge: 16,
  maxCq: 1 << 16,
  maxCqe: 1 << 22,
  maxMr: 1 << 20,
  maxPd: 0xffff,
  maxSrq: 1 << 16,
  maxSrqWr: 1 << 16,
  maxAh: 1 << 16,
  maxInlineData: 256,
  maxRdAtomic: 16,
  /** The largest message (lib/verbs' MAX_MSG). */
  maxMsgSize: 2 ** 31,
  pageSize: 4096,
} as const;

// libibverbs' values (verbs.h).
const IBV_ODP_SUPPORT = 1;
const IBV_ODP_SUPPORT_IMPLICIT = 2;
const ODP_SEND = 1;
const ODP_RECV = 2;
const ODP_WRITE = 4;
const ODP_READ = 8;
const ODP_ATOMIC = 16;
const ODP_SRQ_RECV = 32;
const IBV_DEVICE_SYS_IMAGE_GUID = 1 << 11;
const IBV_DEVICE_RC_RNR_NAK_GEN = 1 << 12;
const IBV_DEVICE_XRC = 1 << 20;
const IBV_ATOMIC_HCA = 1;
const IBV_PORT_ACTIVE = 4;
const IBV_MTU_4096 = 5;
const IBV_LINK_LAYER_ETHERNET = 2;
const IBV_PORT_IP_BASED_GIDS = 1 << 26;
const IB_UVERBS_GID_TYPE_ROCE_V2 = 2;
const IBV_NODE_CA = 1;
const IBV_TRANSPORT_IB = 0;
/** 4X DDR: 16 Gb/s of data, the cost model's link (linkBytesPerUs 2000). */
const WIDTH_4X = 2;
const SPEED_DDR = 2;

/** The ODP capabilities (struct ibv_odp_caps and xrc_odp_caps): what the engine does on ODP memory. */
export const ODP_CAPS = {
  generalCaps: IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT,
  rcOdpCaps: ODP_SEND | ODP_RECV | ODP_WRITE | ODP_READ | ODP_ATOMIC | ODP_SRQ_RECV,
  ucOdpCaps: 0,
  udOdpCaps: ODP_SEND | ODP_RECV | ODP_SRQ_RECV,
  xrcOdpCaps: ODP_SEND | ODP_RECV | ODP_WRITE | ODP_READ | ODP_ATOMIC | ODP_SRQ_RECV,
} as const;

/** One entry of the GID table: a RoCEv2 GID and the interface it belongs to. */
export interface Gid {
  raw: Uint8Array;
  text: string;
  ifname: string;
  ifindex: number;
}

function ifindexOf(name: string): number {
  try {
    return Number.parseInt(readFileSync(`/sys/class/net/${name}/ifindex`, 'utf8'), 10) || 0;
  } catch {
    return 0;
  }
}

function ipv4Mapped(address: string): Uint8Array {
  const raw = new Uint8Array(16);
  raw[10] = 0xff;
  raw[11] = 0xff;
  address.split('.').forEach((b, i) => (raw[12 + i] = Number(b)));
  return raw;
}

function ipv6Raw(address: string): Uint8Array {
  const [head = '', tail = ''] = address.split('%')[0]!.split('::');
  const groups = (s: string): number[] => (s ? s.split(':').map((g) => Number.parseInt(g, 16)) : []);
  const h = groups(head);
  const t = groups(tail);
  const all = [...h, ...new Array<number>(8 - h.length - t.length).fill(0), ...t];
  const raw = new Uint8Array(16);
  all.forEach((g, i) => {
    raw[2 * i] = g >> 8;
    raw[2 * i + 1] = g & 0xff;
  });
  return raw;
}

/**
 * The host's GID table: the IPv4-mapped address of every IPv4 address (interfaces with a link
 * first, loopback last), then the IPv6 addresses, as rxe's RoCEv2 entries.
 */
export function hostGids(): Gid[] {
  const ifs = Object.entries(networkInterfaces());
  const ordered = [...ifs.filter(([, a]) => !a?.some((x) => x.internal)), ...ifs.filter(([, a]) => a?.some((x) => x.internal))];
  const v4: Gid[] = [];
  const v6: Gid[] = [];
  for (const [name, addrs] of ordered)
    for (const a of addrs ?? []) {
      const ifindex = ifindexOf(name);
      if (a.family === 'IPv4') v4.push({ raw: ipv4Mapped(a.address), text: `::ffff:${a.address}`, ifname: name, ifindex });
      else v6.push({ raw: ipv6Raw(a.address), text: a.address.split('%')[0]!, ifname: name, ifindex });
    }
  return [...v4, ...v6];
}

/** The node GUID: EUI-64 of the first Ethernet interface's MAC (as rxe makes it), else from the host name. */
export function nodeGuid(): bigint {
  for (const addrs of Object.values(networkInterfaces()))
    for (const a of addrs ?? [])
      if (!a.internal && a.mac && a.mac !== '00:00:00:00:00:00') {
        const m = a.mac.split(':').map((x) => Number.parseInt(x, 16));
        const eui = [m[0]! ^ 2, m[1]!, m[2]!, 0xff, 0xfe, m[3]!, m[4]!, m[5]!];
        return eui.reduce((acc, b) => (acc << 8n) | BigInt(b), 0n);
      }
  return createHash('sha256')
    .update(`pagefault-rdma:${process.env['HOSTNAME'] ?? ''}`)
    .digest()
    .readBigUInt64BE(0);
}

/** The package version as uverbs' fw_ver: major << 32 | minor << 16 | patch. */
export function firmwareVersion(version: string): bigint {
  const [major = 0, minor = 0, patch = 0] = version.split('.').map((x) => Number.parseInt(x, 10) || 0);
  return (BigInt(major) << 32n) | (BigInt(minor) << 16n) | BigInt(patch);
}

/** What QUERY_INFO answers (struct pfr_device_info). */
export function deviceInfo(name: string, guid: bigint, flags: number, numCompVectors: number): Uint8Array {
  const w = new ReplyWriter(abi.deviceInfo);
  w.bytesAt('name', new TextEncoder().encode(name).subarray(0, abi.DEVICE_NAME_MAX - 1));
  return w
    .be64('node_guid', guid)
    .u32s({ device_pid: process.pid, flags, node_type: IBV_NODE_CA, transport_type: IBV_TRANSPORT_IB, num_comp_vectors: numCompVectors }).bytes;
}

/** What QUERY_DEVICE answers (struct ib_uverbs_ex_query_device_resp). */
export function queryDevice(guid: bigint, fwVer: bigint): Uint8Array {
  const w = new ReplyWriter(abi.exQueryDeviceResp);
  const L = LIMITS;
  w.u64('base.fw_ver', fwVer).be64('base.node_guid', guid).be64('base.sys_image_guid', guid);
  w.u64('base.max_mr_size', 0xffffffffffffffffn).u64('base.page_size_cap', BigInt(L.pageSize));
  w.u32s({
    'base.vendor_id': 0,
    'base.vendor_part_id': 0,
    'base.hw_ver': 0,
    'base.max_qp': L.maxQp,
    'base.max_qp_wr': L.maxQpWr,
    'base.device_cap_flags': IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_XRC,
    'base.max_sge': L.maxSge,
    'base.max_sge_rd': L.maxSge,
    'base.max_cq': L.maxCq,
    'base.max_cqe': L.maxCqe,
    'base.max_mr': L.maxMr,
    'base.max_pd': L.maxPd,
    'base.max_qp_rd_atom': L.maxRdAtomic,
    'base.max_res_rd_atom': L.maxRdAtomic * L.maxQp,
    'base.max_qp_init_rd_atom': L.maxRdAtomic,
    'base.atomic_cap': IBV_ATOMIC_HCA,
    'base.max_ah': L.maxAh,
    'base.max_srq': L.maxSrq,
    'base.max_srq_wr': L.maxSrqWr,
    'base.max_srq_sge': L.maxSge,
  });
  w.u16('base.max_pkeys', 1).u8('base.local_ca_ack_delay', 15).u8('base.phys_port_cnt', 1);
  w.u32('response_length', abi.exQueryDeviceResp.size);
  w.u64('odp_caps.general_caps', BigInt(ODP_CAPS.generalCaps));
  w.u32s({
    'odp_caps.per_transport_caps.rc_odp_caps': ODP_CAPS.rcOdpCaps,
    'odp_caps.per_transport_caps.uc_odp_caps': ODP_CAPS.ucOdpCaps,
    'odp_caps.per_transport_caps.ud_odp_caps': ODP_CAPS.udOdpCaps,
    xrc_odp_caps: ODP_CAPS.xrcOdpCaps,
  });
  return w.bytes;
}

/** What QUERY_PORT answers (struct ib_uverbs_query_port_resp) for port 1. */
export function queryPort(gidCount: number): Uint8Array {
  const w = new ReplyWriter(abi.queryPortResp);
  w.u32s({ port_cap_flags: IBV_PORT_IP_BASED_GIDS, max_msg_sz: LIMITS.maxMsgSize, gid_tbl_len: gidCount });
  w.u16('pkey_tbl_len', 1);
  w.u8('state', IBV_PORT_ACTIVE).u8('max_mtu', IBV_MTU_4096).u8('active_mtu', IBV_MTU_4096).u8('max_vl_num', 1);
  w.u8('active_width', WIDTH_4X).u8('active_speed', SPEED_DDR).u8('phys_state', 5).u8('link_layer', IBV_LINK_LAYER_ETHERNET);
  return w.bytes;
}

/** What QUERY_GID answers (struct ib_uverbs_gid_entry). */
export function gidEntry(gid: Gid, index: number): Uint8Array {
  const w = new ReplyWriter(abi.gidEntry);
  w.bytesAt('gid', gid.raw);
  return w.u32s({ gid_index: index, port_num: 1, gid_type: IB_UVERBS_GID_TYPE_ROCE_V2, netdev_ifindex: gid.ifindex }).bytes;
}
