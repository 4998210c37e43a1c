// The Transport between processes and hosts, over libfabric (provider tcp by default, shm
// on one host, verbs on an RDMA NIC): a server listens on a port, a client connects to
// HOST:PORT through libfabric's connection manager (FI_EP_MSG), and the two sides tell
// each other which nodes they host (the hello). Frames are bytes laid out by packet-layout.ts and framing.ts and
// checked field by field on arrival; a write packet carries its run's bytes, which stay in
// the native receive slot they arrived in (held until the write's answer goes out) where the
// destination's copy engine reads them, as a NIC's receive buffer: no staging copy (a chunked
// frame's, or one past the slots, is copied to a staging mapping). The wire is untrusted:
// a connection is bound by its hello to the nodes it named, a packet whose source is not one
// of them is refused, as is anything before the hello, anything malformed, and a connection
// that stays silent past the peer timeout without one; each refusal is counted (stats())
// and the connection's frame dropped, never thrown.
// Delivery waits on the CQ's wait fd from the event loop (native/fabric.cc). The frames one
// turn of the event loop has ready for a connection go as one message (a batch, framing.ts),
// each decoded and checked on its own on arrival. Timing stays modelled, as in Fabric.
// Stall mode adds a second connection for libfabric RMA writes straight into the target's
// memory (openRmaTarget / connectRma / rmaWrite): the target progresses it on a native thread
// of its own, the thread that blocks when a write lands on a page its fault library must resolve.
import { createHash, timingSafeEqual } from 'node:crypto';
import { lookup } from 'node:dns/promises';
import {
  binding,
  fabricBinding,
  FI_REMOTE_READ,
  FI_REMOTE_WRITE,
  type FabricBinding,
  type FabricSendStats,
  type RawMapping,
} from '../../native/index.js';
import { costModel, type CostModel } from '../cost-model/index.js';
import { type MemoryLike, rawMemory } from '../memory.js';
import { Fabric } from './fabric.js';
import { encodeExchange } from './exchange-codec.js';
import {
  BATCH_ENTRY_BYTES,
  BATCH_HEADER_BYTES,
  CHUNK_HEADER_BYTES,
  MAX_BATCH_FRAMES,
  MAX_TOKEN_BYTES,
  decodeFrame,
  encodeChunk,
  encodeHello,
  Outbox,
  encodePing,
} from './framing.js';
import { carriedBytes, place, type DecodedWrite } from './packet-layout.js';
import { MAX_FRAME_BYTES, Op } from './wire-codec.js';
import { AckResp, type Packet, type WritePacket } from './packets.js';
import type { Transport } from './transport.js';

/** A libfabric provider: tcp (between hosts), shm (one host), verbs (a real RDMA NIC). */
export type LibfabricProvider = 'tcp' | 'shm' | 'verbs';
/** Every provider name. */
export const LIBFABRIC_PROVIDERS: readonly LibfabricProvider[] = ['tcp', 'shm', 'verbs'];

export type { FabricSendStats };

/** The largest message (native/fabric.cc's receive buffers); a larger frame goes in chunks. */
export const MAX_WIRE_BYTES = 4 << 20;

/** Options of `LibfabricTransport.listen` / `connect`. */
export interface LibfabricOptions {
  /** The nodes this process hosts (their packets are delivered here). */
  localNodes: number[];
  /** Provider to use (default tcp). */
  provider?: LibfabricProvider;
  /** The link model (modelled time), as the in-process Fabric's. */
  costs?: Partial<CostModel>;
  /**
   * A peer heard nothing from for this long is lost: what waits on it ends (RETRY_EXC_ERR).
   * Both sides send a keepalive every quarter of it. Default DEFAULT_PEER_TIMEOUT_MS.
   */
  peerTimeoutMs?: number;
  /**
   * The only nodes a peer's hello may name (default: any node not hosted here or by another
   * peer). Once every one of them is connected, further connection requests are rejected.
   */
  peers?: readonly number[];
  /**
   * A secret both sides know: each side's hello carries it, and a hello without it (or with
   * another) is refused and its connection cut. Without it, whoever reaches the port first
   * with a hello naming a node it may claim is that node.
   */
  token?: string;
  /** What peers may make this transport hold (TransportLimits): each bound the transport's own choice. */
  limits?: Partial<TransportLimits>;
  /**
   * How a connection waits for an answer it expects (the ACK of a write it sent) before the
   * event loop sleeps on libfabric's wait fd: `'wait'` sleeps at once (a wake-up of a long-asleep
   * process, 25–37 µs one way on a 2-vCPU VM); `'poll'` polls the CQ for up to `maxSpinUs`
   * first; `'adaptive'` (the default) polls for up to twice what the answers seen so far took,
   * and not at all while they take longer than `maxSpinUs` (then sleeping costs less), probing
   * the whole bound every 16th time. Nothing polls when no answer is due: an idle transport
   * makes no wake-ups. The cost is CPU: polling burns the time it waits (progressStats()).
   */
  progress?: ProgressMode;
  /** The longest poll before sleeping, µs (default DEFAULT_MAX_SPIN_US; 0 disables polling). */
  maxSpinUs?: number;
}

/** How a connection waits for an answer it expects (LibfabricOptions.progress). */
export type ProgressMode = 'adaptive' | 'poll' | 'wait';
/** Every progress mode. */
export const PROGRESS_MODES: readonly ProgressMode[] = ['adaptive', 'poll', 'wait'];
/**
 * The longest poll for an answer before sleeping, µs: about what a sleeping wait costs here (a
 * wake-up of a long-asleep peer cost the sender 30–50 µs and the peer about 100 µs of
 * scheduling delay on the 2-vCPU VM this was measured on).
 */
export const DEFAULT_MAX_SPIN_US = 150;
const PROGRESS_CODE: Record<ProgressMode, 0 | 1 | 2> = { wait: 0, poll: 1, adaptive: 2 };

/** What the connections' progress did (progressStats()): polls, answers they caught, their CPU. */
export interface ProgressStats {
  /** The mode the transport was made with. */
  mode: ProgressMode;
  /** Polls before sleeping (each with an answer due). */
  spins: number;
  /** Polls an answer ended (the rest slept after their bound). */
  hits: number;
  /** CPU µs spent polling (the thread CPU clock), all connections together: the mode's cost. */
  spunUs: number;
  /** Answers timed from the send that asked for them. */
  replies: number;
  /** Their running mean (an exponential one, the adaptive bound's input), µs. */
  replyUs: number;
}

/**
 * Bounds on what the peers of a transport may make it hold, chosen by the side that holds it
 * (a server for its port): a connection request beyond them is rejected, and a connection that
 * goes past one is refused (counted) and cut, with the limit's name in the reason.
 */
export interface TransportLimits {
  /** Connections bound by a hello at once; a connection request beyond is rejected. */
  maxPeers: number;
  /**
   * Connections accepted that have not said their hello yet (a request beyond is rejected),
   * and bare TCP connections that have not even sent libfabric's connection request (the
   * oldest beyond are cut).
   */
  maxWaiting: number;
  /** A connection accepted (or a bare one) that has not said its hello within this is cut, ms. */
  helloTimeoutMs: number;
  /** The largest frame a peer may send in chunks (what one connection holds while it arrives), bytes. */
  maxFrameBytes: number;
  /**
   * Bytes held for all peers together: frames arriving in chunks, incoming writes staged until
   * their answer, exchange bodies not yet taken. A chunk, write or body beyond is refused.
   */
  maxHeldBytes: number;
  /** Bytes queued for one peer that has not read them (its answers and responses): beyond, its connection is cut. */
  maxUnsentBytes: number;
  /** Receive slots (MAX_WIRE_BYTES each) one connection may hold for the writes it brought, until they are answered. */
  maxSlots: number;
}

/** The limits a transport takes unless told otherwise (LibfabricOptions.limits). */
export const DEFAULT_TRANSPORT_LIMITS: Readonly<TransportLimits> = Object.freeze({
  maxPeers: 64,
  maxWaiting: 16,
  helloTimeoutMs: 1000,
  maxFrameBytes: 64 << 20,
  maxHeldBytes: 512 << 20,
  maxUnsentBytes: 256 << 20,
  maxSlots: 64,
});

/** Each limit's range (what LibfabricOptions.limits accepts). */
const LIMIT_RANGES: Record<keyof TransportLimits, [number, number]> = {
  maxPeers: [1, 1023],
  maxWaiting: [1, 1024],
  helloTimeoutMs: [10, 600_000],
  maxFrameBytes: [4 << 20, MAX_FRAME_BYTES],
  maxHeldBytes: [4 << 20, 2 ** 40],
  maxUnsentBytes: [4 << 20, 2 ** 40],
  maxSlots: [8, 64],
};

/** The address a server listens on unless told otherwise: this host only. */
export const DEFAULT_BIND = '127.0.0.1';

