// The control protocol's framing and checks (docs/device-abi.md §4): a datagram from a
// program is untrusted, like a packet from the wire. parseRequest checks it in the documented
// order (framing, op, body size, descriptors) and throws a Refused that says why; the
// handlers check fields, handles and ranges with the same error. Replies are encoded here too.
import { constants } from 'node:os';
import { binding } from '../../native/index.js';
import {
  ABI_VERSION,
  adviseMr,
  CTL_MAGIC,
  CTL_MAX_FDS,
  CTL_REPLY,
  ctlHdr,
  getContext,
  Op,
  OP_MAX,
  Refusal,
  uverbsSge,
  ADVISE_MAX_SGE,
} from './abi.js';
import * as abi from './abi.js';
import type { Layout } from './layout.js';
import type { Datagram } from './seqpacket.js';

/** An errno name the device answers with. */
export type Errno = 'EINVAL' | 'ENOSYS' | 'EACCES' | 'ENOMEM' | 'EBUSY' | 'EPROTO' | 'EOPNOTSUPP' | 'EFAULT' | 'ENOENT' | 'EEXIST';

/** Why a message was refused: the counter it goes to, the errno the reply carries, a reason for the log. */
export class Refused extends Error {
  readonly reason: Refusal;
  readonly errno: Errno;
  /** The connection is closed after the reply: the peer does not speak the protocol. */
  readonly fatal: boolean;
  constructor(reason: Refusal, errno: Errno, message: string, fatal = false) {
    super(message);
    this.name = 'Refused';
    this.reason = reason;
    this.errno = errno;
    this.fatal = fatal;
  }
}

/** Throw a refusal (a check that failed). */
export function refuse(reason: Refusal, errno: Errno, message: string): never {
  throw new Refused(reason, errno, message);
}

/** The negative errno number of `name` (a reply's status). */
export function errnoStatus(name: Errno): number {
  return -(constants.errno as Record<string, number>)[name]!;
}

/** What a descriptor of a request must be. */
type FdKind = 'fifo' | 'eventfd' | 'seqpacket' | 'file';

interface OpSpec {
  /** Bytes of the body; ADVISE_MR's grows with its SGE count. */
  body: Layout | undefined;
  /** The descriptors, in order (OPEN_XRCD's depend on its flags). */
  fds: readonly FdKind[] | ((b: Body) => readonly FdKind[]);
  /** 'any': with or without a context; 'open': only before GET_CONTEXT; 'context': after it. */
  when: 'any' | 'open' | 'context';
}

const H = abi.handleBody;
const SPEC: Record<Op, OpSpec> = {
  [Op.QUERY_INFO]: { body: undefined, fds: [], when: 'any' },
  [Op.GET_CONTEXT]: { body: getContext, fds: ['fifo', 'eventfd', 'seqpacket'], when: 'open' },
  [Op.QUERY_DEVICE]: { body: undefined, fds: [], when: 'context' },
  [Op.QUERY_PORT]: { body: abi.portIndex, fds: [], when: 'context' },
  [Op.QUERY_GID]: { body: abi.portIndex, fds: [], when: 'context' },
  [Op.QUERY_PKEY]: { body: abi.portIndex, fds: [], when: 'context' },
  [Op.ALLOC_PD]: { body: undefined, fds: [], when: 'context' },
  [Op.DEALLOC_PD]: { body: H, fds: [], when: 'context' },
  [Op.REG_MR]: { body: abi.regMr, fds: [], when: 'context' },
  [Op.DEREG_MR]: { body: H, fds: [], when: 'context' },
  [Op.ADVISE_MR]: { body: adviseMr, fds: [], when: 'context' },
  [Op.CREATE_COMP_CHANNEL]: { body: undefined, fds: ['fifo'], when: 'context' },
  [Op.DESTROY_COMP_CHANNEL]: { body: H, fds: [], when: 'context' },
  [Op.CREATE_CQ]: { body: abi.createCq, fds: [], when: 'context' },
  [Op.DESTROY_CQ]: { body: H, fds: [], when: 'context' },
  [Op.CREATE_QP]: { body: abi.createQp, fds: [], when: 'context' },
  [Op.MODIFY_QP]: { body: abi.modifyQp, fds: [], when: 'context' },
  [Op.QUERY_QP]: { body: abi.queryQp, fds: [], when: 'context' },
  [Op.DESTROY_QP]: { body: H, fds: [], when: 'context' },
  [Op.CREATE_SRQ]: { body: abi.createSrq, fds: [], when: 'context' },
  [Op.MODIFY_SRQ]: { body: abi.modifySrq, fds: [], when: 'context' },
  [Op.QUERY_SRQ]: { body: H, fds: [], when: 'context' },
  [Op.DESTROY_SRQ]: { body: H, fds: [], when: 'context' },
  [Op.OPEN_XRCD]: { body: abi.openXrcd, fds: (b) => (b.u32('flags') & abi.XRCD_FILE ? ['file'] : []), when: 'context' },
  [Op.CLOSE_XRCD]: { body: H, fds: [], when: 'context' },
  [Op.CREATE_AH]: { body: abi.createAh, fds: [], when: 'context' },
  [Op.DESTROY_AH]: { body: H, fds: [], when: 'context' },
  [Op.QUERY_STATS]: { body: undefined, fds: [], when: 'any' },
};

