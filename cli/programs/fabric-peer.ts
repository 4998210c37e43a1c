// Two processes, one RDMA node each, joined by libfabric (the way ibv_rc_pingpong and
// perftest run: a server in one terminal, a client in another, possibly on another host).
// The server hosts node 1 and listens; the client hosts node 0 and connects; they swap the
// run's parameters, then QP numbers, PSNs, buffer addresses and rkeys, as rc_pingpong does
// over its socket. Buffers are memfd-backed (shared) so that evicting them (MADV_DONTNEED)
// keeps the bytes: every fault is genuine and the payload can still be verified.
//   send:  ping-pong, each side evicts its buffer before every message (faults at both ends)
//   write: the writer evicts its source before every write; the target's buffer starts evicted
//   read:  the reader evicts its sink before every read; the target's buffer starts evicted
//   atomic: the client's FETCH_AND_ADD 1 (or CMP_AND_SWAP i → i+1) on the server's first 8
//          bytes, its 8-byte sink evicted before each; the server's buffer starts evicted.
//          Iteration i must return i, and the server's word ends at the count.
// Writes and reads run on `qps` lanes (perftest -q), each a QP with its own slot of both
// buffers (out: what it sends or lets be read; in: what the peer writes or it reads into),
// up to `txDepth` WRs in flight on each (-t); -b: both sides stream at once. A run ends after
// `iters` WRs per lane, or `durationS` seconds (-D), or never (--run_infinitely) until the
// caller's signal stops it. Each side then says it is done (its error and count per lane), and
// the target verifies what was written. The other side lost (its connection shut, or silent
// past the transport's peer timeout) ends every wait at once, with `lost` naming it.
// Stall mode (faultModel 'stall', write and read): the client's writes are libfabric RMA writes
// straight into the server's buffer, its reads RMA reads of it; the buffer is anonymous memory
// registered on the server's userfaultfd; with --evict the server evicts it before each write
// or read (the client asks). The server's provider places and reads them on a native progress
// thread; one that meets a missing page blocks that thread in a genuine fault, which the
// server's SMMU stalls and its fault library resolves (netlink, CMD_RESUME): the JS thread
// serving the fault is never the one blocked. An evicted anonymous page comes back zero-filled:
// a read after --evict reads zeros, and is checked against them.
import { randomInt } from 'node:crypto';
import type { FaultModel, SimNode } from '../../kernel-sim/index.js';
import {
  Access,
  AdviseMrAdvice,
  AdviseMrFlags,
  Cluster,
  LibfabricTransport,
  mapRegion,
  peerTimeoutMs,
  PHASES,
  type FabricSendStats,
  type ProgressMode,
  type ProgressStats,
  QP_DEFAULTS,
  QpExSendOps,
  QpState,
  QueuePairEx,
  SendFlags,
  SIZE_MAX,
  WcStatus,
  wcStatusStr,
  WrOpcode,
  type ChromeTraceEvent,
  type CompletionQueue,
  type FaultStatsSnapshot,
  type LibfabricProvider,
  type PolicyName,
  type QueuePair,
  type Region,
  type Fault,
  type Phase,
  type SendWr,
  type WorkCompletion,
  Userfaultfd,
} from '../../lib/index.js';
import { MAX_MSG } from '../../lib/verbs/requester.js';
import { big, bool, checkBody, finite, gidText, int, list, oneOf, PeerRefusal, record, text, type Check } from './fabric-bodies.js';
import type { TraceFile } from './support/trace-file.js';

export { MAX_MSG };

export type FabricOp = 'send' | 'write' | 'read' | 'atomic';

/** perftest's -A: the atomic operation of an 'atomic' run. */
export type AtomicType = 'FETCH_AND_ADD' | 'CMP_AND_SWAP';

/** What the client decides and the server adopts. */
export interface RunParams {
  op: FabricOp;
  size: number;
  iters: number;
  evict: boolean;
  odp: boolean;
  policy: PolicyName;
  /** 'terminate' (the default): engine packets, faults NACKed; 'stall': libfabric RMA writes that block in the target's faults. */
  faultModel?: FaultModel;
  /** perftest's -a: every size from 2 to 2^23 bytes (powers of two), `iters` each; `size` is then ignored. */
  all?: boolean;
  /** The 'atomic' op's operation (default FETCH_AND_ADD). */
  atomicType?: AtomicType;
  /** perftest's -D: each size runs this many seconds instead of `iters` WRs per lane. */
  durationS?: number;
  /** perftest's --run_infinitely: run until the caller's signal, a report every `durationS` seconds. */
  infinite?: boolean;
  /** perftest's -t: WRs in flight on each lane (default 1). */
  txDepth?: number;
  /** perftest's -q: lanes, each a QP with its own slot of the buffers (default 1). */
  qps?: number;
  /** perftest's -b: both sides write (or read) at once. */
  bidirectional?: boolean;
  /** ibv_rc_pingpong's -O: one implicit ODP MR (address 0, length SIZE_MAX) covers the buffer. */
  implicitOdp?: boolean;
  /** ibv_rc_pingpong's -P: prefetch the buffer (ibv_advise_mr PREFETCH, FLUSH) once registered. */
  prefetch?: boolean;
  /** ibv_rc_pingpong's -r: receives posted ahead (send; default 500). */
  rxDepth?: number;
  /** The path MTU set on the QPs at RTR (-m; default 1024, libibverbs' default). */
  mtu?: number;
  /** ibv_rc_pingpong's -e: sleep on a completion channel (ibv_req_notify_cq, ibv_get_cq_event) instead of waiting on the CQ. */
  events?: boolean;
  /** The client wants the server's fault trace too (--trace). */
  trace?: boolean;
  /**
   * WRs each lane runs untimed before the measured ones (the JIT compiled, the caches and the
   * fault library's tables warm), as perftest's bandwidth tests and this project's benchmarks
   * warm up; their bytes are verified like the others'. Both sides run them (a ping-pong's
   * server answers them). Default 0 here; the programs ask for theirs.
   */
  warmUp?: number;
  /** perftest's -l: WRs posted in one postSend call (a list of `postList`); default 1. */
  postList?: number;
  /** perftest's -Q: every `cqMod`-th WR of a lane asks for a completion (SIGNALED), the others complete with it; default 1. */
  cqMod?: number;
}

/** perftest's -a sizes: 2, 4, … 2^23 bytes. */
export const ALL_SIZES: readonly number[] = Array.from({ length: 23 }, (_, i) => 2 ** (i + 1));

/** The message sizes a run goes through, in order. */
export function runSizes(p: RunParams): number[] {
  return p.all ? [...ALL_SIZES] : [p.size];
}

/** One message size's measurements (or one period's, with --run_infinitely). */
export interface SizeRun {
  size: number;
  /** WRs completed (ping-pong: round trips). */
  iterations: number;
  /** Round trip (send) or post-to-completion time (write, read, atomic) of each WR, µs (measured). */
  realUs: number[];
  /** When each WR completed, µs since the run (or period) began, in completion order. */
  doneUs: number[];
  seconds: number;
}