/** The answers that refuse what a peer asked for (as InfiniBand's NAKs do), counted by syndrome in stats(). */
const RDMA_REFUSALS: ReadonlySet<AckResp> = new Set([
  AckResp.PD_ERR,
  AckResp.ACCESS_ERR,
  AckResp.ADDR_ERR,
  AckResp.DROPPED,
  AckResp.INV_REQ,
  AckResp.OP_ERR,
]);

/** Distinct refusal reasons stats() keeps; past them, refusals are counted under OTHER_REASONS. */
const MAX_REASONS = 256;
const OTHER_REASONS = 'other reasons (past the distinct reasons kept)';

/** Exchange bodies kept until the program asks for them, and incoming writes staged at once: beyond, refused. */
const MAX_QUEUED_EXCHANGES = 64;
const MAX_STAGED_WRITES = 1024;
/** Staging mappings kept for reuse once their write is answered (each MAX_WIRE_BYTES or more; the rest are unmapped). */
const MAX_SPARE_STAGINGS = 8;
/** Receives a connection keeps posted once its hello was taken (before: one, for the hello). */
const POSTED_RECEIVES = 8;

/** Bytes of a frame one chunk frame carries (a receive buffer less the chunk's header). */
const CHUNK_BYTES = MAX_WIRE_BYTES - CHUNK_HEADER_BYTES;

/**
 * A payload up to this size waits in the turn's batch as a copy of its bytes; a larger one
 * sends the batch at once, so its bytes are read from the source while its pages are known
 * resident (the check #encode made), never later.
 */
const BATCH_COPY_MAX = 64 << 10;

/** What the transport refused from its peers, by reason, and how incoming writes were placed (stats()). */
export interface TransportStats {
  /** Frames (and connections) refused: malformed, before a hello, from a node the connection was not bound to, … */
  refused: number;
  /** The same, by reason (a short fixed phrase per check). */
  refusedBy: Record<string, number>;
  /** RDMA-level refusals this side's responder sent its peers (NAKs: ACCESS_ERR, DROPPED, INV_REQ, …). */
  rdmaRefused: number;
  /** The same, by syndrome (AckResp's name). */
  rdmaRefusedBy: Record<string, number>;
  /** Incoming writes whose payload the copy engine read from the receive slot it arrived in. */
  writesInPlace: number;
  /** Incoming writes whose payload was copied to a staging mapping first (a chunked frame's, or every slot held). */
  writesStaged: number;
}

/** A connection as the hello left it: the nodes it is bound to (none until its hello). */
interface Conn {
  nodes: Set<number> | undefined;
  /** Accepted by this side's listener (not dialled): it has the hello timeout to say who it is. */
  accepted: boolean;
  /** The peer's address as its connection request gave it ('' for a dialled connection). */
  address: string;
  /** When it was accepted or dialled (performance.now()). */
  since: number;
  /**
   * The peer has taken our hello: a frame came after its own (the PING it answers a hello
   * with, or any other: nothing but a hello goes to a connection before its hello is taken).
   * Only then is a connection ready: both sides know each other's nodes.
   */
  ready: boolean;
  /** Slices of a chunked frame so far, and its announced size. */
  chunks: Uint8Array[];
  chunkBytes: number;
  chunkTotal: number;
  /** Receive slots held (fabricHold) as the memory of staged writes, by slot number. */
  slots: Array<(MemoryLike & { buffer: ArrayBuffer }) | undefined>;
  /** Staged writes per held slot; at 0 the slot is released. */
  holds: number[];
  /** The frames queued for it this turn of the event loop, sent as one message (made at its first). */
  out: Outbox | undefined;
  /** A write is queued in `out`: the message asks for an answer (fabricSend's `due`). */
  due: boolean;
}

/**
 * How long a requester waits for a silent peer before RETRY_EXC_ERR, as InfiniBand counts it:
 * the local ACK timeout (4.096 µs × 2^timeout, the QP attribute) for each of retry_cnt + 1 tries.
 */
export function peerTimeoutMs(timeout: number, retryCnt: number): number {
  return Math.ceil(4.096e-3 * 2 ** timeout * (retryCnt + 1));
}

/**
 * A peer silent this long counts as lost, by default: timeout 16, retry_cnt 7 (2.1 s). A
 * process that is alive but never answers (stopped, hung) is noticed this way only: its kernel
 * keeps acknowledging TCP.
 */
export const DEFAULT_PEER_TIMEOUT_MS = peerTimeoutMs(16, 7);

function fabricError(message: string, code: string, cause?: unknown): Error {
  const e = new Error(message) as Error & { code: string; cause?: unknown };
  e.code = code;
  if (cause !== undefined) e.cause = cause;
  return e;
}

// A provider without connected endpoints finds no fi_info. shm in libfabric 1.17 offers only
// FI_EP_RDM, and even over a tcp setup connection its endpoints could not be waited on: its
// CQs refuse FI_WAIT_FD / POLLFD / SET / MUTEX_COND (fi_cq_open: -FI_ENOSYS), FI_GETWAIT on the
// ones it accepts (NONE, UNSPEC, YIELD) is -FI_ENOSYS, and its progress is manual: only a
// polling loop or a spinning thread could drive it.
function providerError(provider: string, e: unknown): unknown {
  const err = e as Error & { code?: string };
  if (err.code !== 'ENODATA') return e;
  return fabricError(
    `libfabric provider ${provider} offers no connected (FI_EP_MSG) endpoint here, which this transport's connection manager needs` +
      `${provider === 'shm' ? ' (shm: reliable datagrams only, and CQs without a wait fd)' : ''}: use provider tcp (${err.message})`,
    'ENODATA',
    e,
  );
}

function checkPort(where: string, port: unknown, min: number): number {
  if (typeof port !== 'number' || !Number.isInteger(port) || port < min || port > 65535)
    throw Object.assign(new RangeError(`${where}: port must be an integer in ${min}..65535, got ${String(port)}`), { code: 'ERR_OUT_OF_RANGE' });
  return port;
}

function checkOptions(where: string, o: LibfabricOptions): LibfabricProvider {
  if (!Array.isArray(o?.localNodes) || o.localNodes.length === 0 || !o.localNodes.every((n) => Number.isInteger(n) && n >= 0 && n < 1024))
    throw Object.assign(new TypeError(`${where}: localNodes must be a non-empty array of node ids (0..1023)`), { code: 'ERR_INVALID_ARG_TYPE' });
  const provider = o.provider ?? 'tcp';
  if (!LIBFABRIC_PROVIDERS.includes(provider))
    throw Object.assign(new TypeError(`${where}: provider must be one of ${LIBFABRIC_PROVIDERS.join(', ')}, got ${String(provider)}`), {
      code: 'ERR_INVALID_ARG_VALUE',
    });
  const t = o.peerTimeoutMs;
  if (t !== undefined && (typeof t !== 'number' || !Number.isFinite(t) || t < 10))
    throw Object.assign(new RangeError(`${where}: peerTimeoutMs must be a number of milliseconds >= 10, got ${String(t)}`), {
      code: 'ERR_OUT_OF_RANGE',
    });
  if (
    o.peers !== undefined &&
    (!Array.isArray(o.peers) || !o.peers.every((n) => Number.isInteger(n) && n >= 0 && n < 1024 && !o.localNodes.includes(n)))
  )
    throw Object.assign(new TypeError(`${where}: peers must be an array of node ids (0..1023) not hosted here`), { code: 'ERR_INVALID_ARG_TYPE' });
  if (o.token !== undefined && (typeof o.token !== 'string' || o.token === '' || Buffer.byteLength(o.token) > MAX_TOKEN_BYTES))
    throw Object.assign(new TypeError(`${where}: token must be a string of 1..${MAX_TOKEN_BYTES} bytes`), { code: 'ERR_INVALID_ARG_TYPE' });
  if (o.progress !== undefined && !PROGRESS_MODES.includes(o.progress))
    throw Object.assign(new TypeError(`${where}: progress must be one of ${PROGRESS_MODES.join(', ')}, got ${String(o.progress)}`), {
      code: 'ERR_INVALID_ARG_VALUE',
    });
  const spin = o.maxSpinUs;
  if (spin !== undefined && (typeof spin !== 'number' || !Number.isFinite(spin) || spin < 0 || spin > 1_000_000))
    throw Object.assign(new RangeError(`${where}: maxSpinUs must be a number of µs in 0..1000000, got ${String(spin)}`), {
      code: 'ERR_OUT_OF_RANGE',
    });
  return provider;
}

function checkLimits(where: string, given: Partial<TransportLimits> | undefined): TransportLimits {
  const limits = { ...DEFAULT_TRANSPORT_LIMITS };
  for (const [k, v] of Object.entries(given ?? {})) {
    const range = LIMIT_RANGES[k as keyof TransportLimits];
    if (!range)
      throw Object.assign(new TypeError(`${where}: limits.${k} is not a limit (${Object.keys(LIMIT_RANGES).join(', ')})`), {
        code: 'ERR_INVALID_ARG_VALUE',
      });
    if (typeof v !== 'number' || !Number.isInteger(v) || v < range[0] || v > range[1])
      throw Object.assign(new RangeError(`${where}: limits.${k} must be an integer in ${range[0]}..${range[1]}, got ${String(v)}`), {
        code: 'ERR_OUT_OF_RANGE',
      });
    limits[k as keyof TransportLimits] = v;
  }
  return limits;
}

