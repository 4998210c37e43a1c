// One program's context on the device: what its connection's requests do (docs/device-abi.md
// §4), one small handler per op, each checking its body's fields, handles and ranges before
// it changes anything. Its objects live in the context's own table and are all released when
// the connection closes (the program ended or closed the device).
import { closeSync, fstatSync } from 'node:fs';
import { constants as fsConstants } from 'node:fs';
import * as abi from './abi.js';
import { DeviceState, NO_HANDLE, Op, Refusal } from './abi.js';
import { gidEntry, LIMITS, queryDevice, queryPort, type Gid } from './attributes.js';
import { Body, refuse, ReplyWriter, type Request } from './messages.js';
import { ObjectTable, type Cq, type DeviceObject, type Mr, type Qp, type QpAttrs, type SharedXrcd } from './objects.js';
import { MtuType, QpState, QpType } from './ib.js';
import { QpAttr, transitionError } from './qp-state.js';
import { cqGeometry, recvGeometry, ringBytes, RingMemory, sendGeometry, type RingGeometry } from './rings.js';
import { ProgramMemory, type FaultCounters } from './program-memory.js';
import { ContextDataPath, type DeviceEngine } from './data-path.js';
import type { PeerCred } from './seqpacket.js';

/** What every context shares: the device's identity, tables and limits. */
export interface DeviceServices {
  readonly name: string;
  readonly guid: bigint;
  readonly fwVer: bigint;
  readonly gids: readonly Gid[];
  /** enum pfr_info_flags of this device (PFR_INFO_DATA_PATH once it consumes the rings). */
  readonly infoFlags: number;
  /** A memory key (lkey and rkey), unique on the device. */
  newKey(): number;
  /** A QP number, unique on the device (24 bits, above the reserved 0 and 1). */
  newQpNum(): number;
  /** An SRQ number, unique on the device. */
  newSrqNum(): number;
  /** Objects of each kind on the device, against its limits. */
  readonly counts: Record<'mr' | 'qp' | 'cq' | 'srq' | 'pd' | 'ah', number>;
  /** The fault protocol's counters, shared by every context. */
  readonly faults: FaultCounters;
  /** XRC domains named by files, by inode: shared by every context that opens one. */
  readonly xrcds: Map<string, SharedXrcd>;
  /** The engine that consumes the rings (the data path), if the device runs one. */
  readonly engine: DeviceEngine | undefined;
}

/**
 * What a handler answers: a reply body and the descriptors that go with it, and which of the
 * request's descriptors it keeps (the device closes the others; a handler keeps descriptors
 * only once nothing can fail any more).
 */
export interface Reply {
  body?: Uint8Array;
  fds?: number[];
  kept?: number[];
}

const ACCESS_KNOWN = 0xff;
const ACCESS_OPTIONAL = 0x3ff00000;
const ACCESS = { LOCAL_WRITE: 1, REMOTE_WRITE: 2, REMOTE_READ: 4, REMOTE_ATOMIC: 8, MW_BIND: 16, ZERO_BASED: 32, ON_DEMAND: 64 } as const;
const SIZE_MAX = 0xffffffffffffffffn;
/** Bytes of ring memory one context may hold (memfds are sparse: this bounds what a program may ask for). */
const RING_BYTES_PER_CONTEXT = 1 << 30;

function range(name: string, v: number, lo: number, hi: number): number {
  if (v < lo || v > hi) refuse(Refusal.BODY, 'EINVAL', `${name} ${v} is outside ${lo}..${hi}`);
  return v;
}

function under(kind: keyof DeviceServices['counts'], limit: number, dev: DeviceServices): void {
  if (dev.counts[kind] >= limit) refuse(Refusal.RESOURCE, 'ENOMEM', `the device holds at most ${limit} ${kind}s`);
}

/** A connection's context: its objects, its event pipe, doorbell and fault socket, its program's memory. */
export class ProgramContext {
  readonly handle: number;
  readonly peer: PeerCred;
  readonly objects = new ObjectTable();
  readonly memory: ProgramMemory;
  readonly #dev: DeviceServices;
  readonly #asyncFd: number;
  readonly #doorbellFd: number;
  readonly #doorbell: RingMemory;
  /** The context's data path on the device's engine (none without an engine). */
  readonly dataPath: ContextDataPath | undefined;
  #ringBytes = 0;
  #released = false;