export interface PeerOptions extends RunParams {
  /** Client: the server's host; absent: run the server. */
  host?: string | undefined;
  port: number;
  /**
   * The program both sides run (rc-pingpong, write-bw, …): the client names it in its hello
   * body, and a server running another refuses it (both end, naming the two).
   */
  program?: string;
  /** A secret both sides are given (the transport's token): a peer whose hello lacks it is refused. */
  token?: string;
  /** How this side waits for an answer it expects (the transport's progress mode; each side its own). */
  progress?: ProgressMode;
  /** The longest poll for an answer before sleeping, µs (the transport's maxSpinUs). */
  maxSpinUs?: number;
  /** Server: the most it lets a client ask of it (ServerLimits; each has a default). */
  limits?: Partial<ServerLimits>;
  /** Server: the address to listen on (default 127.0.0.1, this host only; 0.0.0.0: every interface). */
  bind?: string;
  provider?: LibfabricProvider;
  /** Server: told the port it listens on (useful with port 0). */
  onListening?: (port: number) => void;
  /** Told each lane's local and remote QP numbers, PSNs, addresses and keys once they are swapped, and the run's parameters. */
  onConnected?: (local: Endpoint[], remote: Endpoint[], params: RunParams) => void;
  /** --run_infinitely: told each period's measurements as it ends. */
  onPeriod?: (run: SizeRun) => void;
  /** Stops the run (no new WRs; those in flight complete): --run_infinitely's SIGINT. */
  signal?: AbortSignal;
  /** --trace: this side's faults go here, and the client's gets the server's too. */
  traceFile?: TraceFile;
  /** This side's GID (the CLI's -x / -g picks it from the port's table), sent with its QPs; each side picks its own. */
  gid?: string;
  /** perftest's -u: this side's QPs' local ACK timeout (4.096 µs × 2^timeout; default QP_TIMEOUT); each side sets its own. */
  qpTimeout?: number;
  /** perftest's --latency_gap: µs this side waits before each WR it posts (a latency test's gap between messages). */
  latencyGapUs?: number;
  /** ibv_rc_pingpong's -N: this side posts its SENDs with the new send API (an extended QP's ibv_wr_start, ibv_wr_send, ibv_wr_complete). */
  newSend?: boolean;
  /**
   * Server: the run parameters its own command line set (perftest's rule: both sides are started
   * with the same options); a client asking for another value of one is refused, the option named.
   */
  expect?: Array<{ key: keyof RunParams; value: RunParams[keyof RunParams]; flag: string }>;
}

/**
 * The most a server lets a client's run ask of it (the client decides the run, the server
 * adopts it, so it bounds what it adopts): a client asking for more is refused, the limit
 * named. The programs' --max-msg, --max-qps and --max-memory.
 */
export interface ServerLimits {
  /** The largest message, bytes. */
  maxSize: number;
  /** QPs (lanes). */
  maxQps: number;
  /** Bytes of the server's buffer (QPs × 2 slots of the largest message). */
  maxMemory: number;
}

/** What a server takes unless told otherwise: 1 GiB messages, perftest's 256 QPs, 2 GiB of buffer (one QP of 1 GiB messages). */
export const DEFAULT_SERVER_LIMITS: Readonly<ServerLimits> = Object.freeze({ maxSize: 2 ** 30, maxQps: 256, maxMemory: 2 ** 31 });

/** One lane's QP as the other side needs it (rc_pingpong's "local address" line). */
export interface Endpoint {
  node: number;
  qpn: number;
  /** The PSN the QP starts from (its sq_psn; the peer's rq_psn). */
  psn: number;
  /** The lane's slot pair: out at addr, in at addr + slot. */
  addr: bigint;
  rkey: number;
  /** The GID at the side's GID index (-x, -g), as rc_pingpong and perftest swap it; absent: the side has no GID there. */
  gid?: string;
}

export interface PeerResult {
  role: 'server' | 'client';
  params: RunParams;
  provider: LibfabricProvider;
  /** Bytes compared with what the other side wrote or sent (all must match). */
  bytesVerified: number;
  mismatches: number;
  /** The first failed work completion's status string (the run stops there). */
  error?: string;
  /** The other side went away before the run's end: who, and why. */
  lost?: string;
  /** The other side's first failed work completion, as it said in its final word. */
  peerError?: string;
  /** The run was stopped by the caller's signal (--run_infinitely's SIGINT), here or on the other side. */
  stopped?: boolean;
  faults: { source: number; destination: number };
  retransmitted: number;
  /** NACKs this node's engine received (destination faults of the transfers it sent). */
  nacks: number;
  /** The measured cost of this side's faults (its fault library's timeline of each). */
  faultTime: FaultTime;
  /** --evict: µs this side spent dropping its buffer's pages. */
  evictUs: number;
  /** Each size's measurements (one size unless -a; one per period with --run_infinitely), in order: of this side's own WRs (both sides' for send). */
  runs: SizeRun[];
  /** -b: the other side's runs, as it reported them at the end. */
  peerRuns?: SizeRun[];
  /** The server's own counters, as it reported them at the end (client only). */
  peer?: { bytesVerified: number; mismatches: number; nacks: number; stall?: StallReport; faultTime?: FaultTime; evictUs?: number; cpuUs?: number };
  /** Stall mode, server side: which thread blocked in the faults and who resolved them. */
  stall?: StallReport;
  /** Frames and connections the transport refused (malformed, before a hello, a node not the connection's, past a limit). */
  refused: number;
  /** CPU this process used from the handshake to the end (every thread), µs: `cpuUs / iterations` is the CPU per message. */
  cpuUs?: number;
  /** How this side's connection waited for the answers it expected (its progress mode, polls, their CPU). */
  progress?: ProgressStats;
  /** How this side's write payloads past the batch were sent: from their pages (lent) or copied (transport.sendStats()). */
  sends?: FabricSendStats;
  /** The same, by reason. */
  refusedBy: Record<string, number>;
  /**
   * RDMA-level refusals: the NAKs this side's node sent the other (by syndrome: ACCESS_ERR,
   * DROPPED, INV_REQ, …) and the answers its engine refused as answering nothing it sent
   * ('answer for nothing').
   */
  rdmaRefused: Record<string, number>;
  /** -e: completion events this side slept on (each acknowledged). */
  cqEvents?: number;
}

/**
 * What a side's faults cost, measured: the faults its fault library resolved and the sum, over
 * the phases of their timelines (detection, notification, resolution, retransmission), of each
 * phase's measured time. `totalUs / faults` is the cost of one fault.
 */
export interface FaultTime {
  faults: number;
  totalUs: number;
  /** The mean of each phase, µs. */
  phasesUs: Record<Phase, number>;
}

/** A side's fault time from its fault library's statistics. */
export function faultTime(s: FaultStatsSnapshot): FaultTime {
  const phasesUs = Object.fromEntries(PHASES.map((p) => [p, s.phases.real[p].mean])) as Record<Phase, number>;
  const totalUs = PHASES.reduce((t, p) => t + s.phases.real[p].mean * s.phases.real[p].count, 0);
  return { faults: s.faults.source + s.faults.destination, totalUs, phasesUs };
}

export interface StallReport {
  /** The native thread that progresses the RMA connection (places the peer's writes). */
  progressTid: number;
  /** The JavaScript thread (serves the userfaultfd, runs the fault library). */
  jsTid: number;
  /** Distinct threads that faulted on the buffer, and how the faults were resolved. */
  faultTids: number[];
  faultsByHandler: number;
  faultsNative: number;
  /** Stalls the SMMU recorded, and faults the fault library resolved (destination side). */
  smmuStalls: number;
  libraryFaults: number;
  /** Pages the writes found evicted (--evict: the server evicts its buffer before each write). */
  pagesTouched: number;
}

const CLIENT = 0;
const SERVER = 1;
/**
 * The QPs' local ACK timeout between processes (268 ms; 14, the in-process default, gives
 * 67 ms, which a loaded machine's scheduling pauses can exceed). A peer silent for this times
 * retry_cnt + 1 is lost: its work requests end with RETRY_EXC_ERR.
 */
export const QP_TIMEOUT = 16;
export const PEER_TIMEOUT_MS = peerTimeoutMs(QP_TIMEOUT, QP_DEFAULTS.retryCnt);
/** The longest a wait for the other side's final word may take (a run can last as long as it is asked to). */
const FOREVER_MS = 2 ** 31 - 1;
/** The client's run and the server's answer to it: each side is ready to send it at once. */
const HANDSHAKE_MS = 30_000;
/** rc_pingpong's receives posted ahead. */
export const DEFAULT_RX_DEPTH = 500;
/** The path MTUs a QP takes (IBV_MTU_256 … IBV_MTU_4096). */
export const MTUS: readonly number[] = [256, 512, 1024, 2048, 4096];

// The byte at `i` of iteration `it`'s payload from `who` (c: client, s: server) repeats every
// 256 bytes, so a payload is its first period copied by doubling (memcpy speed), and checked
// a MiB at a time (memcmp). Past YIELD_BYTES the work yields to the event loop between slices:
// a GiB payload takes seconds (first touches allocate its pages), and a thread that sends no
// keepalive for the peer timeout counts as lost on the other side.
const PERIOD = 256;
const YIELD_BYTES = 32 << 20;