/** Stall mode's target side: the connection the peer's RMA writes arrive on. */
export interface RmaTarget {
  /** The port the peer connects its RMA connection to (connectRma). */
  readonly port: number;
  /**
   * Resolves once the peer's RMA connection is up, with the kernel thread id of the native
   * thread that progresses it: the one that places the peer's writes in this process's
   * memory, so the one that blocks in their page faults (never the JavaScript thread).
   */
  readonly accepted: Promise<{
    /** Kernel thread id of the libfabric progress thread that serves it. */
    progressTid: number;
  }>;
}

interface RmaState {
  listener?: number;
  /** Target: the accepted connection; initiator: the connection to the target. */
  conn?: number;
  accepted?: { resolve: (v: { progressTid: number }) => void; reject: (e: Error) => void };
  connected?: { resolve: () => void; reject: (e: Error) => void };
  /** RMA writes and reads in flight, by id. */
  writes: Map<number, { resolve: () => void; reject: (e: Error) => void }>;
  nextId: number;
}

/** A staging mapping holding the payload of one incoming write until its answer goes out. */
interface Staging {
  raw: RawMapping;
  memory: MemoryLike;
  /** Bytes of the write it holds (counted in TransportLimits.maxHeldBytes while it does). */
  bytes: number;
}

/** An incoming write whose payload stays in the receive slot it arrived in, until its answer goes out. */
interface Held {
  handle: number;
  conn: Conn;
  slot: number;
}

/** The message being handled: its connection and receive slot. */
interface Arrival {
  handle: number;
  conn: Conn;
  slot: number;
  buffer: ArrayBufferLike;
}

/** A transport between processes or hosts over libfabric: one node per process, packets on the wire. */
export class LibfabricTransport implements Transport {
  /** The provider in use. */
  readonly provider: LibfabricProvider;
  /** The port a listening transport is bound to. */
  readonly port: number;
  #fi: FabricBinding;
  #model: Fabric;
  #local: Set<number>;
  #remote = new Map<number, number>(); // node → connection handle
  #lost = new Set<number>();
  #listener: number | undefined;
  #conns = new Map<number, Conn>(); // connection handle → what its hello bound
  #stats: TransportStats = { refused: 0, refusedBy: {}, rdmaRefused: 0, rdmaRefusedBy: {}, writesInPlace: 0, writesStaged: 0 };
  #limits: TransportLimits;
  /** The nodes a hello may name (undefined: any), and this side's token (undefined: none). */
  #peers: ReadonlySet<number> | undefined;
  #token: Buffer | undefined;
  /**
   * The exchange's peer: the first connection whose hello was taken, for as long as it lives
   * (a later one never takes its place while it does); then the next bound one, if any.
   */
  #exchangeHandle: number | undefined;
  /** Bytes held for the peers (TransportLimits.maxHeldBytes): chunks, staged writes, queued exchange bodies. */
  #held = 0;
  /** Bytes of each queued exchange body (as its frame), in queue order. */
  #exchangeBytes: number[] = [];
  /** Every peer this transport may have is connected: connection requests are rejected, waiting ones cut. */
  #full = false;
  /** The address of the connection request just accepted (its 'connection' follows at once). */
  #requestAddress = '';
  #bind: string;
  #peerWaiters: Array<{ resolve: () => void; reject: (e: Error) => void }> = [];
  #dialing = new Map<number, { resolve: () => void; reject: (e: Error) => void }>(); // connectPeer's connections before their hello
  #nodeWatchers = new Set<() => void>(); // waitForNodes: told of every hello, loss and close
  #exchanges: unknown[] = [];
  #exchangeWaiters: Array<{ take: (body: unknown) => void; fail: (e: Error) => void }> = [];
  #lostListeners: Array<(node: number, reason?: Error) => void> = [];
  #staged = new Map<string, Staging | Held>();
  #arrival: Arrival | undefined;
  #spare: Staging[] = [];
  #host: string | undefined;
  #rma: RmaState = { writes: new Map(), nextId: 1 };
  #heard = new Map<number, number>(); // connection handle → when a frame last came (performance.now())
  #keepalive: ReturnType<typeof setInterval>;
  #pending = new Set<number>(); // connections with frames queued this turn
  #progress: { mode: 0 | 1 | 2; maxSpinUs: number };
  #progressMode: ProgressMode;
  #progressDone = { spins: 0, hits: 0, spunUs: 0, replies: 0, replyUsSum: 0 }; // of connections gone
  #sendsDone: FabricSendStats = { lent: 0, copied: 0, lentBytes: 0, copiedBytes: 0, finishedOnDrop: 0, copiedOnDrop: 0, lentNow: 0 }; // of connections gone
  #flushing: ReturnType<typeof setImmediate> | undefined;
  #flushAll = (): void => this.#flush();
  #closed = false;