/** A body's fields by name, read at the offsets of its layout (little-endian). */
export class Body {
  readonly view: DataView;
  readonly layout: Layout | undefined;
  constructor(view: DataView, layout: Layout | undefined) {
    this.view = view;
    this.layout = layout;
  }
  #at(path: string): number {
    return this.layout!.offset(path);
  }
  u8(path: string): number {
    return this.view.getUint8(this.#at(path));
  }
  u16(path: string): number {
    return this.view.getUint16(this.#at(path), true);
  }
  u32(path: string): number {
    return this.view.getUint32(this.#at(path), true);
  }
  u64(path: string): bigint {
    return this.view.getBigUint64(this.#at(path), true);
  }
  bytes(path: string, length: number): Uint8Array {
    const o = this.view.byteOffset + this.#at(path);
    return new Uint8Array(this.view.buffer, o, length);
  }
  /** Refuse a body whose `paths` (reserved words, flags the protocol fixes at 0) are not 0. */
  zero(...paths: string[]): void {
    for (const p of paths) {
      const f = this.layout!.fields.get(p)!;
      for (let i = 0; i < f.size; i++)
        if (this.view.getUint8(f.offset + i) !== 0) refuse(Refusal.BODY, 'EINVAL', `${this.layout!.name}.${p} must be 0`);
    }
  }
}

/** A checked request: its op, id, body and descriptors (the handler's to keep or close). */
export interface Request {
  op: Op;
  requestId: number;
  body: Body;
  fds: number[];
}

/** The id of a datagram's header, or 0 when it has none: what a framing refusal is answered with. */
export function requestIdOf(d: Datagram): number {
  return d.bytes.byteLength >= ctlHdr.size ? new DataView(d.bytes.buffer, d.bytes.byteOffset, d.bytes.byteLength).getUint32(12, true) : 0;
}

function framing(message: string): never {
  throw new Refused(Refusal.FRAMING, 'EPROTO', message, true);
}

/** Check a datagram as docs/device-abi.md §4 says, in that order; `hasContext`: GET_CONTEXT was done. */
export function parseRequest(d: Datagram, hasContext: boolean): Request {
  const b = d.bytes;
  if (d.truncated) framing(`a datagram longer than ${abi.CTL_MAX_MESSAGE} bytes`);
  if (d.fdsTruncated || d.fds.length > CTL_MAX_FDS) framing(`more than ${CTL_MAX_FDS} descriptors`);
  if (b.byteLength < ctlHdr.size) framing(`${b.byteLength} bytes: shorter than the ${ctlHdr.size}-byte header`);
  const v = new DataView(b.buffer, b.byteOffset, b.byteLength);
  if (v.getUint32(0, true) !== CTL_MAGIC) framing(`bad magic 0x${v.getUint32(0, true).toString(16)}`);
  if (v.getUint16(4, true) !== ABI_VERSION) framing(`ABI version ${v.getUint16(4, true)}; this device speaks ${ABI_VERSION}`);
  if (v.getUint32(8, true) !== b.byteLength) framing(`header length ${v.getUint32(8, true)} but the datagram has ${b.byteLength} bytes`);
  if (v.getInt32(16, true) !== 0 || v.getUint32(20, true) !== 0) framing('a request has status 0 and flags 0');
  const op = v.getUint16(6, true);
  const requestId = v.getUint32(12, true);
  if (op < 1 || op > OP_MAX) refuse(Refusal.OP, 'ENOSYS', `unknown op ${op}`);
  const spec = SPEC[op as Op];
  if (spec.when === 'context' && !hasContext) refuse(Refusal.OP, 'EINVAL', `${Op[op]} before GET_CONTEXT`);
  if (spec.when === 'open' && hasContext) refuse(Refusal.OP, 'EINVAL', 'GET_CONTEXT once per connection');
  const bodyLen = b.byteLength - ctlHdr.size;
  const body = new Body(new DataView(b.buffer, b.byteOffset + ctlHdr.size, bodyLen), spec.body);
  let want = spec.body?.size ?? 0;
  if (op === Op.ADVISE_MR && bodyLen >= adviseMr.size) {
    const n = body.u32('num_sge');
    if (n < 1 || n > ADVISE_MAX_SGE) refuse(Refusal.BODY, 'EINVAL', `ADVISE_MR with ${n} SGEs (1 to ${ADVISE_MAX_SGE})`);
    want += n * uverbsSge.size;
  }
  if (bodyLen !== want) refuse(Refusal.BODY, 'EINVAL', `${Op[op]} takes a ${want}-byte body, not ${bodyLen}`);
  const fds = typeof spec.fds === 'function' ? spec.fds(body) : spec.fds;
  if (d.fds.length !== fds.length) refuse(Refusal.FDS, 'EINVAL', `${Op[op]} takes ${fds.length} descriptors, not ${d.fds.length}`);
  fds.forEach((kind, i) => {
    const got = binding.fdKind(d.fds[i]!);
    if (got !== kind) refuse(Refusal.FDS, 'EINVAL', `${Op[op]}'s descriptor ${i} must be a ${kind}, not a ${got}`);
  });
  return { op: op as Op, requestId, body, fds: d.fds };
}

/** A reply body under construction, field by field at its layout's offsets. */
export class ReplyWriter {
  readonly layout: Layout;
  readonly bytes: Uint8Array;
  readonly #view: DataView;
  constructor(layout: Layout) {
    this.layout = layout;
    this.bytes = new Uint8Array(layout.size);
    this.#view = new DataView(this.bytes.buffer);
  }
  u8(path: string, v: number): this {
    this.#view.setUint8(this.layout.offset(path), v);
    return this;
  }
  u16(path: string, v: number): this {
    this.#view.setUint16(this.layout.offset(path), v, true);
    return this;
  }
  u32(path: string, v: number): this {
    this.#view.setUint32(this.layout.offset(path), v >>> 0, true);
    return this;
  }
  u64(path: string, v: bigint): this {
    this.#view.setBigUint64(this.layout.offset(path), v, true);
    return this;
  }
  /** u64 in big-endian (GUIDs, as uverbs carries them). */
  be64(path: string, v: bigint): this {
    this.#view.setBigUint64(this.layout.offset(path), v, false);
    return this;
  }
  bytesAt(path: string, v: Uint8Array): this {
    this.bytes.set(v, this.layout.offset(path));
    return this;
  }
  /** Several u32 fields at once. */
  u32s(values: Record<string, number>): this {
    for (const [k, v] of Object.entries(values)) this.u32(k, v);
    return this;
  }
}

/** A reply datagram: the header (op, id, status, PFR_CTL_REPLY) and the body (none on error). */
export function encodeReply(op: number, requestId: number, status: number, body?: Uint8Array): Uint8Array {
  const len = ctlHdr.size + (status === 0 && body ? body.byteLength : 0);
  const out = new Uint8Array(len);
  const v = new DataView(out.buffer);
  v.setUint32(0, CTL_MAGIC, true);
  v.setUint16(4, ABI_VERSION, true);
  v.setUint16(6, op, true);
  v.setUint32(8, len, true);
  v.setUint32(12, requestId, true);
  v.setInt32(16, status, true);
  v.setUint32(20, CTL_REPLY, true);
  if (status === 0 && body) out.set(body, ctlHdr.size);
  return out;
}

/** A request datagram (what a provider sends): for the tests and the CLI's own queries. */
export function encodeRequest(op: number, requestId: number, body: Uint8Array = new Uint8Array(0)): Uint8Array {
  const out = new Uint8Array(ctlHdr.size + body.byteLength);
  const v = new DataView(out.buffer);
  v.setUint32(0, CTL_MAGIC, true);
  v.setUint16(4, ABI_VERSION, true);
  v.setUint16(6, op, true);
  v.setUint32(8, out.byteLength, true);
  v.setUint32(12, requestId, true);
  out.set(body, ctlHdr.size);
  return out;
}