function periodOf(it: number, who: 'c' | 's'): Uint8Array {
  const k = who === 'c' ? 17 : 29;
  const p = new Uint8Array(PERIOD);
  for (let i = 0; i < PERIOD; i++) p[i] = (i * k + it * 7 + 1) & 0xff;
  return p;
}

const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

async function pattern(buf: Uint8Array, len: number, it: number, who: 'c' | 's'): Promise<void> {
  const p = periodOf(it, who);
  buf.set(p.subarray(0, Math.min(len, PERIOD)));
  let n = PERIOD;
  for (; n < len && n < YIELD_BYTES; n *= 2) buf.copyWithin(n, 0, Math.min(n, len - n));
  for (; n < len; n += YIELD_BYTES) {
    await turn();
    buf.copyWithin(n, 0, Math.min(YIELD_BYTES, len - n));
  }
}

/** Bytes of buf[0, len) that differ from `who`'s iteration `it` payload. */
async function compare(buf: Uint8Array, len: number, it: number, who: 'c' | 's'): Promise<number> {
  const chunk = Math.min(len, 1 << 20);
  const want = Buffer.alloc(Math.ceil(chunk / PERIOD) * PERIOD);
  await pattern(want, want.length, it, who);
  let bad = 0;
  for (let at = 0; at < len; at += chunk) {
    if (at % YIELD_BYTES === 0 && at > 0) await turn();
    const n = Math.min(chunk, len - at);
    const got = Buffer.from(buf.buffer, buf.byteOffset + at, n);
    if (got.equals(want.subarray(0, n))) continue;
    for (let i = 0; i < n; i++) if (got[i] !== want[i]) bad++;
  }
  return bad;
}

/** A completion may take this long: 30 s, plus a second per 10 MB of message (a 2 GiB write on a loaded machine). */
function completionTimeoutMs(size: number): number {
  return 30_000 + Math.ceil(size / 10_000);
}

/** A 24-bit starting PSN, as rc_pingpong and perftest draw theirs (lrand48() & 0xffffff). */
export function newPsn(): number {
  return randomInt(0, 0x100_0000);
}

export function connect(qp: QueuePair, local: Endpoint, remote: Endpoint, mtu: number, timeout = QP_TIMEOUT): void {
  qp.modify({
    qpState: QpState.INIT,
    portNum: 1,
    qpAccessFlags: Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC,
  });
  qp.modify({
    qpState: QpState.RTR,
    destQpNum: remote.qpn,
    destNode: remote.node,
    rqPsn: remote.psn,
    pathMtu: mtu,
    minRnrTimer: QP_DEFAULTS.minRnrTimer,
  });
  qp.modify({ qpState: QpState.RTS, sqPsn: local.psn, timeout, retryCnt: QP_DEFAULTS.retryCnt, rnrRetry: QP_DEFAULTS.rnrRetry });
}

/** A side's final word: its first error, and the WRs each of its lanes completed in the last size. */
interface Done {
  error?: string;
  counts: number[];
  /** -b: its runs, for the client's sum of both directions. */
  runs?: SizeRun[];
}

// A trace crosses as JSON text in pieces: an exchange carries at most 4096 items and 64 KiB a
// string (kernel-sim/fabric/exchange-codec.ts), and a server's trace has tens of thousands of events.
const TRACE_PIECE = 16_000; // characters: at most 48 KB of UTF-8
const TRACE_PIECES = 4096;

// ---- the shapes of what the sides swap (fabric-bodies.ts), each field as the programs make it ----

const COUNT = int(0, Number.MAX_SAFE_INTEGER);
const U64 = 2n ** 64n - 1n;
/** The longest error or refusal a side passes on. */
const MAX_REASON = 1024;

/** The run's parameters the client sends only when set (pickParams); the atomic type and trace are set apart. */
const OPTIONAL_PARAMS = [
  'faultModel',
  'all',
  'durationS',
  'infinite',
  'txDepth',
  'qps',
  'bidirectional',
  'implicitOdp',
  'prefetch',
  'rxDepth',
  'mtu',
  'events',
  'warmUp',
  'postList',
  'cqMod',
] as const;

const RUN_PARAMS: Check<RunParams> = record<RunParams>(
  {
    op: oneOf<FabricOp>(['send', 'write', 'read', 'atomic']),
    size: int(1, MAX_MSG),
    iters: int(1, Number.MAX_SAFE_INTEGER),
    evict: bool,
    odp: bool,
    // Pinning is not a policy these programs run (the CLI offers the others).
    policy: oneOf<PolicyName>(['touch', 'touch-ahead', 'prefetch', 'prefault']),
    faultModel: oneOf<FaultModel>(['terminate', 'stall']),
    all: bool,
    atomicType: oneOf<AtomicType>(['FETCH_AND_ADD', 'CMP_AND_SWAP']),
    durationS: int(1, 2 ** 31 - 1),
    infinite: bool,
    txDepth: int(1, 8192),
    qps: int(1, 256),
    bidirectional: bool,
    implicitOdp: bool,
    prefetch: bool,
    rxDepth: int(1, 1 << 16),
    mtu: oneOf(MTUS),
    events: bool,
    trace: bool,
    warmUp: int(0, 1 << 24),
    postList: int(1, 8192),
    cqMod: int(1, 8192),
  },
  [...OPTIONAL_PARAMS, 'atomicType', 'trace'],
);

/** The client's first word: the program it runs and the run it wants. */
interface Hello {
  program?: string;
  params: RunParams;
}
const HELLO: Check<Hello> = record<Hello>({ program: text(64), params: RUN_PARAMS }, ['program']);

/** The server's answer to it: the run is on, or refused (why). */
type Verdict = { accepted: true } | { refused: string };
const VERDICT: Check<Verdict> = (v, path) =>
  typeof v === 'object' && v !== null && 'refused' in v
    ? record<{ refused: string }>({ refused: text(MAX_REASON) })(v, path)
    : record<{ accepted: true }>({ accepted: oneOf([true as const]) })(v, path);

const endpoints = (node: number, lanes: number): Check<Endpoint[]> =>
  list(
    record<Endpoint>({ node: oneOf([node]), qpn: int(0, 0xffffff), psn: int(0, 0xffffff), addr: big(U64), rkey: int(0, 0xffffffff), gid: gidText }, [
      'gid',
    ]),
    lanes,
    lanes,
  );

const SIZE_RUN: Check<SizeRun> = record<SizeRun>({
  size: int(1, MAX_MSG),
  iterations: COUNT,
  realUs: list(finite(), 0, 1 << 16),
  doneUs: list(finite(), 0, 1 << 16),
  seconds: finite(),
});

const finalWord = (lanes: number, sizes: number): Check<Done> =>
  record<Done>({ error: text(MAX_REASON), counts: list(COUNT, lanes, lanes), runs: list(SIZE_RUN, 0, sizes) }, ['error', 'runs']);

const FAULT_TIME: Check<FaultTime> = record<FaultTime>({
  faults: COUNT,
  totalUs: finite(),
  phasesUs: record<Record<Phase, number>>(Object.fromEntries(PHASES.map((p) => [p, finite()])) as Record<Phase, Check<number>>),
});

const STALL_REPORT: Check<StallReport> = record<StallReport>({
  progressTid: int(0, 2 ** 31 - 1),
  jsTid: int(0, 2 ** 31 - 1),
  faultTids: list(int(0, 2 ** 31 - 1), 0, 4096),
  faultsByHandler: COUNT,
  faultsNative: COUNT,
  smmuStalls: COUNT,
  libraryFaults: COUNT,
  pagesTouched: COUNT,
});

/** A side's closing counters (and, to a client that asked, the server's trace in pieces). */
interface Report {
  bytesVerified: number;
  mismatches: number;
  nacks: number;
  faultTime: FaultTime;
  evictUs?: number;
  /** CPU the reporting process used from the handshake to its report (every thread), µs. */
  cpuUs?: number;
  stall?: StallReport;
  trace?: string[];
}
const REPORT: Check<Report> = record<Report>(
  {
    bytesVerified: COUNT,
    mismatches: COUNT,
    nacks: COUNT,
    faultTime: FAULT_TIME,
    evictUs: finite(),
    cpuUs: finite(),
    stall: STALL_REPORT,
    trace: list(text(TRACE_PIECE), 0, TRACE_PIECES),
  },
  ['evictUs', 'cpuUs', 'stall', 'trace'],
);