  private constructor(fi: FabricBinding, provider: LibfabricProvider, o: LibfabricOptions, limits: TransportLimits, port: number, bind: string) {
    this.#fi = fi;
    this.#bind = bind;
    this.provider = provider;
    this.#limits = limits;
    this.#progress = { mode: PROGRESS_CODE[o.progress ?? 'adaptive'], maxSpinUs: o.maxSpinUs ?? DEFAULT_MAX_SPIN_US };
    this.#progressMode = o.progress ?? 'adaptive';
    this.#peers = o.peers ? new Set(o.peers) : undefined;
    this.#token = o.token !== undefined ? Buffer.from(o.token) : undefined;
    this.#local = new Set(o.localNodes);
    this.#model = new Fabric(costModel(o.costs));
    this.port = port;
    const timeout = o.peerTimeoutMs ?? DEFAULT_PEER_TIMEOUT_MS;
    // The hello timeout is checked on the same tick: a connection is cut within a tick of it.
    const every = timeout / 4;
    let last = performance.now();
    this.#keepalive = setInterval(() => {
      const now = performance.now();
      // This thread was busy (or the machine stalled it): the silence it saw is its own.
      const late = now - last > 2 * every;
      last = now;
      for (const [handle, at] of this.#heard) {
        const c = this.#conns.get(handle);
        const proven = c?.nodes !== undefined;
        if (late) this.#heard.set(handle, now);
        else if (c?.accepted && !proven && now - c.since > limits.helloTimeoutMs) {
          this.#refuse('no hello within the hello timeout');
          this.#onDown(handle, fabricError(`no hello within ${limits.helloTimeoutMs} ms (limits.helloTimeoutMs)`, 'ETIMEDOUT'), true);
          continue;
        } else if (now - at > timeout) {
          if (!proven) this.#refuse('no hello within the peer timeout');
          this.#onDown(
            handle,
            fabricError(`the peer sent nothing for ${Math.round(now - at)} ms (peer timeout ${timeout} ms): it is stopped or hung`, 'ETIMEDOUT'),
            !proven,
          );
          continue;
        }
        // Nothing goes to a connection before its hello but our own hello.
        if (proven) this.#sendFrame(handle, encodePing());
      }
    }, every);
    this.#keepalive.unref();
  }

  /**
   * A server: listen on `port` (0: any free port, see `.port`) at address `host` (default
   * DEFAULT_BIND, this host only; '0.0.0.0' listens on every interface); peers connect with `connect`.
   */
  static listen(options: LibfabricOptions & { port: number; host?: string }): LibfabricTransport {
    const provider = checkOptions('LibfabricTransport.listen', options);
    const limits = checkLimits('LibfabricTransport.listen', options.limits);
    checkPort('LibfabricTransport.listen', options.port, 0);
    const host = options.host ?? DEFAULT_BIND;
    if (typeof host !== 'string' || host === '')
      throw Object.assign(new TypeError('LibfabricTransport.listen: host must be an address to listen on (0.0.0.0: every interface)'), {
        code: 'ERR_INVALID_ARG_TYPE',
      });
    const fi = fabricBinding();
    // Events come only from the event loop, after the transport below exists.
    const ref: { t?: LibfabricTransport } = {};
    let listening: { handle: number; port: number };
    try {
      listening = fi.fabricListen(provider, host, options.port, (h, kind, a, b) => ref.t?.onEvent(h, kind, a, b));
    } catch (e) {
      if ((e as { code?: string }).code === 'EADDRINUSE')
        throw fabricError(
          `port ${options.port} on ${host} is in use (another server, or one that just ended): choose another with -p PORT, or -p 0 for any free port`,
          'EADDRINUSE',
          e,
        );
      throw providerError(provider, e);
    }
    const { handle, port } = listening;
    const t = (ref.t = new LibfabricTransport(fi, provider, options, limits, port, host));
    t.#listener = handle;
    fi.fabricLimits(handle, { bareMs: limits.helloTimeoutMs, maxBare: limits.maxWaiting });
    return t;
  }

  /** A client: connect to HOST:PORT; resolves once both sides know each other's nodes. */
  static async connect(options: LibfabricOptions & { host: string; port: number; timeoutMs?: number }): Promise<LibfabricTransport> {
    const provider = checkOptions('LibfabricTransport.connect', options);
    const limits = checkLimits('LibfabricTransport.connect', options.limits);
    checkPort('LibfabricTransport.connect', options.port, 1);
    if (typeof options.host !== 'string' || options.host === '')
      throw Object.assign(new TypeError('LibfabricTransport.connect: host must be a host name or address'), { code: 'ERR_INVALID_ARG_TYPE' });
    const fi = fabricBinding();
    const ref: { t?: LibfabricTransport } = {};
    const where = `${options.host}:${options.port}`;
    // A name that does not resolve is said so (libfabric's fi_getinfo would only find "no data").
    await lookup(options.host).catch((e: Error & { code?: string }) => {
      throw fabricError(
        `cannot connect to ${where}: host ${options.host} does not resolve (${e.code ?? e.message}): check the name, or give an address`,
        'ENOTFOUND',
        e,
      );
    });
    let handle: number;
    try {
      handle = fi.fabricConnect(provider, options.host, options.port, (h, kind, a, b) => ref.t?.onEvent(h, kind, a, b));
    } catch (e) {
      if (providerError(provider, e) !== e) throw providerError(provider, e);
      throw fabricError(
        `cannot connect to ${where} over libfabric ${provider}: ${(e as Error).message}`,
        (e as { code?: string }).code ?? 'EFABRIC',
        e,
      );
    }
    const t = (ref.t = new LibfabricTransport(fi, provider, options, limits, options.port, options.host));
    t.#host = options.host;
    t.#dialled(handle);
    try {
      await t.waitForPeer(options.timeoutMs ?? 10_000);
    } catch (e) {
      t.close();
      const err = e as Error & { code?: string };
      const hint = err.code === 'ECONNREFUSED' ? ': nothing listens there (start the server side first)' : '';
      throw fabricError(`cannot connect to ${where} over libfabric ${provider}${hint} (${err.message})`, err.code ?? 'EFABRIC', e);
    }
    return t;
  }

  /** Wait until a peer has connected, said which nodes it hosts and taken our hello. */
  waitForPeer(timeoutMs = 2 ** 31 - 1): Promise<void> {
    for (const c of this.#conns.values()) if (c.ready) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const w = {
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
        reject: (e: Error) => {
          clearTimeout(timer);
          reject(e);
        },
      };
      const timer = setTimeout(() => {
        this.#peerWaiters = this.#peerWaiters.filter((x) => x !== w);
        reject(fabricError(`no peer within ${timeoutMs} ms`, 'ETIMEDOUT'));
      }, timeoutMs);
      this.#peerWaiters.push(w);
    });
  }

  /**
   * Connect to one more peer, a transport listening at HOST:PORT (a job's other rank): a
   * transport reaches every node of a job this way, each connection bound by its own hello.
   * Resolves once the peer's hello was accepted.
   */
  connectPeer(host: string, port: number, timeoutMs = 10_000): Promise<void> {
    this.#checkOpen('connectPeer');
    checkPort('LibfabricTransport.connectPeer', port, 1);
    if (typeof host !== 'string' || host === '')
      throw Object.assign(new TypeError('LibfabricTransport.connectPeer: host must be a host name or address'), { code: 'ERR_INVALID_ARG_TYPE' });
    const where = `${host}:${port}`;
    let handle: number;
    try {
      handle = this.#fi.fabricConnect(this.provider, host, port, (h, kind, a, b) => this.onEvent(h, kind, a, b));
    } catch (e) {
      return Promise.reject(fabricError(`cannot connect to ${where} over libfabric ${this.provider}: ${(e as Error).message}`, 'EFABRIC', e));
    }
    this.#dialled(handle);
    return new Promise((resolve, reject) => {
      const end = (e?: Error) => {
        clearTimeout(timer);
        this.#dialing.delete(handle);
        if (!e) return resolve();
        const hint = (e as { code?: string }).code === 'ECONNREFUSED' ? ': nothing listens there' : '';
        reject(
          fabricError(
            `cannot connect to ${where} over libfabric ${this.provider}${hint} (${e.message})`,
            (e as { code?: string }).code ?? 'EFABRIC',
            e,
          ),
        );
      };
      const timer = setTimeout(() => {
        end(fabricError(`no hello within ${timeoutMs} ms`, 'ETIMEDOUT'));
        this.#onDown(handle, undefined, true);
      }, timeoutMs);
      this.#dialing.set(handle, { resolve: () => end(), reject: end });
    });
  }

  /**
   * Wait until every node of `nodes` is connected (its connection's hello accepted), whichever
   * side connected. Fails at once if one of them connected and went away, or on close.
   */
  waitForNodes(nodes: readonly number[], timeoutMs = 10_000): Promise<void> {
    return new Promise((resolve, reject) => {
      const missing = () => nodes.filter((n) => !this.#remote.has(n));
      const end = (e?: Error) => {
        clearTimeout(timer);
        this.#nodeWatchers.delete(check);
        if (e) reject(e);
        else resolve();
      };
      const check = () => {
        const m = missing();
        const lost = m.find((n) => this.#lost.has(n));
        if (this.#closed) end(fabricError('waitForNodes: the transport was closed', 'ERR_CLOSED'));
        else if (lost !== undefined) end(fabricError(`node ${lost} connected and went away`, 'ECONNRESET'));
        else if (m.length === 0) end();
      };
      const timer = setTimeout(
        () => end(fabricError(`nodes ${missing().join(', ')} did not connect within ${timeoutMs} ms`, 'ETIMEDOUT')),
        timeoutMs,
      );
      this.#nodeWatchers.add(check);
      check();
    });
  }

  /**
   * Send `body` to the peer and wait for what it sends the same way: how the two sides swap
   * QP numbers, addresses and keys (ibv_rc_pingpong's exchange over its TCP socket).
   */
  exchange<T>(body: unknown, timeoutMs = 10_000): Promise<T> {
    try {
      this.post(body);
    } catch (e) {
      return Promise.reject(e as Error);
    }
    return this.receive<T>(timeoutMs);
  }

  /**
   * Send `body` to the peer (it comes out of the peer's exchange or receive), without waiting:
   * null, booleans, numbers, bigints, strings, arrays and plain objects (exchange-codec.ts says how
   * many and how deep). The peer is the first connection whose hello was accepted.
   */
  post(body: unknown): void {
    const handle = this.#exchangeHandle;
    if (handle === undefined || this.#closed) throw fabricError('exchange: no peer is connected', 'ENOTCONN');
    this.#sendFrame(handle, encodeExchange(body));
  }

  /** What this transport refused from its peers so far (and the RDMA-level refusals its node sent them). */
  stats(): TransportStats {
    return { ...this.#stats, refusedBy: { ...this.#stats.refusedBy }, rdmaRefusedBy: { ...this.#stats.rdmaRefusedBy } };
  }

  /** How the connections waited for the answers they expected (LibfabricOptions.progress), so far. */
  progressStats(): ProgressStats {
    const t = { ...this.#progressDone };
    for (const handle of this.#conns.keys()) this.#addProgress(t, handle);
    return {
      mode: this.#progressMode,
      spins: t.spins,
      hits: t.hits,
      spunUs: t.spunUs,
      replies: t.replies,
      replyUs: t.replies ? t.replyUsSum / t.replies : 0,
    };
  }

  /**
   * How the write payloads past the batch (over 64 KiB) were sent, so far: from their source's
   * pages (lent: no staging copy) or copied into a send buffer (a page that could fault), and the
   * lent sends a drop of their pages had to finish or copy first. `lentNow`: still lent.
   */
  sendStats(): FabricSendStats {
    const t = { ...this.#sendsDone, lentNow: 0 };
    for (const handle of this.#conns.keys()) this.#addSends(t, handle);
    return t;
  }

  #addSends(t: FabricSendStats, handle: number): void {
    const s = this.#fi.fabricProgress(handle).sends;
    if (!s) return;
    for (const k of Object.keys(t) as (keyof FabricSendStats)[]) t[k] += s[k];
  }

  #addProgress(t: { spins: number; hits: number; spunUs: number; replies: number; replyUsSum: number }, handle: number): void {
    const s = this.#fi.fabricProgress(handle);
    t.spins += s.spins;
    t.hits += s.hits;
    t.spunUs += s.spunUs;
    t.replies += s.replies;
    t.replyUsSum += s.replyUs * s.replies;
  }

  // A connection's end: what its progress did is kept for progressStats().
  #closeConn(handle: number): void {
    this.#addProgress(this.#progressDone, handle);
    this.#addSends(this.#sendsDone, handle);
    this.#sendsDone.lentNow = 0;
    this.#fi.fabricClose(handle);
  }

  /** The limits this transport holds its peers to. */
  get limits(): Readonly<TransportLimits> {
    return { ...this.#limits };
  }

  /** Wait for the next body the peer posts (or exchanges), without sending: one side of a request and its answer. */
  receive<T>(timeoutMs = 10_000): Promise<T> {
    if (this.#exchanges.length) {
      this.#held -= this.#exchangeBytes.shift()!;
      return Promise.resolve(this.#exchanges.shift() as T);
    }
    if (this.#closed) return Promise.reject(fabricError('exchange: the transport was closed', 'ERR_CLOSED'));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#exchangeWaiters = this.#exchangeWaiters.filter((x) => x !== w);
        reject(fabricError(`exchange: the peer sent nothing within ${timeoutMs} ms`, 'ETIMEDOUT'));
      }, timeoutMs);
      const w = {
        take: (b: unknown) => {
          clearTimeout(timer);
          resolve(b as T);
        },
        fail: (e: Error) => {
          clearTimeout(timer);
          reject(e);
        },
      };
      this.#exchangeWaiters.push(w);
    });
  }

  /**
   * Stall mode, target side: listen for the peer's RMA connection (any free port). Its
   * writes go straight into memory exposed with exposeRma, placed by a native progress thread.
   */
  openRmaTarget(timeoutMs = 10_000): RmaTarget {
    this.#checkOpen('openRmaTarget');
    if (this.#rma.listener !== undefined) throw fabricError('openRmaTarget: the RMA target is already open', 'ERR_INVALID_STATE');
    const { handle, port } = this.#fi.fabricListen(this.provider, this.#bind, 0, (h, kind, a, b) => this.onEvent(h, kind, a, b), true);
    this.#rma.listener = handle;
    const accepted = new Promise<{ progressTid: number }>((resolve, reject) => {
      const timer = setTimeout(() => reject(fabricError(`openRmaTarget: no RMA connection within ${timeoutMs} ms`, 'ETIMEDOUT')), timeoutMs);
      this.#rma.accepted = {
        resolve: (v) => {
          clearTimeout(timer);
          resolve(v);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      };
    });
    return { port, accepted };
  }

  /**
   * Stall mode, target side: let the peer fi_write/fi_read [address, address+length) of this
   * process (fi_mr_reg with FI_REMOTE_WRITE | FI_REMOTE_READ; tcp and shm need no pinning:
   * no FI_MR_LOCAL / FI_MR_ALLOCATED). Returns the key the peer writes with and the address
   * it names the range's start by (the virtual address, or 0 where the provider's mr_mode has
   * no FI_MR_VIRT_ADDR, as tcp's: offsets into the range).
   */
  exposeRma(
    address: bigint,
    length: number,
  ): {
    /** The RMA key the peer uses. */
    key: bigint;
    /** Address the peer's offsets start from. */
    base: bigint;
  } {
    this.#checkOpen('exposeRma');
    if (this.#rma.conn === undefined || this.#rma.listener === undefined)
      throw fabricError('exposeRma: no RMA connection has been accepted yet (await openRmaTarget().accepted)', 'ENOTCONN');
    const { key, base } = this.#fi.fabricMrReg(this.#rma.conn, address, length, FI_REMOTE_WRITE | FI_REMOTE_READ);
    return { key, base };
  }

  /** Stall mode, initiator side: connect the RMA connection to the target's `port` (same host). */
  connectRma(port: number, timeoutMs = 10_000): Promise<void> {
    this.#checkOpen('connectRma');
    checkPort('LibfabricTransport.connectRma', port, 1);
    if (this.#host === undefined)
      return Promise.reject(fabricError('connectRma: only a connecting (client) transport opens the RMA connection', 'ERR_INVALID_STATE'));
    const handle = this.#fi.fabricConnect(this.provider, this.#host, port, (h, kind, a, b) => this.onEvent(h, kind, a, b));
    this.#rma.conn = handle;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(fabricError(`connectRma: ${this.#host}:${port} did not accept within ${timeoutMs} ms`, 'ETIMEDOUT')),
        timeoutMs,
      );
      this.#rma.connected = {
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      };
    });
  }

  /**
   * Stall mode: an RDMA WRITE as a libfabric RMA write of [local, local+length) of this
   * process to the target's `remote` (base + offset, as exposeRma said) with `key`. Resolves once the target has placed
   * the bytes (FI_DELIVERY_COMPLETE): after any faults they met there were resolved.
   */
  rmaWrite(local: bigint, length: number, remote: bigint, key: bigint): Promise<void> {
    return this.#rmaOp('rmaWrite', true, local, length, remote, key);
  }

  /**
   * Stall mode: an RDMA READ as a libfabric RMA read of the target's `remote` (base + offset,
   * as exposeRma said) with `key` into [local, local+length) of this process. The target's
   * provider thread reads its memory, so it is the one that blocks in the faults met there.
   * Resolves once the bytes are here.
   */
  rmaRead(local: bigint, length: number, remote: bigint, key: bigint): Promise<void> {
    return this.#rmaOp('rmaRead', false, local, length, remote, key);
  }

  #rmaOp(where: string, write: boolean, local: bigint, length: number, remote: bigint, key: bigint): Promise<void> {
    this.#checkOpen(where);
    const conn = this.#rma.conn;
    if (conn === undefined || this.#rma.listener !== undefined)
      return Promise.reject(fabricError(`${where}: no RMA connection (connectRma first)`, 'ENOTCONN'));
    const id = this.#rma.nextId++;
    return new Promise((resolve, reject) => {
      this.#rma.writes.set(id, { resolve, reject });
      try {
        this.#fi.fabricRma(conn, write, id, local, length, remote, key);
      } catch (e) {
        this.#rma.writes.delete(id);
        reject(e as Error);
      }
    });
  }

  #checkOpen(where: string): void {
    if (this.#closed) throw fabricError(`${where}: the transport was closed`, 'ERR_CLOSED');
  }

  #onRmaEvent(handle: number, kind: string, a: unknown, b: unknown): boolean | void {
    const rma = this.#rma;
    if (kind === 'request') {
      // One RMA connection, from the exchange's peer's host: anyone else on the port is rejected.
      const peer = this.#exchangeHandle === undefined ? undefined : this.#conns.get(this.#exchangeHandle);
      const ok = rma.conn === undefined && peer !== undefined && hostOf(a as string) === hostOf(peer.address);
      if (!ok) this.#refuse('an RMA connection request not from the peer, or a second one');
      return ok;
    }
    if (kind === 'refused') return this.#refuse(a as string);
    if (kind === 'connection') {
      // One RMA connection, the peer's: a second one (anyone else on the port) is closed.
      if (rma.conn !== undefined) {
        this.#refuse('a second RMA connection');
        this.#fi.fabricClose(a as number);
      } else rma.conn = a as number;
      return;
    }
    if (kind === 'connected') {
      if (rma.listener !== undefined) rma.accepted?.resolve({ progressTid: a as number });
      else rma.connected?.resolve();
      return;
    }
    if (kind === 'rma') {
      const w = rma.writes.get(a as number);
      rma.writes.delete(a as number);
      const errno = -(b as number);
      if (errno === 0) w?.resolve();
      else w?.reject(fabricError(`an RMA write or read on the RMA connection failed: errno ${errno}`, 'EFABRIC'));
      return;
    }
    const e = (a as Error | undefined) ?? fabricError('the RMA connection was shut down by the peer', 'ECONNRESET');
    rma.accepted?.reject(e);
    rma.connected?.reject(e);
    for (const w of rma.writes.values()) w.reject(e);
    rma.writes.clear();
    if (handle === rma.conn && rma.listener === undefined) {
      this.#fi.fabricClose(handle);
      rma.conn = undefined;
    }
  }

  /**
   * Hear when a peer node goes away (its connection shut down, or silent past the peer
   * timeout): whatever waits on it must end. `reason` says why, the first time a node is told.
   */
  onPeerLost(listener: (node: number, reason?: Error) => void): void {
    this.#lostListeners.push(listener);
  }

  /** Whether node `node` is hosted by this process. */
  isLocal(node: number): boolean {
    return this.#local.has(node);
  }

  attach(node: number, handler: (p: Packet) => void): void {
    // Only this process's nodes receive here; the others are the peers'.
    if (this.#local.has(node)) this.#model.attach(node, handler);
  }

  /** True if `node` is this process's node or a peer's it has been connected to (one since lost included). */
  hasNode(node: number): boolean {
    return this.#local.has(node) || this.#remote.has(node) || this.#lost.has(node);
  }

  transmit(src: number, dst: number, bytes: number, atUs: number): number {
    return this.#model.transmit(src, dst, bytes, atUs);
  }

  linkFreeAt(src: number, dst: number): number {
    return this.#model.linkFreeAt(src, dst);
  }

  deliver(p: Packet): void {
    if (this.#local.has(p.dst)) {
      this.#model.deliver(p);
      return;
    }
    // The answer to a write frees its staging (or receive slot) whether or not its peer is
    // still there to hear it: one gone mid-write must not keep its bytes held.
    if (p.type === 'ack' && p.verdicts) {
      this.#release(p.dst, p.tid, p.seq);
      for (const v of p.verdicts) if (RDMA_REFUSALS.has(v.resp)) this.#refuseRdma(AckResp[v.resp]);
    }
    const handle = this.#remote.get(p.dst);
    if (handle === undefined) {
      if (!this.#lost.has(p.dst)) throw new RangeError(`fabric: unknown node ${p.dst}`);
      // The peer is gone: whoever sent this learns it (and ends what waits) on a later turn.
      queueMicrotask(() => this.#tellLost(p.dst));
      return;
    }
    this.#sendPacket(handle, p);
  }

  // Frames ready in one turn of the event loop go to their connection as one message (a
  // batch) at the end of the turn (setImmediate: after this turn's I/O callbacks, before the
  // loop sleeps again), as RC coalesces ACKs: a packet waits for no timer, only for the
  // JavaScript of its turn to finish. Each is written straight into its connection's Outbox.
  #box(handle: number, c: Conn): Outbox {
    const box = (c.out ??= new Outbox());
    if (box.frames === MAX_BATCH_FRAMES) this.#flushConn(handle, c);
    if (box.frames === 0) {
      this.#pending.add(handle);
      this.#flushing ??= setImmediate(this.#flushAll);
    }
    return box;
  }

  #sendFrame(handle: number, frame: Uint8Array): void {
    const c = this.#conns.get(handle);
    if (!c) return;
    if (frame.length + BATCH_HEADER_BYTES + BATCH_ENTRY_BYTES > MAX_WIRE_BYTES) return this.#sendChunked(handle, c, frame);
    const box = this.#box(handle, c);
    if (box.bytes + BATCH_ENTRY_BYTES + frame.length > MAX_WIRE_BYTES) this.#flushConn(handle, c);
    box.frame(frame);
  }

  // A frame too large for a receive buffer (a run of up to MAX_RUN_BLOCKS blocks, 4 MiB of
  // 4 KiB blocks plus headers, or a large exchange body) goes as ordered slices the peer joins
  // before decoding, after what was queued before it.
  #sendChunked(handle: number, c: Conn, frame: Uint8Array, due = false): void {
    if (c.out?.frames) this.#flushConn(handle, c);
    for (let at = 0; at < frame.length; at += CHUNK_BYTES)
      this.#send(
        handle,
        encodeChunk(frame.length, at, frame.subarray(at, Math.min(frame.length, at + CHUNK_BYTES))),
        due && at + CHUNK_BYTES >= frame.length,
      );
  }

  // A packet's payload is a view of the source's memory: copied into the batch if small, else
  // sent now with what was queued before it, not copied here (see BATCH_COPY_MAX): native code
  // sends it from the source's pages where a presence proof says none can fault (`lend`), and
  // copies it into the send buffer where one could.
  #sendPacket(handle: number, p: Packet): void {
    const c = this.#conns.get(handle);
    if (!c) return;
    const wire = p.type === 'write' && p.length > 0 ? this.#carried(p) : p;
    const bytes = wire.type === 'write' ? this.#payload(wire) : undefined;
    const external = bytes !== undefined && bytes.length > BATCH_COPY_MAX;
    const lend: [number, number] | undefined = external && wire.type === 'write' ? [wire.payload.region.id, wire.payload.offset] : undefined;
    const box = this.#box(handle, c);
    box.packet(wire, bytes, external);
    if (wire.type === 'write') c.due = true;
    if (box.bytes + (external ? bytes.length : 0) > MAX_WIRE_BYTES) {
      // Too much for one message with the frames before it: they go first, it alone or in slices.
      const head = box.popLast();
      if (box.frames) this.#flushConn(handle, c);
      if (head.length + (external ? bytes.length : 0) + BATCH_HEADER_BYTES + BATCH_ENTRY_BYTES > MAX_WIRE_BYTES)
        this.#sendChunked(handle, c, external ? Buffer.concat([head, bytes]) : head, true);
      else this.#send(handle, external ? [head, bytes] : head, true, lend);
      return;
    }
    if (external) this.#flushConn(handle, c, bytes, lend);
  }

  #flush(): void {
    this.#flushing = undefined;
    // A handle queued again while this runs (a send's events reach JavaScript) is visited too.
    for (const handle of this.#pending) {
      this.#pending.delete(handle);
      const c = this.#conns.get(handle);
      if (c?.out?.frames) this.#flushConn(handle, c);
    }
  }

  // The connection's queued frames as one message; `payload`, the last frame's bytes not copied into the box, after them.
  #flushConn(handle: number, c: Conn, payload?: Uint8Array, lend?: [number, number]): void {
    const message = c.out!.take();
    const due = c.due;
    c.due = false;
    this.#send(handle, payload ? [message, payload] : message, due, payload ? lend : undefined);
  }

  // One message on its way; a connection the provider refuses it on is down (this may run
  // from setImmediate, where a throw would end the process).
  // `lend` [region id, offset]: the last part is that region's bytes (fabricSend may send them from there).
  #send(handle: number, parts: Uint8Array | Uint8Array[], due = false, lend?: [number, number]): void {
    try {
      if (lend) this.#fi.fabricSend(handle, parts, due, lend);
      else this.#fi.fabricSend(handle, parts, due);
    } catch (e) {
      // A peer that reads nothing of what it is sent (its answers, the responses it asked for)
      // is cut once limits.maxUnsentBytes wait for it.
      if ((e as { code?: string }).code !== 'ENOBUFS') return this.#onDown(handle, e as Error);
      this.#refuse('a peer that does not read what it is sent: limits.maxUnsentBytes');
      this.#onDown(handle, fabricError(`this side cut the connection: ${(e as Error).message} (limits.maxUnsentBytes)`, 'ENOBUFS', e), true);
    }
  }

  send<P extends Packet>(p: Omit<P, 'arrivesAt'>, atUs: number, payloadBytes = 0): P {
    if (!this.hasNode(p.dst)) throw new RangeError(`fabric: unknown node ${p.dst}`);
    const packet = { ...p, arrivesAt: this.transmit(p.src, p.dst, payloadBytes, atUs) } as P;
    this.deliver(packet);
    return packet;
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Close the connections and the listener; the peer sees its nodes lost. Idempotent. */
  close(): void {
    if (this.#closed) return;
    // What this turn queued (a last exchange, an ACK) goes before the connections close.
    if (this.#flushing) clearImmediate(this.#flushing);
    this.#flush();
    this.#closed = true;
    clearInterval(this.#keepalive);
    for (const h of this.#conns.keys()) this.#closeConn(h);
    this.#conns.clear();
    if (this.#listener !== undefined) this.#fi.fabricClose(this.#listener);
    for (const h of [this.#rma.conn, this.#rma.listener]) if (h !== undefined) this.#fi.fabricClose(h);
    const closed = fabricError('the transport was closed', 'ERR_CLOSED');
    this.#rma.accepted?.reject(closed);
    this.#rma.connected?.reject(closed);
    for (const w of this.#rma.writes.values()) w.reject(closed);
    this.#rma.writes.clear();
    for (const w of this.#peerWaiters.splice(0)) w.reject(fabricError('the transport was closed', 'ERR_CLOSED'));
    for (const d of [...this.#dialing.values()]) d.reject(fabricError('the transport was closed', 'ERR_CLOSED'));
    for (const w of [...this.#nodeWatchers]) w();
    for (const w of this.#exchangeWaiters.splice(0)) w.fail(fabricError('the transport was closed', 'ERR_CLOSED'));
    for (const s of [...this.#staged.values(), ...this.#spare]) {
      if ('raw' in s) binding.closeRegion(s.raw.id, s.raw.buffer);
      else this.#unhold(s, true);
    }
    this.#staged.clear();
    this.#spare = [];
  }

  /** Same as `close()`, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  // A write carries its run's bytes; the source pages must still be resident. A page evicted
  // since the translation ends the run's bytes at its block, which the peer answers
  // SOURCE_FAULT after the blocks before it (the write still goes: a transfer's answers come
  // back in order).
  #carried(p: WritePacket): WritePacket {
    const r = p.payload.region;
    const buffer = (r as MemoryLike & { buffer?: ArrayBuffer }).buffer;
    // mincore wants a page-aligned start: the pages from the one the payload starts in.
    const first = p.payload.offset - (p.payload.offset % r.pageSize);
    const resident = r.closed || !buffer ? undefined : binding.residency(r.id, first, p.payload.offset + p.length - first);
    const missing = resident ? resident.indexOf(0) : 0;
    if (missing < 0) return p;
    const faultOffset = Math.max(p.payload.offset, first + missing * r.pageSize);
    const j = Math.floor((faultOffset - p.payload.offset) / p.blockSize);
    return { ...p, sourceFault: { seq: p.seq + j, faultOffset } };
  }

  // The bytes a write carries, a view of the source memory (none if it has none to read from).
  #payload(p: WritePacket): Uint8Array | undefined {
    const carried = carriedBytes(p);
    const buffer = (p.payload.region as MemoryLike & { buffer?: ArrayBuffer }).buffer;
    return carried && buffer ? new Uint8Array(buffer, p.payload.offset, carried) : undefined;
  }

  #decodeWrite(p: DecodedWrite, bytes: Uint8Array): WritePacket {
    const key = `${p.src}:${p.tid}:${p.seq}`;
    // Each staged write is released by its answer: one already waiting, or too many, is refused.
    if (this.#staged.has(key)) throw new RefusedError('a write repeating one not yet answered');
    if (this.#staged.size >= MAX_STAGED_WRITES) throw new RefusedError('a write beyond the staged writes');
    // In place: the bytes stay in their receive slot, which is held until the answer.
    const a = this.#arrival;
    if (a && bytes.buffer === a.buffer) {
      let memory = a.conn.holds[a.slot] ? a.conn.slots[a.slot] : undefined;
      if (!memory) {
        const raw = this.#fi.fabricHold(a.handle, a.slot);
        if (raw) memory = a.conn.slots[a.slot] ??= rawMemory(raw);
      }
      if (memory) {
        a.conn.holds[a.slot] = (a.conn.holds[a.slot] ?? 0) + 1;
        this.#staged.set(key, { handle: a.handle, conn: a.conn, slot: a.slot });
        this.#stats.writesInPlace++;
        return place(p, memory, bytes.byteOffset);
      }
    }
    this.#hold(bytes.length, 'a write staged');
    let s: Staging;
    try {
      s = this.#stage(bytes.length);
    } catch (e) {
      this.#held -= bytes.length;
      throw e;
    }
    this.#staged.set(key, s);
    this.#stats.writesStaged++;
    new Uint8Array(s.raw.buffer).set(bytes);
    return place(p, s.memory);
  }

  #stage(size: number): Staging {
    const i = this.#spare.findIndex((x) => x.raw.buffer.byteLength >= size);
    if (i >= 0) return { ...this.#spare.splice(i, 1)[0]!, bytes: size };
    const page = 4096;
    const raw = binding.mapRegion(Math.max(MAX_WIRE_BYTES, Math.ceil(size / page) * page), false, false, false);
    return { raw, memory: rawMemory(raw), bytes: size };
  }

  placed(p: WritePacket): void {
    this.#release(p.src, p.tid, p.seq);
  }

  // The answer to a write goes out (or a response was placed): its copy is done, the staging
  // mapping (or receive slot) can serve the next.
  #release(src: number, tid: number, seq: number): void {
    const k = `${src}:${tid}:${seq}`;
    const s = this.#staged.get(k);
    if (!s) return;
    this.#staged.delete(k);
    if (!('raw' in s)) return this.#unhold(s, false);
    this.#held -= s.bytes;
    if (this.#spare.length < MAX_SPARE_STAGINGS) this.#spare.push(s);
    else binding.closeRegion(s.raw.id, s.raw.buffer);
  }

  // One staged write of a held slot is answered; the last one gives the slot back (posted
  // again), or unmaps it if its connection is gone. Never while its own message is being
  // handled: the rest of that message is still read from the slot (#onMessage releases it after).
  #unhold(h: Held, closing: boolean): void {
    const n = (h.conn.holds[h.slot] ?? 1) - 1;
    h.conn.holds[h.slot] = n;
    if (n > 0) return;
    const a = this.#arrival;
    if (!closing && a && a.conn === h.conn && a.slot === h.slot) return;
    this.#giveBack(h.handle, h.conn, h.slot);
  }

  #giveBack(handle: number, conn: Conn, slot: number): void {
    const memory = conn.slots[slot];
    conn.slots[slot] = undefined;
    if (!this.#closed && this.#conns.get(handle) === conn) this.#fi.fabricRelease(handle, slot);
    else if (memory) binding.closeRegion(memory.id, memory.buffer);
  }

  #tellLost(node: number, reason?: Error): void {
    for (const l of this.#lostListeners) l(node, reason);
  }

  /** @internal native events */
  onEvent(handle: number, kind: string, a?: unknown, b?: unknown): boolean | void {
    if (this.#closed) return false;
    if (handle === this.#rma.listener || handle === this.#rma.conn) return this.#onRmaEvent(handle, kind, a, b);
    switch (kind) {
      case 'request':
        return this.#admit(a as string);
      case 'connection': {
        // Accepted, not yet trusted: it has the hello timeout to say who it is.
        const c = newConn(true, this.#requestAddress);
        this.#conns.set(a as number, c);
        this.#heard.set(a as number, c.since);
        this.#fi.fabricLimits(a as number, { maxSlots: this.#limits.maxSlots, maxPending: this.#limits.maxUnsentBytes });
        this.#fi.fabricProgress(a as number, this.#progress);
        return;
      }
      case 'connected':
        // At once, not at the end of the turn: nothing goes before it, and the peer may act
        // on ours (its connect resolves) within this turn.
        this.#send(handle, [encodeHello([...this.#local], this.#token)]);
        return;
      case 'refused':
        // What libfabric passed on that this transport never sends (native/fabric.cc), or a
        // bare connection the listener cut: refused, and a connection that sent it is cut.
        this.#refuse(a as string);
        if (this.#conns.has(handle)) this.#onDown(handle, fabricError(`refused: ${a as string}`, 'EPROTO'), true);
        return;
      case 'message':
        this.#heard.set(handle, performance.now());
        this.#onMessage(handle, a as Uint8Array, b as number);
        return;
      case 'shutdown':
      case 'error':
        this.#onDown(handle, a as Error | undefined);
        return;
    }
  }

  // Whatever a peer sends is checked here and refused (counted, dropped) if it breaks the
  // layout or the handshake; nothing a peer sends may throw out of this (it would end the
  // process from the native event callback). `bytes` is a view of the native receive slot,
  // valid until this returns: what outlives it is copied (a write's payload, a chunk).
  #onMessage(handle: number, bytes: Uint8Array, slot: number): void {
    const c = this.#conns.get(handle);
    if (!c) return;
    this.#arrival = { handle, conn: c, slot, buffer: bytes.buffer };
    try {
      this.#onFrame(handle, c, bytes, false);
    } finally {
      this.#arrival = undefined;
    }
    // Held, and every write in it answered already: give it back now that nothing reads it.
    if (c.slots[slot] && c.holds[slot] === 0) this.#giveBack(handle, c, slot);
  }

  #onFrame(handle: number, c: Conn, bytes: Uint8Array, inBatch: boolean): void {
    try {
      let f = decodeFrame(bytes);
      let size = bytes.length;
      if (f.op === Op.BATCH) {
        if (inBatch) throw new RefusedError('a batch inside a batch');
        // Each frame on its own, in order: a bad one is refused and counted, the others go on
        // (unless it cut the connection).
        for (const frame of f.frames) {
          if (this.#conns.get(handle) !== c) return;
          this.#onFrame(handle, c, frame, true);
        }
        return;
      }
      // Before its hello a connection gets nothing but its hello read, not even a chunk joined.
      if (!c.nodes && f.op !== Op.HELLO) throw new RefusedError('a frame before the hello');
      if (f.op === Op.CHUNK) {
        if (inBatch) throw new RefusedError('a chunk inside a batch');
        const frame = this.#join(c, f);
        if (!frame) return;
        size = frame.length;
        f = decodeFrame(frame);
        if (f.op === Op.CHUNK) throw new RefusedError('a chunk inside a chunked frame');
        if (f.op === Op.BATCH) throw new RefusedError('a batch inside a chunked frame');
      }
      if (f.op === Op.HELLO) return this.#onHello(handle, c, f.nodes, f.token);
      if (!c.nodes) throw new RefusedError('a frame before the hello');
      if (!c.ready) this.#onReady(handle, c);
      switch (f.op) {
        case Op.PING:
          return;
        case Op.EXCHANGE: {
          if (handle !== this.#exchangeHandle) throw new RefusedError('an exchange from a connection that is not the peer');
          const w = this.#exchangeWaiters.shift();
          if (w) return w.take(f.body);
          if (this.#exchanges.length >= MAX_QUEUED_EXCHANGES) throw new RefusedError('an exchange beyond the queue');
          this.#hold(size, 'an exchange body');
          this.#exchanges.push(f.body);
          this.#exchangeBytes.push(size);
          return;
        }
        default: {
          // The source is the connection's: a node its hello named, never just what the packet says.
          const p = f.packet;
          if (!c.nodes.has(p.src)) throw new RefusedError('a packet from a node its connection is not bound to');
          if (!this.#local.has(p.dst)) throw new RefusedError('a packet for a node not hosted here');
          this.#model.deliverDecoded(f.op === Op.WRITE ? this.#decodeWrite(f.packet, f.bytes) : f.packet);
        }
      }
    } catch (e) {
      const reason = e instanceof RefusedError ? e.message : `a malformed frame (${(e as Error).message})`;
      this.#refuse(reason);
      // A connection that has not proven itself gets no second chance, nor one past a limit.
      if (!this.#conns.has(handle)) return;
      if (!c.nodes) this.#onDown(handle, fabricError('refused before its hello', 'EPROTO'), true);
      else if (e instanceof LimitError) this.#onDown(handle, fabricError(`this side cut the connection: ${reason}`, 'ENOBUFS'), true);
    }
  }

  // A chunk joins its frame's earlier slices (messages of a connection arrive in order);
  // returns the whole frame with its last slice.
  #join(c: Conn, f: { total: number; offset: number; data: Uint8Array }): Uint8Array | undefined {
    if (f.offset !== c.chunkBytes || (c.chunkBytes > 0 && f.total !== c.chunkTotal)) {
      this.#dropChunks(c);
      throw new RefusedError('a chunk out of order');
    }
    if (f.total > this.#limits.maxFrameBytes) {
      this.#dropChunks(c);
      throw new LimitError('a chunked frame larger than limits.maxFrameBytes');
    }
    try {
      this.#hold(f.data.length, 'a chunk');
    } catch (e) {
      this.#dropChunks(c);
      throw e;
    }
    c.chunks.push(f.data.slice());
    c.chunkBytes += f.data.length;
    c.chunkTotal = f.total;
    if (c.chunkBytes < f.total) return undefined;
    const frame = Buffer.concat(c.chunks);
    this.#dropChunks(c);
    return frame;
  }

  // A connection's slices so far are let go (its frame is whole, refused, or the connection gone).
  #dropChunks(c: Conn): void {
    this.#held -= c.chunkBytes;
    c.chunks = [];
    c.chunkBytes = 0;
  }

  // `bytes` more are held for the peers, within limits.maxHeldBytes (else `what` is refused).
  #hold(bytes: number, what: string): void {
    if (this.#held + bytes > this.#limits.maxHeldBytes) throw new LimitError(`${what} beyond limits.maxHeldBytes`);
    this.#held += bytes;
  }

  #onHello(handle: number, c: Conn, nodes: number[], token: Uint8Array | undefined): void {
    if (c.nodes) throw new RefusedError('a second hello');
    const cut = (reason: string, why: string) => {
      this.#refuse(reason);
      this.#onDown(handle, fabricError(why, 'EPROTO'), true);
    };
    if (this.#token && !sameToken(this.#token, token)) return cut("a hello without this side's token", 'its hello does not carry the token');
    for (const n of nodes) {
      // Only the peers this transport expects, and a node hosted here, or bound to another live
      // connection, is not this connection's to claim.
      if (this.#peers && !this.#peers.has(n))
        return cut('a hello naming a node that is not one of the peers', `node ${n} is not a peer of this side`);
      if (this.#local.has(n) || this.#remote.has(n))
        return cut('a hello naming a node that is hosted here or by another peer', `node ${n} is not the peer's to claim`);
    }
    c.nodes = new Set(nodes);
    for (const n of nodes) {
      this.#remote.set(n, handle);
      this.#lost.delete(n);
    }
    this.#exchangeHandle ??= handle;
    // Proven: the rest of its receives (one until now, for the hello).
    this.#fi.fabricLimits(handle, { posted: POSTED_RECEIVES });
    // Tell the peer its hello was taken (at once: its connect waits for it).
    this.#send(handle, [encodePing()]);
    for (const w of [...this.#nodeWatchers]) w();
    this.#updateFull();
  }

  // A connection request on the listener: accepted unless every peer this transport may have
  // is connected, or as many connections as it lets wait for their hello already do. One refused
  // is rejected in libfabric's connection manager: no endpoint parses anything of that peer's.
  #admit(address: string): boolean {
    const waiting = [...this.#conns.values()].filter((c) => c.accepted && !c.nodes).length;
    const reason = this.#full
      ? 'a connection request while every peer is connected'
      : waiting >= this.#limits.maxWaiting
        ? 'a connection request beyond limits.maxWaiting'
        : undefined;
    if (reason) {
      this.#refuse(reason);
      return false;
    }
    this.#requestAddress = address;
    return true;
  }

  // Every peer this transport may have is connected (limits.maxPeers bound, or all of `peers`):
  // nothing else may wait, connected or bare, until one of them goes.
  #updateFull(): void {
    const bound = [...this.#conns.values()].filter((c) => c.nodes).length;
    const full = bound >= this.#limits.maxPeers || (this.#peers !== undefined && [...this.#peers].every((n) => this.#remote.has(n)));
    if (full === this.#full || this.#listener === undefined) return;
    this.#full = full;
    this.#fi.fabricLimits(this.#listener, { maxBare: full ? 0 : this.#limits.maxWaiting });
    if (!full) return;
    for (const [h, c] of [...this.#conns]) {
      if (!c.accepted || c.nodes) continue;
      this.#refuse('a connection waiting for its hello while every peer is connected');
      this.#onDown(h, fabricError('every peer of this side is connected', 'ECONNREFUSED'), true);
    }
  }

  // A connection this side dialled (connect, connectPeer): it waits for the peer's hello.
  #dialled(handle: number): void {
    this.#conns.set(handle, newConn(false, ''));
    this.#fi.fabricLimits(handle, { maxSlots: this.#limits.maxSlots, maxPending: this.#limits.maxUnsentBytes });
    this.#fi.fabricProgress(handle, this.#progress);
  }

  #onReady(handle: number, c: Conn): void {
    c.ready = true;
    for (const w of this.#peerWaiters.splice(0)) w.resolve();
    this.#dialing.get(handle)?.resolve();
  }

  #refuse(reason: string): void {
    this.#stats.refused++;
    // A malformed frame's reason names the value it had: reasons are kept up to a count, so
    // a peer cannot make the table grow without bound; the rest are counted together.
    const by = this.#stats.refusedBy;
    const key = reason in by || Object.keys(by).length < MAX_REASONS ? reason : OTHER_REASONS;
    by[key] = (by[key] ?? 0) + 1;
  }

  #refuseRdma(syndrome: string): void {
    this.#stats.rdmaRefused++;
    this.#stats.rdmaRefusedBy[syndrome] = (this.#stats.rdmaRefusedBy[syndrome] ?? 0) + 1;
  }

  // A connection went down (or was cut: `refused`, already counted).
  #onDown(handle: number, err: Error | undefined, refused = false): void {
    this.#heard.delete(handle);
    this.#pending.delete(handle);
    const c = this.#conns.get(handle);
    if (c) this.#dropChunks(c);
    const lost = [...(c?.nodes ?? [])];
    if (this.#conns.has(handle)) {
      this.#closeConn(handle);
      this.#conns.delete(handle);
    }
    if (!c?.nodes) {
      // Before the hello. A client's one connection failed to connect; a server's accepted
      // connection closed without saying who it is: refused, and the server listens on.
      const dial = this.#dialing.get(handle);
      if (dial) dial.reject(err ?? fabricError('the peer closed the connection', 'ECONNRESET'));
      else if (this.#listener === undefined) {
        const e = err ?? fabricError('the peer closed the connection', 'ECONNRESET');
        for (const w of this.#peerWaiters.splice(0)) w.reject(e);
      } else if (c && !refused) this.#refuse('a connection closed before its hello');
      return;
    }
    const gone = fabricError(`the peer went away: ${err?.message ?? 'its connection shut down'}`, (err as { code?: string })?.code ?? 'ECONNRESET');
    // Its hello was taken but ours not yet (the peer refused it, or went before): whoever waits
    // for the connection to be ready hears why.
    if (!c.ready) {
      this.#dialing.get(handle)?.reject(gone);
      if (this.#listener === undefined) for (const w of this.#peerWaiters.splice(0)) w.reject(gone);
    }
    for (const n of lost) {
      this.#remote.delete(n);
      this.#lost.add(n);
      this.#tellLost(n, gone);
    }
    // What waits on the exchange's peer ends with it: exchanges, and stall mode's writes (their
    // delivery can never be confirmed). Another peer's loss is that peer's alone.
    if (handle === this.#exchangeHandle) {
      this.#exchangeHandle = [...this.#conns].find(([, x]) => x.nodes)?.[0];
      for (const w of this.#exchangeWaiters.splice(0)) w.fail(gone);
      for (const w of this.#rma.writes.values()) w.reject(gone);
      this.#rma.writes.clear();
    }
    for (const w of [...this.#nodeWatchers]) w();
    this.#updateFull();
  }
}

/** A frame a peer may not send (where it is, or from whom): refused, as a malformed one is. */
class RefusedError extends Error {}

/** A frame past one of the transport's limits: refused, and its connection cut (the peer learns it went too far). */
class LimitError extends RefusedError {}

function newConn(accepted: boolean, address: string): Conn {
  return {
    nodes: undefined,
    accepted,
    address,
    since: performance.now(),
    ready: false,
    chunks: [],
    chunkBytes: 0,
    chunkTotal: 0,
    slots: [],
    holds: [],
    out: undefined,
    due: false,
  };
}

// The address part of "ADDRESS:PORT" (IPv6 addresses have colons of their own).
function hostOf(address: string): string {
  return address.slice(0, Math.max(0, address.lastIndexOf(':')));
}

// Whether a hello's token is this side's (compared in constant time, as digests of one length).
function sameToken(mine: Buffer, theirs: Uint8Array | undefined): boolean {
  if (!theirs) return false;
  const digest = (b: Uint8Array) => createHash('sha256').update(b).digest();
  return timingSafeEqual(digest(mine), digest(theirs));
}