  constructor(handle: number, peer: PeerCred, dev: DeviceServices, req: Request) {
    const b = req.body;
    if (b.u32('provider_abi') !== abi.ABI_VERSION)
      refuse(Refusal.BODY, 'EINVAL', `provider ABI ${b.u32('provider_abi')}; the device speaks ${abi.ABI_VERSION}`);
    b.zero('flags', 'reserved');
    this.handle = handle;
    this.peer = peer;
    this.#dev = dev;
    const [asyncFd, doorbellFd, faultFd] = req.fds as [number, number, number];
    this.#doorbell = new RingMemory(abi.DOORBELL_PAGE_SIZE, [], handle);
    // Nothing fails past this point: the descriptors are the context's.
    this.#asyncFd = asyncFd;
    this.#doorbellFd = doorbellFd;
    this.memory = new ProgramMemory(peer.pid, faultFd, dev.faults);
    const v = new DataView(this.#doorbell.mapping.buffer);
    const o = abi.doorbellPage.offsets(['magic', 'abi_version', 'context_handle', 'device_state', 'device_sleeping'] as const);
    v.setUint32(o.magic, abi.DOORBELL_MAGIC, true);
    v.setUint16(o.abi_version, abi.ABI_VERSION, true);
    v.setUint32(o.context_handle, handle, true);
    v.setUint32(o.device_state, DeviceState.RUNNING, true);
    v.setUint32(o.device_sleeping, 1, true);
    this.dataPath = dev.engine
      ? new ContextDataPath(dev.engine, handle, {
          memory: this.memory,
          asyncFd,
          doorbell: this.#doorbell.mapping,
          doorbellFd,
          ah: (h) => this.objects.all('ah').find((a) => a.handle === h),
        })
      : undefined;
  }

  /** GET_CONTEXT's reply (the context was made from its request). */
  contextReply(): Reply {
    const w = new ReplyWriter(abi.getContextResp).u32s({
      context_handle: this.handle,
      flags: this.#dev.infoFlags,
      num_comp_vectors: 1,
      device_pid: process.pid,
      doorbell_page_size: abi.DOORBELL_PAGE_SIZE,
    });
    return { body: w.bytes, fds: [this.#doorbell.fd], kept: [this.#asyncFd, this.#doorbellFd, this.memory.faultFd] };
  }

  /** Answer one request of this context's connection (refusals are thrown). */
  answer(req: Request): Reply {
    const h = this.#handlers[req.op];
    if (!h) refuse(Refusal.OP, 'EINVAL', `${Op[req.op]} is not a context op`);
    return h(req.body, req.fds);
  }

  readonly #handlers: Partial<Record<Op, (b: Body, fds: number[]) => Reply>> = {
    [Op.QUERY_DEVICE]: () => ({ body: queryDevice(this.#dev.guid, this.#dev.fwVer) }),
    [Op.QUERY_PORT]: (b) => {
      this.#port(b);
      return { body: queryPort(this.#dev.gids.length) };
    },
    [Op.QUERY_GID]: (b) => {
      this.#port(b);
      const i = b.u32('index');
      const gid = this.#dev.gids[i] ?? refuse(Refusal.BODY, 'EINVAL', `GID index ${i}: the table has ${this.#dev.gids.length}`);
      return { body: gidEntry(gid, i) };
    },
    [Op.QUERY_PKEY]: (b) => {
      this.#port(b);
      if (b.u32('index') !== 0) refuse(Refusal.BODY, 'EINVAL', 'the P_Key table has one entry');
      return { body: new ReplyWriter(abi.pkey).u16('pkey', 0xffff).bytes };
    },
    [Op.ALLOC_PD]: () => {
      under('pd', LIMITS.maxPd, this.#dev);
      const pd = this.objects.add({ kind: 'pd', handle: this.objects.nextHandle(), users: 0 });
      this.#dev.counts.pd++;
      this.dataPath?.pdCreated(pd);
      return { body: handleBody(pd.handle) };
    },
    [Op.DEALLOC_PD]: (b) => this.#free(this.objects.remove(b.u32('handle'), 'pd')),
    [Op.REG_MR]: (b) => this.#regMr(b),
    [Op.DEREG_MR]: (b) => this.#free(this.objects.remove(b.u32('handle'), 'mr')),
    [Op.ADVISE_MR]: (b) => this.#adviseMr(b),
    [Op.CREATE_COMP_CHANNEL]: (_b, fds) => {
      const ch = this.objects.add({ kind: 'channel', handle: this.objects.nextHandle(), users: 0, fd: fds[0]! });
      return { body: handleBody(ch.handle), kept: [fds[0]!] };
    },
    [Op.DESTROY_COMP_CHANNEL]: (b) => this.#free(this.objects.remove(b.u32('handle'), 'channel')),
    [Op.CREATE_CQ]: (b) => this.#createCq(b),
    [Op.DESTROY_CQ]: (b) => {
      this.#free(this.objects.remove(b.u32('handle'), 'cq'));
      return { body: new ReplyWriter(abi.destroyCqResp).bytes };
    },
    [Op.CREATE_QP]: (b) => this.#createQp(b),
    [Op.MODIFY_QP]: (b) => this.#modifyQp(b),
    [Op.QUERY_QP]: (b) => this.#queryQp(b),
    [Op.DESTROY_QP]: (b) => {
      this.#free(this.objects.remove(b.u32('handle'), 'qp'));
      return { body: new ReplyWriter(abi.destroyQpResp).bytes };
    },
    [Op.CREATE_SRQ]: (b) => this.#createSrq(b),
    [Op.MODIFY_SRQ]: (b) => this.#modifySrq(b),
    [Op.QUERY_SRQ]: (b) => {
      const s = this.objects.get(b.u32('handle'), 'srq');
      return { body: new ReplyWriter(abi.querySrqResp).u32s({ max_wr: s.maxWr, max_sge: s.maxSge, srq_limit: s.limit }).bytes };
    },
    [Op.DESTROY_SRQ]: (b) => {
      this.#free(this.objects.remove(b.u32('handle'), 'srq'));
      return { body: new ReplyWriter(abi.destroySrqResp).bytes };
    },
    [Op.OPEN_XRCD]: (b, fds) => this.#openXrcd(b, fds),
    [Op.CLOSE_XRCD]: (b) => this.#free(this.objects.remove(b.u32('handle'), 'xrcd')),
    [Op.CREATE_AH]: (b) => this.#createAh(b),
    [Op.DESTROY_AH]: (b) => this.#free(this.objects.remove(b.u32('handle'), 'ah')),
  };

  #port(b: Body): void {
    if (b.u32('port_num') !== 1) refuse(Refusal.BODY, 'EINVAL', `port ${b.u32('port_num')}: the device has port 1`);
  }

  #regMr(b: Body): Reply {
    b.zero('reserved');
    const pd = this.objects.get(b.u32('pd_handle'), 'pd');
    const start = b.u64('start');
    const length = b.u64('length');
    const access = b.u32('access') & ~ACCESS_OPTIONAL;
    const policy = range('policy', b.u32('policy'), abi.MrPolicy.DEFAULT, abi.MrPolicy.PREFETCH);
    if (access & ~ACCESS_KNOWN) refuse(Refusal.BODY, 'EINVAL', `unknown access bits 0x${(access & ~ACCESS_KNOWN).toString(16)}`);
    if (access & (ACCESS.MW_BIND | ACCESS.ZERO_BASED)) refuse(Refusal.BODY, 'EOPNOTSUPP', 'memory windows and zero-based MRs are not offered');
    if (access & (ACCESS.REMOTE_WRITE | ACCESS.REMOTE_ATOMIC) && !(access & ACCESS.LOCAL_WRITE))
      refuse(Refusal.BODY, 'EINVAL', 'REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE');
    const implicit = start === 0n && length === SIZE_MAX;
    if (implicit && !(access & ACCESS.ON_DEMAND)) refuse(Refusal.BODY, 'EINVAL', 'an implicit MR (addr 0, length SIZE_MAX) must be ON_DEMAND');
    if (!implicit) {
      if (length === 0n || start + length > 1n << 47n) refuse(Refusal.BODY, 'EINVAL', 'the MR must be 1 byte or more of user address space');
      if (b.u64('iova') !== start) refuse(Refusal.BODY, 'EOPNOTSUPP', 'iova must be the MR address (shared virtual addressing)');
    }
    under('mr', LIMITS.maxMr, this.#dev);
    const key = this.#dev.newKey();
    const remote = access & (ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ | ACCESS.REMOTE_ATOMIC);
    const mr: Mr = {
      kind: 'mr',
      handle: this.objects.nextHandle(),
      users: 0,
      pd,
      start,
      length,
      access,
      policy,
      lkey: key,
      rkey: remote ? key : 0,
      implicit,
    };
    this.dataPath?.mrCreated(mr);
    this.objects.add(mr);
    pd.users++;
    this.#dev.counts.mr++;
    return { body: new ReplyWriter(abi.regMrResp).u32s({ mr_handle: mr.handle, lkey: mr.lkey, rkey: mr.rkey }).bytes };
  }

  // The device checks each SGE against an ODP MR of this PD; the provider then makes the pages
  // resident in its own process (MADV_POPULATE_*), where they are.
  #adviseMr(b: Body): Reply {
    const pd = this.objects.get(b.u32('pd_handle'), 'pd');
    range('advice', b.u32('advice'), 0, 2);
    if (b.u32('flags') & ~1) refuse(Refusal.BODY, 'EINVAL', `unknown advise flags 0x${b.u32('flags').toString(16)}`);
    const n = b.u32('num_sge');
    const mrs = this.objects.all('mr');
    for (let i = 0; i < n; i++) {
      const o = abi.adviseMr.size + i * abi.uverbsSge.size;
      const addr = b.view.getBigUint64(o, true);
      const len = BigInt(b.view.getUint32(o + 8, true));
      const lkey = b.view.getUint32(o + 12, true);
      const mr = mrs.find((m) => m.lkey === lkey);
      if (!mr || mr.pd !== pd) refuse(Refusal.HANDLE, 'EINVAL', `lkey 0x${lkey.toString(16)} is not an MR of this PD`);
      if (!(mr.access & ACCESS.ON_DEMAND)) refuse(Refusal.BODY, 'EOPNOTSUPP', 'advise_mr takes ODP MRs');
      if (!mr.implicit && (addr < mr.start || addr + len > mr.start + mr.length)) refuse(Refusal.BODY, 'EFAULT', `SGE ${i} is outside its MR`);
    }
    return {};
  }

  #addRing(bytes: number): void {
    if (this.#ringBytes + bytes > RING_BYTES_PER_CONTEXT)
      refuse(Refusal.RESOURCE, 'ENOMEM', `a context holds at most ${RING_BYTES_PER_CONTEXT} bytes of rings`);
    this.#ringBytes += bytes;
  }

  #createCq(b: Body): Reply {
    b.zero('flags');
    const cqe = range('cqe', b.u32('cqe'), 1, LIMITS.maxCqe);
    const channel = this.objects.optional(b.u32('channel_handle'), 'channel', NO_HANDLE);
    range('comp_vector', b.u32('comp_vector'), 0, 0);
    under('cq', LIMITS.maxCq, this.#dev);
    const g = cqGeometry(cqe);
    const bytes = ringBytes(g.numElems, g.log2);
    this.#addRing(bytes);
    const handle = this.objects.nextHandle();
    const ring = new RingMemory(bytes, [{ kind: abi.QueueKind.CQ, offset: 0, numElems: g.numElems, log2ElemSize: g.log2 }], handle);
    const cq = this.objects.add({ kind: 'cq', handle, users: 0, capacity: g.numElems, channel, ring });
    if (channel) channel.users++;
    this.#dev.counts.cq++;
    this.dataPath?.cqCreated(cq);
    return {
      body: new ReplyWriter(abi.createCqResp).u32s({ cq_handle: cq.handle, cqe: cq.capacity }).u64('ring_size', BigInt(bytes)).bytes,
      fds: [ring.fd],
    };
  }

  // CREATE_QP's objects and counts, checked by what the QP's type needs: an XRC_RECV QP has a
  // domain and no queues; an XRC_SEND QP, a send queue only; RC and UD, both (or an SRQ).
  #qpRequest(b: Body) {
    const type = b.u32('qp_type') as QpType;
    if (!(type in QpType) || typeof QpType[type] !== 'string')
      refuse(Refusal.BODY, 'EOPNOTSUPP', `QP type ${type}: the device has RC, UD, XRC_SEND and XRC_RECV`);
    const xrcRecv = type === QpType.XRC_RECV;
    const xrc = xrcRecv || type === QpType.XRC_SEND;
    const o = this.objects;
    const srq = xrc ? undefined : o.optional(b.u32('srq_handle'), 'srq', NO_HANDLE);
    return {
      type,
      pd: xrcRecv ? undefined : o.get(b.u32('pd_handle'), 'pd'),
      sendCq: xrcRecv ? undefined : o.get(b.u32('send_cq_handle'), 'cq'),
      recvCq: xrc ? undefined : o.get(b.u32('recv_cq_handle'), 'cq'),
      srq,
      xrcd: xrcRecv ? o.get(b.u32('xrcd_handle'), 'xrcd') : undefined,
      sends: xrcRecv ? 0 : range('max_send_wr', b.u32('max_send_wr'), 1, LIMITS.maxQpWr),
      recvs: range('max_recv_wr', b.u32('max_recv_wr'), xrc || srq ? 0 : 1, xrc || srq ? 0 : LIMITS.maxQpWr),
      sendSge: range('max_send_sge', b.u32('max_send_sge'), 0, LIMITS.maxSge),
      recvSge: range('max_recv_sge', b.u32('max_recv_sge'), 0, LIMITS.maxSge),
      inline: range('max_inline_data', b.u32('max_inline_data'), 0, LIMITS.maxInlineData),
      sigAll: range('sq_sig_all', b.u32('sq_sig_all'), 0, 1) === 1,
    };
  }

  #createQp(b: Body): Reply {
    const q = this.#qpRequest(b);
    under('qp', LIMITS.maxQp, this.#dev);
    const handle = this.objects.nextHandle();
    const s = sendGeometry(q.sends, q.sendSge, q.inline);
    const r = recvGeometry(q.recvs, q.recvSge);
    const { rings, bytes } = qpRings(q.sends ? s : undefined, q.recvs ? r : undefined);
    this.#addRing(bytes);
    const ring = bytes ? new RingMemory(bytes, rings, handle) : undefined;
    const caps = {
      maxSendWr: q.sends ? s.numElems : 0,
      maxRecvWr: q.recvs ? r.numElems : 0,
      maxSendSge: q.sends ? s.maxSge : 0,
      maxRecvSge: q.recvs ? r.maxSge : 0,
      maxInlineData: q.sends ? s.maxInline : 0,
    };
    const { type, pd, sendCq, recvCq, srq, xrcd } = q;
    const qpNum = this.#dev.newQpNum();
    const qp: Qp = {
      kind: 'qp',
      handle,
      users: 0,
      type,
      qpNum,
      pd,
      sendCq,
      recvCq,
      srq,
      xrcd,
      caps,
      sqSigAll: q.sigAll,
      state: QpState.RESET,
      attrs: defaultAttrs(),
      ring,
    };
    this.objects.add(qp);
    for (const used of [pd, sendCq, recvCq, srq, xrcd]) if (used) used.users++;
    this.#dev.counts.qp++;
    this.dataPath?.qpCreated(qp);
    const w = new ReplyWriter(abi.createQpResp).u32s({
      qp_handle: handle,
      qp_num: qp.qpNum,
      max_send_wr: caps.maxSendWr,
      max_recv_wr: caps.maxRecvWr,
      max_send_sge: caps.maxSendSge,
      max_recv_sge: caps.maxRecvSge,
      max_inline_data: caps.maxInlineData,
    });
    w.u64('sq_offset', q.sends ? 0n : SIZE_MAX)
      .u64('rq_offset', q.recvs ? BigInt(rings[rings.length - 1]!.offset) : SIZE_MAX)
      .u64('ring_size', BigInt(bytes));
    return { body: w.bytes, fds: ring ? [ring.fd] : [] };
  }

  #modifyQp(b: Body): Reply {
    b.zero('reserved', 'dest.reserved', 'alt_dest.reserved');
    const qp = this.objects.get(b.u32('qp_handle'), 'qp');
    const mask = b.u32('attr_mask');
    if (mask & (QpAttr.ALT_PATH | QpAttr.PATH_MIG_STATE | QpAttr.RATE_LIMIT))
      refuse(Refusal.BODY, 'EOPNOTSUPP', 'alternate paths and rate limits are not offered');
    if (mask & ~0x1fffff) refuse(Refusal.BODY, 'EINVAL', `unknown attr_mask bits 0x${(mask & ~0x1fffff).toString(16)}`);
    const to = mask & QpAttr.STATE ? (range('qp_state', b.u8('qp_state'), QpState.RESET, QpState.ERR) as QpState) : qp.state;
    if (mask & QpAttr.CUR_STATE && b.u8('cur_qp_state') !== qp.state)
      refuse(Refusal.BODY, 'EINVAL', `cur_qp_state ${b.u8('cur_qp_state')}: the QP is ${QpState[qp.state]}`);
    const why = transitionError(qp.type, qp.state, to, mask);
    if (why) refuse(Refusal.BODY, 'EINVAL', why);
    const next = applyAttrs(qp.attrs, b, mask, this.#dev.gids.length);
    const from = qp.state;
    qp.attrs = next;
    qp.state = to;
    this.dataPath?.qpModified(qp, from);
    return {};
  }

  #queryQp(b: Body): Reply {
    const qp = this.objects.get(b.u32('qp_handle'), 'qp');
    const a = qp.attrs;
    const w = new ReplyWriter(abi.queryQpResp);
    w.bytesAt('dest', a.dest);
    w.u32s({
      max_send_wr: qp.caps.maxSendWr,
      max_recv_wr: qp.caps.maxRecvWr,
      max_send_sge: qp.caps.maxSendSge,
      max_recv_sge: qp.caps.maxRecvSge,
      max_inline_data: qp.caps.maxInlineData,
      qkey: a.qkey,
      rq_psn: a.rqPsn,
      sq_psn: a.sqPsn,
      dest_qp_num: a.destQpNum,
      qp_access_flags: a.accessFlags,
    });
    w.u16('pkey_index', a.pkeyIndex).u8('qp_state', qp.state).u8('cur_qp_state', qp.state).u8('path_mtu', a.pathMtu);
    w.u8('max_rd_atomic', a.maxRdAtomic).u8('max_dest_rd_atomic', a.maxDestRdAtomic).u8('min_rnr_timer', a.minRnrTimer);
    w.u8('port_num', a.portNum)
      .u8('timeout', a.timeout)
      .u8('retry_cnt', a.retryCnt)
      .u8('rnr_retry', a.rnrRetry)
      .u8('sq_sig_all', qp.sqSigAll ? 1 : 0);
    return { body: w.bytes };
  }

  #createSrq(b: Body): Reply {
    b.zero('reserved');
    const pd = this.objects.get(b.u32('pd_handle'), 'pd');
    const type = range('srq_type', b.u32('srq_type'), 0, 1);
    const xrcd = type === 1 ? this.objects.get(b.u32('xrcd_handle'), 'xrcd') : undefined;
    const cq = type === 1 ? this.objects.get(b.u32('cq_handle'), 'cq') : undefined;
    const maxWr = range('max_wr', b.u32('max_wr'), 1, LIMITS.maxSrqWr);
    const g = recvGeometry(maxWr, range('max_sge', b.u32('max_sge'), 1, LIMITS.maxSge));
    const limit = range('srq_limit', b.u32('srq_limit'), 0, g.numElems);
    under('srq', LIMITS.maxSrq, this.#dev);
    const bytes = ringBytes(g.numElems, g.log2);
    this.#addRing(bytes);
    const handle = this.objects.nextHandle();
    const ring = new RingMemory(bytes, [{ kind: abi.QueueKind.SRQ, offset: 0, numElems: g.numElems, log2ElemSize: g.log2 }], handle);
    const srq = this.objects.add({
      kind: 'srq',
      handle,
      users: 0,
      pd,
      srqNum: this.#dev.newSrqNum(),
      xrcd,
      cq,
      maxWr: g.numElems,
      maxSge: g.maxSge,
      limit,
      ring,
    });
    for (const used of [pd, xrcd, cq]) if (used) used.users++;
    this.#dev.counts.srq++;
    this.dataPath?.srqCreated(srq);
    const w = new ReplyWriter(abi.createSrqResp).u32s({ srq_handle: handle, srq_num: srq.srqNum, max_wr: srq.maxWr, max_sge: srq.maxSge });
    return { body: w.u64('ring_size', BigInt(bytes)).bytes, fds: [ring.fd] };
  }

  #modifySrq(b: Body): Reply {
    const srq = this.objects.get(b.u32('srq_handle'), 'srq');
    const mask = b.u32('attr_mask');
    if (mask & 1) refuse(Refusal.BODY, 'EOPNOTSUPP', 'an SRQ is not resized');
    if (mask & ~3) refuse(Refusal.BODY, 'EINVAL', `unknown srq attr_mask bits 0x${(mask & ~3).toString(16)}`);
    if (mask & 2) srq.limit = range('srq_limit', b.u32('srq_limit'), 0, srq.maxWr);
    return {};
  }

  // A domain of its own, or (PFR_XRCD_FILE) the device's domain of the file's inode.
  #openXrcd(b: Body, fds: number[]): Reply {
    const flags = b.u32('flags');
    const oflags = b.u32('oflags');
    if (flags & ~abi.XRCD_FILE) refuse(Refusal.BODY, 'EINVAL', `unknown XRCD flags 0x${flags.toString(16)}`);
    if (oflags & ~(fsConstants.O_CREAT | fsConstants.O_EXCL) || (!(flags & abi.XRCD_FILE) && oflags))
      refuse(Refusal.BODY, 'EINVAL', `XRCD oflags 0x${oflags.toString(16)}: O_CREAT and O_EXCL, with a file`);
    let shared: SharedXrcd | undefined;
    if (flags & abi.XRCD_FILE) {
      const st = fstatSync(fds[0]!);
      const key = `${st.dev}:${st.ino}`;
      shared = this.#dev.xrcds.get(key);
      if (!shared && !(oflags & fsConstants.O_CREAT)) refuse(Refusal.BODY, 'ENOENT', 'no XRC domain of this file is open, and O_CREAT was not given');
      if (shared && oflags & fsConstants.O_CREAT && oflags & fsConstants.O_EXCL)
        refuse(Refusal.BODY, 'EEXIST', 'the XRC domain of this file is open (O_EXCL)');
      if (!shared) this.#dev.xrcds.set(key, (shared = { key, opens: 0 }));
      shared.opens++;
    }
    return { body: handleBody(this.objects.add({ kind: 'xrcd', handle: this.objects.nextHandle(), users: 0, shared }).handle) };
  }

  #createAh(b: Body): Reply {
    b.zero('reserved', 'attr.reserved', 'attr.grh.reserved');
    const pd = this.objects.get(b.u32('pd_handle'), 'pd');
    if (b.u8('attr.port_num') !== 1) refuse(Refusal.BODY, 'EINVAL', `AH port ${b.u8('attr.port_num')}: the device has port 1`);
    const global = range('attr.is_global', b.u8('attr.is_global'), 0, 1);
    if (global) range('attr.grh.sgid_index', b.u8('attr.grh.sgid_index'), 0, this.#dev.gids.length - 1);
    under('ah', LIMITS.maxAh, this.#dev);
    const ah = this.objects.add({
      kind: 'ah',
      handle: this.objects.nextHandle(),
      users: 0,
      pd,
      dgid: global ? b.bytes('attr.grh.dgid', 16).slice() : new Uint8Array(16),
    });
    pd.users++;
    this.#dev.counts.ah++;
    return { body: handleBody(ah.handle) };
  }

  // What an object held is let go, and what it used has one user less.
  #free(o: DeviceObject): Reply {
    switch (o.kind) {
      case 'pd':
        this.dataPath?.pdFreed(o);
        this.#dev.counts.pd--;
        break;
      case 'mr':
        this.dataPath?.mrFreed(o);
        o.pd.users--;
        this.#dev.counts.mr--;
        this.memory.forget(o.handle);
        break;
      case 'channel':
        closeSync(o.fd);
        break;
      case 'cq':
        this.dataPath?.cqFreed(o);
        this.#release(o.ring.size, o.ring);
        if (o.channel) o.channel.users--;
        this.#dev.counts.cq--;
        break;
      case 'srq':
        this.dataPath?.srqFreed(o);
        this.#release(o.ring.size, o.ring);
        for (const used of [o.pd, o.xrcd, o.cq]) if (used) used.users--;
        this.#dev.counts.srq--;
        break;
      case 'qp':
        this.dataPath?.qpFreed(o);
        if (o.ring) this.#release(o.ring.size, o.ring);
        for (const used of [o.pd, o.sendCq, o.recvCq, o.srq, o.xrcd]) if (used) used.users--;
        this.#dev.counts.qp--;
        break;
      case 'ah':
        o.pd.users--;
        this.#dev.counts.ah--;
        break;
      case 'xrcd':
        if (o.shared && --o.shared.opens === 0) this.#dev.xrcds.delete(o.shared.key);
        break;
    }
    return {};
  }

  #release(bytes: number, ring: RingMemory): void {
    ring.close();
    this.#ringBytes -= bytes;
  }

  /** Everything the program left: freed, newest first. Returns how many objects. Idempotent. */
  release(): number {
    if (this.#released) return 0;
    this.#released = true;
    // The engine first: nothing more of the program's QPs runs, nothing lands in its memory.
    this.dataPath?.close();
    const all = this.objects.drain();
    for (const o of all) this.#free(o);
    this.memory.close();
    this.#doorbell.close();
    for (const fd of [this.#asyncFd, this.#doorbellFd]) closeSync(fd);
    return all.length;
  }

  /** The CQs of this context (for the engine's completer and the tests). */
  cqs(): Cq[] {
    return this.objects.all('cq');
  }
}

// A QP's send ring at 0 and its receive ring after it, each only if it has one.
function qpRings(
  sq: { numElems: number; log2: number } | undefined,
  rq: { numElems: number; log2: number } | undefined,
): { rings: RingGeometry[]; bytes: number } {
  const rings: RingGeometry[] = [];
  let bytes = 0;
  for (const [kind, g] of [
    [abi.QueueKind.SQ, sq],
    [abi.QueueKind.RQ, rq],
  ] as const) {
    if (!g) continue;
    rings.push({ kind, offset: bytes, numElems: g.numElems, log2ElemSize: g.log2 });
    bytes += ringBytes(g.numElems, g.log2);
  }
  return { rings, bytes };
}

function handleBody(handle: number): Uint8Array {
  return new ReplyWriter(abi.handleBody).u32('handle', handle).bytes;
}

function defaultAttrs(): QpAttrs {
  return {
    qkey: 0,
    rqPsn: 0,
    sqPsn: 0,
    destQpNum: 0,
    accessFlags: 0,
    pkeyIndex: 0,
    pathMtu: MtuType.MTU_4096,
    maxRdAtomic: 1,
    maxDestRdAtomic: 1,
    minRnrTimer: 12,
    portNum: 1,
    timeout: 14,
    retryCnt: 7,
    rnrRetry: 7,
    dest: new Uint8Array(abi.qpDest.size),
  };
}

// MODIFY_QP's fields that attr_mask names, each checked against its range.
function applyAttrs(prev: QpAttrs, b: Body, mask: number, gidCount: number): QpAttrs {
  const a = { ...prev };
  const M = QpAttr;
  const psn = (name: string): number => range(name, b.u32(name), 0, 0xffffff);
  if (mask & M.QKEY) a.qkey = b.u32('qkey');
  if (mask & M.RQ_PSN) a.rqPsn = psn('rq_psn');
  if (mask & M.SQ_PSN) a.sqPsn = psn('sq_psn');
  if (mask & M.DEST_QPN) a.destQpNum = range('dest_qp_num', b.u32('dest_qp_num'), 0, 0xffffff);
  if (mask & M.ACCESS_FLAGS) {
    a.accessFlags = b.u32('qp_access_flags');
    if (a.accessFlags & ~0xf)
      refuse(Refusal.BODY, 'EINVAL', `qp_access_flags 0x${a.accessFlags.toString(16)}: LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC`);
  }
  if (mask & M.PKEY_INDEX) a.pkeyIndex = range('pkey_index', b.u16('pkey_index'), 0, 0);
  if (mask & M.PORT) a.portNum = range('port_num', b.u8('port_num'), 1, 1);
  if (mask & M.PATH_MTU) a.pathMtu = range('path_mtu', b.u8('path_mtu'), MtuType.MTU_256, MtuType.MTU_4096);
  if (mask & M.MAX_QP_RD_ATOMIC) a.maxRdAtomic = range('max_rd_atomic', b.u8('max_rd_atomic'), 0, LIMITS.maxRdAtomic);
  if (mask & M.MAX_DEST_RD_ATOMIC) a.maxDestRdAtomic = range('max_dest_rd_atomic', b.u8('max_dest_rd_atomic'), 0, LIMITS.maxRdAtomic);
  if (mask & M.MIN_RNR_TIMER) a.minRnrTimer = range('min_rnr_timer', b.u8('min_rnr_timer'), 0, 31);
  if (mask & M.TIMEOUT) a.timeout = range('timeout', b.u8('timeout'), 0, 31);
  if (mask & M.RETRY_CNT) a.retryCnt = range('retry_cnt', b.u8('retry_cnt'), 0, 7);
  if (mask & M.RNR_RETRY) a.rnrRetry = range('rnr_retry', b.u8('rnr_retry'), 0, 7);
  if (mask & M.AV) {
    range('dest.port_num', b.u8('dest.port_num'), 1, 1);
    if (range('dest.is_global', b.u8('dest.is_global'), 0, 1)) range('dest.sgid_index', b.u8('dest.sgid_index'), 0, gidCount - 1);
    a.dest = b.bytes('dest', abi.qpDest.size).slice();
  }
  return a;
}