/**
 * What ends a run early: the other side lost (every wait ends), its final word (a ping-pong's
 * waits end: no answer will come; with --run_infinitely no new WRs either), or the caller's stop
 * (no new WRs). WRs in flight on a live peer are always waited for: their bytes are checked.
 */
class RunControl {
  lost: string | undefined;
  peerDone: Done | undefined;
  /** Set once the run's last exchange is over: a connection shut after that is the normal end. */
  over = false;
  readonly #lost = new AbortController();
  readonly #heard = new AbortController();
  readonly #stop: AbortSignal | undefined;
  readonly #infinite: () => boolean;
  /** -e: completion events slept on. */
  cqEvents = 0;

  constructor(transport: LibfabricTransport, peer: number, who: string, stop: AbortSignal | undefined, infinite: () => boolean) {
    this.#stop = stop;
    this.#infinite = infinite;
    // Only the other side's loss ends the run: anyone else who reached the port is not in it.
    transport.onPeerLost((node, reason) => {
      if (node !== peer || this.over || this.lost !== undefined) return;
      this.lost = `${who} went away: ${reason?.message.replace(/^the peer went away: /, '') ?? 'its connection shut down'}`;
      // A turn later: the WRs that waited on the peer complete first (RETRY_EXC_ERR, which the
      // run reports); only what would wait forever (a posted receive) is cut short.
      setImmediate(() => {
        this.#lost.abort();
        this.#heard.abort();
      });
    });
  }

  /** No new WRs: the peer is lost, or the caller stopped the run, or (--run_infinitely) the other side did. */
  get stopping(): boolean {
    return this.lost !== undefined || this.#stop?.aborted === true || (this.peerDone !== undefined && this.#infinite());
  }

  heard(d: Done): void {
    this.peerDone = d;
    this.#heard.abort();
  }

  /**
   * The next completion of `cq`, or undefined once the peer is lost (or, `answer`: a completion
   * that needs the other side to act, once it has said it is done).
   */
  async completion(cq: CompletionQueue, size: number, answer = false): Promise<WorkCompletion | undefined> {
    const signal = answer ? this.#heard.signal : this.#lost.signal;
    if (signal.aborted) return undefined;
    try {
      if (!cq.channel) return await cq.next({ timeoutMs: completionTimeoutMs(size), signal });
      // ibv_rc_pingpong -e: poll; when the CQ is empty, arm it and sleep on its channel.
      for (;;) {
        const [wc] = cq.poll(1);
        if (wc) return wc;
        cq.reqNotify();
        (await cq.channel.getCqEvent({ timeoutMs: completionTimeoutMs(size), signal })).ackEvents(1);
        this.cqEvents++;
      }
    } catch (e) {
      if (signal.aborted) return undefined;
      throw e;
    }
  }

  /** Resolves once the other side is lost or done, or the caller stopped the run (a passive side's wait). */
  idle(): Promise<void> {
    const signals = [this.#heard.signal, ...(this.#stop ? [this.#stop] : [])];
    if (signals.some((s) => s.aborted)) return Promise.resolve();
    return new Promise((resolve) => {
      for (const s of signals) s.addEventListener('abort', () => resolve(), { once: true });
    });
  }
}

/** One lane: a QP and where its WRs go, here and on the other side. */
interface Lane {
  qp: QueuePair;
  /** Offset of the lane's slot pair in this side's buffer. */
  offset: number;
  remote: Endpoint;
}

/** Run one side; resolves with its result (a failed work completion or a lost peer is reported in `error` / `lost`, not thrown). */
export async function runPeer(o: PeerOptions): Promise<PeerResult> {
  const role = o.host === undefined ? 'server' : 'client';
  const me = role === 'server' ? SERVER : CLIENT;
  const peer = role === 'server' ? CLIENT : SERVER;
  const provider = o.provider ?? 'tcp';
  // One other side, and only it: the server serves one client (every other connection request
  // is rejected once it is connected), and with a token only a side that has it.
  const common = {
    provider,
    peerTimeoutMs: PEER_TIMEOUT_MS,
    peers: [peer],
    ...(o.token !== undefined ? { token: o.token } : {}),
    ...(o.progress !== undefined ? { progress: o.progress } : {}),
    ...(o.maxSpinUs !== undefined ? { maxSpinUs: o.maxSpinUs } : {}),
  };
  let transport: LibfabricTransport;
  if (role === 'server') {
    transport = LibfabricTransport.listen({ ...common, port: o.port, localNodes: [SERVER], ...(o.bind !== undefined ? { host: o.bind } : {}) });
    o.onListening?.(transport.port);
    await transport.waitForPeer();
  } else {
    // The server's trace, if asked for, comes in one exchange larger than the default frame.
    const limits = o.traceFile ? { maxFrameBytes: 3 * TRACE_PIECE * TRACE_PIECES + (1 << 20) } : {};
    transport = await LibfabricTransport.connect({ ...common, host: o.host!, port: o.port, localNodes: [CLIENT], limits });
  }
  const who = role === 'server' ? `the client (node ${CLIENT})` : `the server (node ${SERVER} at ${o.host}:${o.port})`;
  let infinite = false;
  const ctl = new RunControl(transport, peer, who, o.signal, () => infinite);
  let cluster: Cluster | undefined;
  let buf: Region | undefined;
  try {
    const params = role === 'client' ? await askRun(transport, o, who) : await adoptRun(transport, o, who);
    const cpu0 = process.cpuUsage();
    infinite = params.infinite === true;
    // A server traces when asked to (its own --trace) or when the client asks for its faults.
    cluster = Cluster.create({ nodes: 2, transport, ...(o.traceFile || params.trace ? { trace: true } : {}) });
    if ((params.faultModel ?? 'terminate') === 'stall') {
      const r = await runStall(role, params, provider, transport, cluster, ctl, o, who, cpu0);
      countRefusals(r, transport, cluster.system.node(me), cpu0);
      return r;
    }
    const ctx = cluster.openDevice(me, { defaultPolicy: params.policy });
    const pd = ctx.allocPd();
    const sizes = runSizes(params);
    const largest = Math.max(...sizes);
    const slot = slotBytes(params);
    const lanes = laneCount(params);
    const depth = params.txDepth ?? 1;
    const rxDepth = params.op === 'send' ? (params.rxDepth ?? DEFAULT_RX_DEPTH) : 1;
    const cq = ctx.createCq(lanes * depth + rxDepth + 16, params.events ? { channel: ctx.createCompChannel() } : {});
    const bytes = lanes * 2 * slot;
    // QPs first, then the MR (the order rc_pingpong and perftest use).
    const init = { sendCq: cq, recvCq: cq, cap: { maxSendWr: depth, maxRecvWr: rxDepth } };
    const newSend = o.newSend === true && params.op === 'send';
    const qps = Array.from({ length: lanes }, () =>
      newSend ? ctx.createQpEx(pd, { ...init, sendOpsFlags: QpExSendOps.WITH_SEND }) : ctx.createQp(pd, init),
    );
    // A ping-pong's SEND: posted as a WR, or (-N) built with the ibv_wr_* calls of an extended QP.
    const postSendOne = (qp: QueuePair, wrId: bigint, sge: { addr: bigint; length: number; lkey: number }) => {
      if (!(qp instanceof QueuePairEx)) return qp.postSend({ wrId, opcode: WrOpcode.SEND, sgList: [sge], sendFlags: SendFlags.SIGNALED });
      qp.wrStart();
      qp.wrId = wrId;
      qp.wrFlags = SendFlags.SIGNALED;
      qp.wrSend();
      qp.wrSetSge(sge.lkey, sge.addr, sge.length);
      qp.wrComplete();
    };
    const region = (buf = mapRegion(bytes, { shared: true }));
    const view = new Uint8Array(region.buffer);
    const odp = params.odp || params.implicitOdp ? Access.ON_DEMAND : 0;
    const access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC | odp;
    const mr = params.implicitOdp ? ctx.regMr(pd, null, 0, SIZE_MAX, access) : ctx.regMr(pd, buf, 0, bytes, access, { policy: params.policy });
    if (params.prefetch)
      await ctx.adviseMr(pd, AdviseMrAdvice.PREFETCH, AdviseMrFlags.FLUSH, [{ addr: region.address, length: bytes, lkey: mr.lkey }]);
    const local = qps.map((qp, k): Endpoint => ({
      node: me,
      qpn: qp.qpNum,
      psn: newPsn(),
      addr: region.address + BigInt(k * 2 * slot),
      rkey: mr.rkey,
      ...(o.gid !== undefined ? { gid: o.gid } : {}),
    }));
    // Long waits: the other side may be pinning or filling a large buffer (its loss ends them).
    const remote = checkBody(endpoints(peer, lanes), await transport.exchange(local, FOREVER_MS), who, 'list of QPs');
    const mtu = params.mtu ?? QP_DEFAULTS.pathMtu;
    qps.forEach((qp, k) => connect(qp, local[k]!, remote[k]!, mtu, o.qpTimeout));
    o.onConnected?.(local, remote, params);
    const lane = qps.map((qp, k): Lane => ({ qp, offset: k * 2 * slot, remote: remote[k]! }));
    const r = emptyResult(role, params, provider);
    const mine = role === 'client' ? 'c' : 's';
    const theirsWho = role === 'client' ? 's' : 'c';
    const count = (wc: WorkCompletion) => {
      if (wc.status !== WcStatus.SUCCESS) r.error ??= `${wc.statusStr} (${WcStatus[wc.status]})`;
      if (wc.odp) {
        r.faults.source += wc.odp.faults.source;
        r.faults.destination += wc.odp.faults.destination;
        r.retransmitted += wc.odp.retransmittedBlocks;
      }
      return wc.status === WcStatus.SUCCESS;
    };
    // --evict in a run: the buffer's pages dropped (the faults' cause), timed (a cost of the run
    // that is neither its faults nor its path).
    const evict = () => {
      const t0 = performance.now();
      region.unmapPages();
      r.evictUs += (performance.now() - t0) * 1000;
    };
    // Who streams: both sides ping-pong; the client writes, reads or does atomics, and with -b
    // the server writes or reads too. A read's target fills its out slots first; with --evict a
    // target's buffer starts evicted, so the first write or read faults there.
    const streams = params.op === 'send' || role === 'client' || (params.bidirectional === true && params.op !== 'atomic');
    const target = params.op !== 'send' && (role === 'server' || params.bidirectional === true);
    if (target && params.op === 'read') for (const l of lane) await pattern(view.subarray(l.offset), largest, 0, mine);
    if (params.evict) region.unmapPages();
    checkBody(oneOf(['ready']), await transport.exchange('ready', FOREVER_MS), who, 'word that it is ready');
    // The other side's final word (nothing else comes after 'ready'); its loss is the watch's.
    // A malformed one ends what waits on it, then the run, naming the field.
    let malformed: Error | undefined;
    const peerDone = transport.receive(FOREVER_MS).then(
      (d) => {
        try {
          ctl.heard(checkBody(finalWord(lanes, sizes.length), d, who, 'final word'));
        } catch (e) {
          malformed = e as Error;
          ctl.heard({ counts: lane.map(() => 0), error: malformed.message });
        }
      },
      () => undefined,
    );
    let counts = lane.map(() => 0);
    if (streams) {
      for (const size of sizes) {
        if (r.error || ctl.stopping) break;
        counts = params.op === 'send' ? [await pingpong(size)] : await stream(size);
      }
    } else await ctl.idle();
    // Say done (this side's error and counts), then hear the other side's.
    const done: Done = { counts, ...(r.error ? { error: r.error } : {}), ...(params.bidirectional ? { runs: r.runs } : {}) };
    try {
      transport.post(done);
    } catch {
      // Gone already: the watch says so.
    }
    await peerDone;
    if (malformed) throw malformed;
    if (ctl.lost) r.lost = ctl.lost;
    const theirDone = ctl.peerDone;
    if (theirDone?.error) r.peerError = theirDone.error;
    if (theirDone?.runs) r.peerRuns = theirDone.runs;
    if (o.signal?.aborted || (params.infinite && theirDone && !r.lost)) r.stopped = true;
    r.nacks = cluster.system.node(me).pldma.counters().nacksReceived;
    if (params.events) r.cqEvents = ctl.cqEvents;
    // A target checks what was written into its buffer once the writer is done (not before:
    // reading it would make its pages resident): each lane's slot holds its last write.
    if (target && theirDone && !theirDone.error && !r.error && !r.lost) {
      for (const [k, l] of lane.entries()) {
        const n = theirDone.counts[k] ?? 0;
        if (n === 0) continue;
        if (params.op === 'write') {
          r.mismatches += await compare(view.subarray(l.offset + slot), largest, n - 1, theirsWho);
          r.bytesVerified += largest;
        } else if (params.op === 'atomic') {
          if (new DataView(region.buffer).getBigUint64(l.offset + slot, true) !== BigInt(n)) r.mismatches += 8;
          r.bytesVerified += 8;
        }
      }
    }
    // Counters (and the server's trace, if the client asked) close the run.
    const traced = role === 'server' && params.trace ? packTrace(ctx.faultLibrary.exportChromeTrace().traceEvents) : undefined;
    r.faultTime = faultTime(ctx.faultLibrary.stats());
    const report = {
      bytesVerified: r.bytesVerified,
      mismatches: r.mismatches,
      nacks: r.nacks,
      faultTime: r.faultTime,
      evictUs: r.evictUs,
      cpuUs: cpuSince(cpu0),
      ...(traced ? { trace: traced } : {}),
    };
    const heard = r.lost
      ? undefined
      : await transport.exchange(report satisfies Report, 30_000 + (traced ? traced.length : 0)).catch(() => undefined);
    ctl.over = true;
    const theirs = heard === undefined ? undefined : checkBody(REPORT, heard, who, 'closing counters');
    if (role === 'client' && theirs) {
      const { trace, stall: _stall, ...counters } = theirs;
      r.peer = counters;
      if (trace && o.traceFile) addPeerTrace(o.traceFile, trace);
    }
    o.traceFile?.addContexts([ctx], role === 'client' && params.trace ? 'client' : undefined);
    countRefusals(r, transport, cluster.system.node(me), cpu0);
    return r;

    // Ping-pong of one size (both sides); rc_pingpong keeps `rxDepth` receives posted ahead,
    // each as long as the buffer. Returns the round trips done.
    async function pingpong(size: number): Promise<number> {
      const qp = qps[0]!;
      const run = newRun(size);
      r.runs.push(run);
      const sge = [{ addr: region.address, length: size, lkey: mr.lkey }];
      const recvSge = [{ addr: region.address, length: slot, lkey: mr.lkey }];
      const fixed = params.durationS === undefined && !params.infinite;
      let posted = 0;
      const postRecv = () => {
        if (fixed && posted >= (params.warmUp ?? 0) + params.iters) return;
        qp.postRecv({ wrId: BigInt(posted++), sgList: recvSge });
      };
      for (let i = 0; i < rxDepth; i++) postRecv();
      // Receives consumed are posted again in the next iteration, after its eviction.
      let owed = 0;
      const repost = () => {
        for (; owed > 0; owed--) postRecv();
      };
      const clock = newClock(run);
      let it = 0;
      for (; clock.more(it) && !r.error; it++) {
        const t = performance.now();
        if (role === 'client') {
          await pattern(view, size, it, 'c');
          if (params.evict) evict();
          repost();
          await gap();
          postSendOne(qp, BigInt(it), sge[0]!);
          let got = 0;
          for (; got < 2 && !r.error; got++) {
            const wc = await ctl.completion(cq, size, true);
            if (!wc) break;
            count(wc);
          }
          if (got < 2 || r.error) break;
          r.mismatches += await compare(view, size, it, 's');
          r.bytesVerified += size;
        } else {
          if (params.evict && it > 0) evict();
          repost();
          const wc = await ctl.completion(cq, size, true);
          if (!wc || !count(wc)) break;
          r.mismatches += await compare(view, size, it, 'c');
          r.bytesVerified += size;
          await pattern(view, size, it, 's');
          if (params.evict) evict();
          await gap();
          postSendOne(qp, BigInt(it), sge[0]!);
          const sent = await ctl.completion(cq, size);
          if (!sent || !count(sent)) break;
        }
        owed++;
        clock.record(t);
      }
      clock.end();
      return clock.total;
    }

    // Writes, reads or atomics of one size on every lane, up to `depth` in flight on each,
    // posted `postList` at a time, every `cqMod`-th SIGNALED (the unsignaled ones before it
    // complete with it). Returns the WRs each lane completed.
    async function stream(size: number): Promise<number[]> {
      const run = newRun(size);
      r.runs.push(run);
      const clock = newClock(run);
      const done = lane.map(() => 0);
      const next = lane.map(() => 0);
      // Each lane's WRs in flight, oldest first: a completion covers its own and the unsignaled ones before it.
      const queue = lane.map((): Array<{ id: bigint; it: number; t: number; signaled: boolean }> => []);
      const laneOf = new Map<bigint, number>();
      let wrId = 0n;
      const cas = params.atomicType === 'CMP_AND_SWAP';
      const cqMod = params.cqMod ?? 1;
      const postList = params.postList ?? 1;
      const wr = async (k: number, signaled: boolean): Promise<SendWr> => {
        const l = lane[k]!;
        const it = next[k]!++;
        const out = view.subarray(l.offset);
        if (params.op === 'write') await pattern(out, size, it, mine);
        // The WR's own local slot: the write's source, the read's sink (in), the atomic's 8 bytes.
        const at = params.op === 'read' ? l.offset + slot : l.offset;
        if (params.evict) evict();
        const sge = { addr: region.address + BigInt(at), length: params.op === 'atomic' ? 8 : size, lkey: mr.lkey };
        const id = wrId++;
        await gap();
        queue[k]!.push({ id, it, t: performance.now(), signaled });
        laneOf.set(id, k);
        const sendFlags = signaled ? SendFlags.SIGNALED : 0;
        if (params.op === 'atomic')
          return {
            wrId: id,
            opcode: cas ? WrOpcode.ATOMIC_CMP_AND_SWP : WrOpcode.ATOMIC_FETCH_AND_ADD,
            sgList: [sge],
            sendFlags,
            atomic: cas
              ? { remoteAddr: l.remote.addr + BigInt(slot), rkey: l.remote.rkey, compareAdd: BigInt(it), swap: BigInt(it + 1) }
              : { remoteAddr: l.remote.addr + BigInt(slot), rkey: l.remote.rkey, compareAdd: 1n },
          };
        // A write lands in the peer's in slot; a read takes the peer's out slot.
        const remoteAddr = l.remote.addr + BigInt(params.op === 'write' ? slot : 0);
        return {
          wrId: id,
          opcode: params.op === 'write' ? WrOpcode.RDMA_WRITE : WrOpcode.RDMA_READ,
          sgList: [sge],
          sendFlags,
          rdma: { remoteAddr, rkey: l.remote.rkey },
        };
      };
      // A lane whose newest WR in flight is unsignaled and that may post no more: one more, signaled, ends its list
      // (-D and --run_infinitely: the run's end is not known when a WR is posted).
      const unsignaledTail = (k: number) => {
        const q = queue[k]!;
        return q.length > 0 && !q[q.length - 1]!.signaled;
      };
      const fill = async () => {
        for (let k = 0; k < lane.length; k++) {
          const q = queue[k]!;
          while (!r.error && q.length < depth) {
            const more = clock.more(next[k]!);
            if (!more && !(unsignaledTail(k) && !ctl.lost)) break;
            const list: SendWr[] = [];
            for (let j = 0; j < postList && q.length < depth; j++) {
              const it = next[k]!;
              const last = !more || !clock.more(it + 1);
              list.push(await wr(k, last || (it + 1) % cqMod === 0 || q.length + 1 === depth));
              if (last) break;
            }
            lane[k]!.qp.postSend(list);
          }
        }
      };
      await fill();
      while (queue.some((q) => q.some((w) => w.signaled))) {
        const wc = await ctl.completion(cq, size);
        if (!wc) break;
        const k = laneOf.get(wc.wrId);
        if (k === undefined) continue;
        const q = queue[k]!;
        const at = q.findIndex((w) => w.id === wc.wrId);
        const covered = q.splice(0, at + 1);
        for (const w of covered) laneOf.delete(w.id);
        if (!count(wc)) continue; // the rest complete WR_FLUSH_ERR: drain them
        const l = lane[k]!;
        if (params.op === 'read') {
          r.mismatches += await compare(view.subarray(l.offset + slot), size, 0, theirsWho);
          r.bytesVerified += size;
        } else if (params.op === 'atomic') {
          // The original value comes back into the sink (host byte order): iteration i's is i.
          if (new DataView(region.buffer).getBigUint64(l.offset, true) !== BigInt(covered[covered.length - 1]!.it)) r.mismatches += 8;
          r.bytesVerified += 8;
        }
        for (const w of covered) {
          done[k]!++;
          clock.record(w.t);
        }
        await fill();
      }
      clock.end();
      return done;
    }

    // --latency_gap: this side waits before each WR it posts (a spin for a short gap, a timer for a long one).
    async function gap(): Promise<void> {
      const us = o.latencyGapUs ?? 0;
      if (us <= 0) return;
      if (us >= 2000) return new Promise((resolve) => setTimeout(resolve, us / 1000));
      const until = performance.now() + us / 1000;
      while (performance.now() < until);
    }

    // When a size's run ends: after `iters` (per lane), after -D seconds, or when stopped;
    // --run_infinitely reports and starts a new period every -D seconds.
    function newClock(first: SizeRun) {
      let run = first;
      let t0 = performance.now();
      const periodMs = (params.durationS ?? 5) * 1000;
      const fixed = params.durationS === undefined && !params.infinite;
      const follows = params.op === 'send' && role === 'server';
      // The warm-up: each lane's first `warm` WRs, untimed; the run's clock starts when the last of them completes.
      const warm = params.warmUp ?? 0;
      let warming = warm * (params.op === 'send' ? 1 : lanes);
      const clock = {
        total: 0,
        more(it: number): boolean {
          if (r.error || ctl.stopping) return false;
          // A ping-pong server answers until the client's final word.
          if (follows && !fixed) return true;
          if (it < warm || params.infinite) return true;
          if (params.durationS !== undefined) return warming > 0 || performance.now() - t0 < periodMs;
          return it < warm + params.iters;
        },
        record(t: number): void {
          const now = performance.now();
          clock.total++;
          if (warming > 0) {
            if (--warming === 0) t0 = now;
            return;
          }
          run.realUs.push((now - t) * 1000);
          run.doneUs.push((now - t0) * 1000);
          run.iterations++;
          if (params.infinite && now - t0 >= periodMs) {
            run.seconds = (now - t0) / 1000;
            o.onPeriod?.(run);
            // Reported: keep the period's figures, not its samples (a run may go on for days).
            run.realUs = [];
            run.doneUs = [];
            run = newRun(run.size);
            r.runs.push(run);
            t0 = now;
          }
        },
        end(): void {
          run.seconds = (performance.now() - t0) / 1000;
        },
      };
      return clock;
    }
  } finally {
    cluster?.close();
    transport.close();
    buf?.close();
  }
}

/** The server's trace as pieces of JSON text; past what an exchange carries, its first events only (said on stderr). */
function packTrace(events: readonly ChromeTraceEvent[]): string[] {
  const json = JSON.stringify(events);
  if (json.length <= TRACE_PIECE * TRACE_PIECES)
    return Array.from({ length: Math.ceil(json.length / TRACE_PIECE) }, (_, i) => json.slice(i * TRACE_PIECE, (i + 1) * TRACE_PIECE));
  const kept = Math.floor((events.length * TRACE_PIECE * TRACE_PIECES) / json.length / 2);
  process.stderr.write(
    `trace: the server's ${events.length} events are more than the client's file can be sent; its first ${kept} go there (the server's own file has them all)\n`,
  );
  return packTrace(events.slice(0, kept));
}

/** The server's trace, sent over at the end, into the client's file: pids of its own, its processes labelled. Nothing from the peer is trusted: text that is not a list of events is said on stderr and left out. */
function addPeerTrace(file: TraceFile, pieces: unknown): void {
  let events: unknown;
  try {
    if (!Array.isArray(pieces) || !pieces.every((p) => typeof p === 'string')) throw new Error('not pieces of text');
    events = JSON.parse(pieces.join(''));
    if (!Array.isArray(events) || !events.every((e: unknown) => typeof e === 'object' && e !== null && Number.isInteger((e as ChromeTraceEvent).pid)))
      throw new Error('not a list of trace events');
  } catch (err) {
    process.stderr.write(`trace: the server's events were left out: ${(err as Error).message}\n`);
    return;
  }
  const pids = new Map<number, number>();
  for (const e of events as ChromeTraceEvent[]) {
    let pid = pids.get(e.pid);
    if (pid === undefined) pids.set(e.pid, (pid = file.nextPid()));
    const ev = { ...e, pid };
    if (e.id !== undefined) ev.id = `server:${e.id}`; // flow ids of another cluster
    if (e.ph === 'M' && e.name === 'process_name') ev.args = { name: `server: ${String(e.args?.['name'])}` };
    file.add(ev);
  }
}

function newRun(size: number): SizeRun {
  return { size, iterations: 0, realUs: [], doneUs: [], seconds: 0 };
}

/** The bytes of one slot of a run's buffer: its largest message, in whole pages. */
function slotBytes(p: RunParams): number {
  return Math.max(4096, Math.ceil(Math.max(...runSizes(p)) / 4096) * 4096);
}

/** A run's lanes: one QP for a ping-pong or atomics, -q for writes and reads. */
function laneCount(p: RunParams): number {
  return p.op === 'send' || p.op === 'atomic' ? 1 : (p.qps ?? 1);
}

/** The bytes of the buffer a run maps on each side: a slot pair per lane (stall mode: one slot). */
function bufferBytes(p: RunParams): number {
  return p.faultModel === 'stall' ? slotBytes(p) : laneCount(p) * 2 * slotBytes(p);
}

/** Client: name the program and the run it wants, and hear the server's answer (a refusal ends the run, its reason said). */
async function askRun(transport: LibfabricTransport, o: PeerOptions, who: string): Promise<RunParams> {
  const params = pickParams(o);
  transport.post({ ...(o.program !== undefined ? { program: o.program } : {}), params } satisfies Hello);
  const verdict = checkBody(VERDICT, await transport.receive(HANDSHAKE_MS), who, 'answer to the run');
  if ('refused' in verdict) throw new PeerRefusal(`${who} refused the run: ${verdict.refused}`);
  return params;
}

/**
 * Server: the client's run, held to its shape, to this server's program and to its limits,
 * adopted; refused otherwise, the client told why (both sides end, each saying it).
 */
async function adoptRun(transport: LibfabricTransport, o: PeerOptions, who: string): Promise<RunParams> {
  const body = await transport.receive(HANDSHAKE_MS);
  try {
    const hello = checkBody(HELLO, body, who, 'run');
    checkRun(hello, o);
    transport.post({ accepted: true } satisfies Verdict);
    return hello.params;
  } catch (e) {
    if (e instanceof PeerRefusal) transport.post({ refused: e.message.slice(0, MAX_REASON) } satisfies Verdict);
    throw e;
  }
}

/** The run a client asks for, against the server's program and limits (a PeerRefusal names which). */
function checkRun({ program, params }: Hello, o: PeerOptions): void {
  if (o.program !== undefined && program !== o.program)
    throw new PeerRefusal(
      `the client runs ${program ?? 'a program it does not name'}, this server runs ${o.program}: start both sides with the same program`,
    );
  for (const { key, value, flag } of o.expect ?? []) {
    const got = params[key] ?? (typeof value === 'boolean' ? false : undefined);
    if (got !== value)
      throw new PeerRefusal(
        `the client runs ${flag} ${got === undefined ? '(not given)' : String(got)}, this server was started with ${flag} ${String(value)}: start both sides with the same options`,
      );
  }
  const limits = { ...DEFAULT_SERVER_LIMITS, ...o.limits };
  const size = Math.max(...runSizes(params));
  if (size > limits.maxSize)
    throw new PeerRefusal(`the client asks for ${size}-byte messages, this server takes at most ${limits.maxSize} (--max-msg)`);
  if (laneCount(params) > limits.maxQps)
    throw new PeerRefusal(`the client asks for ${laneCount(params)} QPs, this server takes at most ${limits.maxQps} (--max-qps)`);
  if (bufferBytes(params) > limits.maxMemory)
    throw new PeerRefusal(
      `the client's run needs ${bufferBytes(params)} bytes of buffer here (QPs × 2 × message size), this server takes at most ${limits.maxMemory} (--max-memory)`,
    );
}

function pickParams(o: PeerOptions): RunParams {
  const p: RunParams = { op: o.op, size: o.size, iters: o.iters, evict: o.evict, odp: o.odp, policy: o.policy };
  for (const k of OPTIONAL_PARAMS) if (o[k] !== undefined && o[k] !== false) (p as unknown as Record<string, unknown>)[k] = o[k];
  if (o.traceFile) p.trace = true;
  if (o.op === 'atomic') {
    p.size = 8;
    p.atomicType = o.atomicType ?? 'FETCH_AND_ADD';
  }
  return p;
}

function emptyResult(role: PeerResult['role'], params: RunParams, provider: LibfabricProvider): PeerResult {
  return {
    role,
    params,
    provider,
    bytesVerified: 0,
    mismatches: 0,
    faults: { source: 0, destination: 0 },
    retransmitted: 0,
    nacks: 0,
    faultTime: { faults: 0, totalUs: 0, phasesUs: { detect: 0, notify: 0, resolve: 0, retransmit: 0 } },
    evictUs: 0,
    runs: [],
    refused: 0,
    refusedBy: {},
    rdmaRefused: {},
  };
}

/** CPU (user + system, every thread) this process used since `cpu0`, µs. */
function cpuSince(cpu0: NodeJS.CpuUsage): number {
  const cpu = process.cpuUsage(cpu0);
  return cpu.user + cpu.system;
}

/** What this side refused of the other's (and of anyone's who reached its port), by reason. */
function countRefusals(r: PeerResult, transport: LibfabricTransport, node: SimNode, cpu0: NodeJS.CpuUsage): void {
  r.cpuUs = cpuSince(cpu0);
  r.progress = transport.progressStats();
  r.sends = transport.sendStats();
  const s = transport.stats();
  const answers = node.pldma.counters().answersRefused;
  r.refused = s.refused;
  r.refusedBy = s.refusedBy;
  r.rdmaRefused = { ...s.rdmaRefusedBy, ...(answers ? { 'answer for nothing': answers } : {}) };
}

/** The server's buffer in stall mode: what its SMMU and fault library need to stall and resolve the provider thread's faults. */
function stallTarget(node: SimNode, pid: number, region: Region, uffd: Userfaultfd, progressTid: number, peerNode: number, write: boolean) {
  // A stream of its own in stall mode (the verbs PDs are terminate-mode streams).
  const stream = node.allocStream({ pid, pd: 0x5a11, faultModel: 'stall' });
  node.map(stream, region, { read: true, write: true });
  // The progress thread is the device: its faults on the window are stalled DMA accesses.
  node.smmu.attachStallSource(uffd, [progressTid]);
  const now = performance.now();
  return node.smmu.beginStallWindow({
    sid: stream.sid,
    region,
    offset: 0,
    length: region.size,
    access: write ? 'write' : 'read',
    // What the driver forwards with each stall. A provider's write says nothing of its
    // transfer's length, so the hint is one page: each fault resolves the page it hit.
    tag: {
      node: node.id,
      sid: stream.sid,
      side: 'destination',
      srcNode: peerNode,
      tid: 0,
      channel: 0,
      seq: 0,
      va: region.address,
      write,
      lengthHint: region.pageSize,
      modelUs: 0,
      detectedMs: now,
      issuedUs: 0,
      issuedMs: now,
    },
  });
}

/** Stall mode: RDMA WRITEs as libfabric RMA writes into the server's unpinned, userfaultfd-registered buffer. */
async function runStall(
  role: PeerResult['role'],
  params: RunParams,
  provider: LibfabricProvider,
  transport: LibfabricTransport,
  cluster: Cluster,
  ctl: RunControl,
  o: PeerOptions,
  who: string,
  cpu0: NodeJS.CpuUsage,
): Promise<PeerResult> {
  if (params.op !== 'write' && params.op !== 'read')
    throw Object.assign(new Error(`stall mode carries RDMA WRITE and READ only (write-bw, write-lat, read-bw), not ${params.op}`), {
      code: 'ERR_INVALID_ARG_VALUE',
    });
  const read = params.op === 'read';
  // One provider write at a time on one RMA connection, for a count of iterations.
  if ((params.qps ?? 1) > 1 || (params.txDepth ?? 1) > 1 || params.bidirectional || params.durationS !== undefined || params.infinite)
    throw Object.assign(
      new Error('stall mode runs one RMA write or read at a time on one connection, -n times: no -q, -t, -b, -D or --run_infinitely'),
      {
        code: 'ERR_INVALID_ARG_VALUE',
      },
    );
  const me = role === 'server' ? SERVER : CLIENT;
  const r = emptyResult(role, params, provider);
  const sizes = runSizes(params);
  const largest = Math.max(...sizes);
  const bytes = slotBytes(params);
  // Pages the writes found evicted: with --evict, every page of every write.
  const pagesTouched = params.evict ? sizes.reduce((n, size) => n + Math.ceil(size / 4096), 0) * params.iters : 0;
  if (role === 'server') {
    const uffd = Userfaultfd.open();
    const ctx = cluster.openDevice(me, { defaultPolicy: params.policy, uffd });
    const buf = mapRegion(bytes);
    try {
      // Resident unless --evict: then every page the writes touch is missing (register first,
      // then evict, or THP could populate the range again). What the reads read: the server's pattern.
      buf.populate();
      if (read) await pattern(new Uint8Array(buf.buffer), bytes, 0, 's');
      uffd.register(buf);
      if (params.evict) buf.evict();
      const faults: Fault[] = [];
      uffd.on('fault', (f) => faults.push(f));
      const target = transport.openRmaTarget();
      checkBody(oneOf([null]), await transport.exchange({ rmaPort: target.port }), who, 'answer to the RMA port');
      const { progressTid } = await target.accepted;
      const win = stallTarget(cluster.system.node(me), ctx.pid, buf, uffd, progressTid, CLIENT, !read);
      const { key, base } = transport.exposeRma(buf.address, bytes);
      checkBody(oneOf([null]), await transport.exchange({ addr: base, key }), who, 'answer to the RMA address');
      // --evict: before each write the client asks for the buffer to be evicted and waits for
      // the answer, so every write meets missing pages (and the provider thread stalls on each).
      const word = finalWord(1, sizes.length);
      const next = async (): Promise<'evict' | Done | undefined> => {
        const m = await transport.receive(FOREVER_MS).catch(() => undefined);
        return m === undefined || m === 'evict' ? m : checkBody(word, m, who, 'final word');
      };
      let m = await next();
      while (m === 'evict') {
        buf.evict();
        transport.post('evicted');
        m = await next();
      }
      const done = m as Done | undefined;
      if (done) transport.post('done');
      if (done?.error) r.peerError = done.error;
      else if (!done) r.lost = ctl.lost ?? 'the client said nothing the run expects';
      if (done && !done.error && !read) {
        r.mismatches += await compare(new Uint8Array(buf.buffer), largest, params.iters - 1, 'c');
        r.bytesVerified += largest;
      }
      r.faults.destination = ctx.faultLibrary.stats().faults.destination;
      r.faultTime = faultTime(ctx.faultLibrary.stats());
      r.stall = {
        progressTid,
        jsTid: process.pid,
        faultTids: [...new Set(faults.map((f) => f.threadId))],
        faultsByHandler: faults.filter((f) => f.resolvedBy === 'handler').length,
        faultsNative: faults.filter((f) => f.resolvedBy === 'native').length,
        smmuStalls: win.stalls,
        libraryFaults: r.faults.destination,
        pagesTouched,
      };
      cluster.system.node(me).smmu.endStallWindow(win);
      const traced = params.trace ? packTrace(ctx.faultLibrary.exportChromeTrace().traceEvents) : undefined;
      if (!r.lost) {
        const report: Report = {
          bytesVerified: r.bytesVerified,
          mismatches: r.mismatches,
          nacks: 0,
          stall: r.stall,
          faultTime: r.faultTime,
          cpuUs: cpuSince(cpu0),
          ...(traced ? { trace: traced } : {}),
        };
        const closing = await transport.exchange(report, 30_000).catch(() => undefined);
        if (closing !== undefined) checkBody(record<object>({}), closing, who, 'closing word');
      }
      ctl.over = true;
      o.traceFile?.addContexts([ctx]);
      return r;
    } finally {
      buf.close();
      uffd.close();
    }
  }
  const buf = mapRegion(bytes, { shared: true });
  try {
    const view = new Uint8Array(buf.buffer);
    const { rmaPort } = checkBody(record<{ rmaPort: number }>({ rmaPort: int(1, 65535) }), await transport.exchange(null), who, 'RMA port');
    await transport.connectRma(rmaPort);
    const remote = checkBody(
      record<{ addr: bigint; key: bigint }>({ addr: big(U64), key: big(U64) }),
      await transport.exchange(null),
      who,
      'RMA address',
    );
    // No QP here: the libfabric endpoints are the queue pairs (QPN 0, PSN 0).
    o.onConnected?.(
      [{ node: CLIENT, qpn: 0, psn: 0, addr: buf.address, rkey: 0 }],
      [{ node: SERVER, qpn: 0, psn: 0, addr: remote.addr, rkey: Number(remote.key) }],
      params,
    );
    for (const size of sizes) {
      if (r.error) break;
      const run = newRun(size);
      r.runs.push(run);
      const t0 = performance.now();
      for (let it = 0; it < params.iters && !r.error; it++) {
        if (read) view.fill(0xa5, 0, size);
        else await pattern(view, size, it, 'c');
        let t = 0;
        try {
          if (params.evict) {
            // The source's pages are memfd pages the kernel maps back (minor faults it resolves
            // itself); the server evicts its buffer and answers before the write goes.
            buf.unmapPages();
            transport.post('evict');
            checkBody(oneOf(['evicted']), await transport.receive(30_000), who, 'answer to the eviction');
          }
          t = performance.now();
          if (read) await transport.rmaRead(buf.address, size, remote.addr, remote.key);
          else await transport.rmaWrite(buf.address, size, remote.addr, remote.key);
        } catch (e) {
          // The peer went away or never answered: what an RDMA WRITE's requester reports then.
          r.error = `${wcStatusStr(WcStatus.RETRY_EXC_ERR)} (RETRY_EXC_ERR): ${(e as Error).message}`;
          break;
        }
        run.realUs.push((performance.now() - t) * 1000);
        run.doneUs.push((performance.now() - t0) * 1000);
        run.iterations++;
        if (read && it === params.iters - 1) {
          // What the server's memory held: its pattern, or zeros where --evict dropped it.
          r.mismatches += params.evict ? view.subarray(0, size).filter((x) => x !== 0).length : await compare(view, size, 0, 's');
          r.bytesVerified += size;
        }
      }
      // With --evict only the writes count, not the eviction requests between them.
      run.seconds = params.evict ? run.realUs.reduce((a, b) => a + b, 0) / 1e6 : (performance.now() - t0) / 1000;
    }
    const done: Done = { counts: [r.runs.at(-1)?.iterations ?? 0], ...(r.error ? { error: r.error } : {}) };
    const heard = ctl.lost ? undefined : await transport.exchange(done, FOREVER_MS).catch(() => undefined);
    if (heard !== undefined) checkBody(oneOf(['done']), heard, who, 'answer to the final word');
    const closing = heard === undefined ? undefined : await transport.exchange({}, 30_000).catch(() => undefined);
    ctl.over = true;
    if (ctl.lost) r.lost = ctl.lost;
    const peer = closing === undefined ? undefined : checkBody(REPORT, closing, who, 'closing counters');
    if (peer) {
      const { trace, ...counters } = peer;
      r.peer = counters;
      r.faults.destination = peer.stall?.libraryFaults ?? 0;
      if (trace && o.traceFile) addPeerTrace(o.traceFile, trace);
    }
    return r;
  } finally {
    buf.close();
  }
}
