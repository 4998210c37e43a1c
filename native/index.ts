// The one module that loads the addon and types it. The raw binding is private and dumb:
// positional, already-validated arguments; handles are small integers. Options, defaults
// and friendly errors live in lib/ and kernel-sim/.
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

// Node 20.0–20.3 have no Symbol.dispose, and every resource class defines [Symbol.dispose]: without
// it the method would be named "undefined". Each of their modules imports this one (directly or
// through kernel-sim), so this runs before any class is defined. Node ≥ 20.4 has this very symbol.
if (typeof Symbol.dispose !== 'symbol') Object.defineProperty(Symbol, 'dispose', { value: Symbol.for('nodejs.dispose') });

export interface RawMapping {
  id: number;
  address: bigint;
  buffer: ArrayBuffer;
  pageSize: number;
}

export interface RawUffd {
  handle: number;
  /** The features this uffd asked for and the kernel enabled. */
  features: bigint;
  /** Every feature the kernel offers. */
  available: bigint;
  ioctls: bigint;
  how: 'syscall' | 'user-mode-only' | '/dev/userfaultfd';
  handlerTid: number;
}

export interface RawUffdStats {
  /** Reads of the uffd. */
  reads: number;
  /** Events read. */
  events: number;
  /** Faults forwarded to the TypeScript handler. */
  forwarded: number;
  /** Faults resolved in native code (the JS thread's own). */
  resolvedNatively: number;
  /** Forwarded faults resolved with the default after the handler's timeout. */
  timeouts: number;
  /** Faults reported again for a page already being resolved. */
  duplicates: number;
  /** fork() events. */
  forks: number;
}

export interface RawTouchResult {
  ns: number;
  tid: number;
  pages: number;
  checksum: number;
  data?: Buffer;
  pageNs?: Float64Array;
  /** Region offsets of the pages whose access raised SIGBUS. */
  failed?: Float64Array;
}

/** Event kinds in the Float64Array batches of the uffd reader (7 numbers per event). */
export enum UffdEventKind {
  Fault = 0,
  FaultResolved = 1,
  Timeout = 2,
  Remove = 3,
  Unmap = 4,
  Remap = 5,
  ResolveError = 6,
  Fork = 7,
}
export const UFFD_EVENT_WIDTH = 7;
export enum UffdFaultFlag {
  Write = 1,
  WriteProtect = 2,
  Minor = 4,
}

/** Touch modes of the native toucher. */
export enum TouchMode {
  ReadCopy = 0,
  WriteFill = 1,
  ProbeRead = 2,
  ProbeWrite = 3,
}

/** Copy-engine job flags and completion layout (5 numbers per completion). */
export enum CopyFlag {
  /** Fail the copy if a source page is missing (terminate mode). */
  CheckSource = 1,
  /** Fail the copy if a destination page is missing (terminate mode). */
  CheckDest = 2,
  /** The caller believes both sides resident: a small copy may run inline (CopyEngine.copy). */
  Inline = 4,
}
/** How a copy ended. */
export enum CopyStatus {
  /** Every byte copied. */
  Ok = 0,
  /** A source page was missing. */
  SourceFault = 1,
  /** A destination page was missing. */
  DestFault = 2,
  /** Cancelled by a fence before it ran: nothing was copied. */
  Cancelled = 3,
}
export const COPY_COMPLETION_WIDTH = 5;

export interface Binding {
  pageSize: number;
  mapRegion(size: number, shared: boolean, hugePages: boolean, hugetlb: boolean): RawMapping;
  mapAlias(id: number): RawMapping;
  regionShare(id: number): RawMapping;
  closeRegion(id: number, buffer?: ArrayBuffer): void;
  residency(id: number, offset: number, length: number): Uint8Array;
  pagemap(id: number, offset: number, length: number): Uint8Array;
  frames(id: number, offset: number, length: number): { pfns: Float64Array; visible: boolean };
  /**
   * The first of `count` granules from `offset` whose first or last page is not present in the
   * page table (-1: none), and in frames[0, tail) the frames of the `tail` granules before it
   * (or before the end): one /proc/self/pagemap scan per run.
   */
  pageRun(id: number, offset: number, count: number, granule: number, tail: number, frames: Float64Array): number;
  populate(id: number, offset: number, length: number, write: boolean): void;
  evict(id: number, offset: number, length: number): void;
  zap(id: number, offset: number, length: number): void;
  advise(id: number, offset: number, length: number, advice: number): void;
  pagemapScan(
    id: number,
    offset: number,
    length: number,
    flags: number,
    categoryMask: number,
    categoryInverted: number,
    anyofMask: number,
    returnMask: number,
  ): Float64Array;
  pin(id: number, offset: number, length: number, on: boolean): void;
  memlockLimit(): { soft: number; hard: number };
  gettid(): number;

  uffdOpen(features: bigint, required: bigint, userModeOnly: boolean): RawUffd;
  /**
   * `callback` reads the first `length` numbers of `events` and one address an event from
   * `addresses` (the next batch reuses both); `receivedMs`: CLOCK_MONOTONIC in ms, the clock of
   * process.hrtime().
   */
  uffdStart(
    handle: number,
    callback: (events: Float64Array, length: number, addresses: BigUint64Array, receivedMs: number) => void,
    eventLoop: boolean,
  ): void;
  uffdRegister(handle: number, region: number, address: bigint, length: number, mode: number, granule: number): bigint;
  uffdUnregister(handle: number, address: bigint, length: number): void;
  /** Places `length` bytes of `source` at `base + offset`; `mode`: UFFDIO_COPY_MODE_DONTWAKE (1) | UFFDIO_COPY_MODE_WP (2). */
  uffdCopy(handle: number, base: bigint, offset: number, length: number, source: ArrayBufferView | ArrayBuffer, mode: number): number;
  uffdZeropage(handle: number, address: bigint, length: number, dontWake: boolean): number;
  uffdContinue(handle: number, address: bigint, length: number, dontWake: boolean, mode: number): number;
  uffdPoison(handle: number, address: bigint, length: number, dontWake: boolean): number;
  uffdMove(handle: number, destination: bigint, source: bigint, length: number, dontWake: boolean, allowSourceHoles: boolean): number;
  uffdWriteProtect(handle: number, address: bigint, length: number, on: boolean, dontWake: boolean): void;
  uffdWake(handle: number, address: bigint, length: number): void;
  uffdSetTimeout(handle: number, timeoutMs: number): void;
  uffdPending(handle: number): number;
  uffdKick(handle: number): void;
  uffdStats(handle: number): RawUffdStats;
  uffdClose(handle: number): void;

  touch(region: number, offset: number, length: number, mode: TouchMode, fill: number, timings: boolean): Promise<RawTouchResult>;

  engineCreate(threads: number, callback: (completions: Float64Array) => void): { handle: number; tids: number[] };
  engineSubmit(
    handle: number,
    jobId: number,
    srcRegion: number,
    srcOffset: number,
    dstRegion: number,
    dstOffset: number,
    length: number,
    flags: number,
    key?: number,
    qp?: number,
  ): void;
  /** A copy on the calling thread when every page of both sides is present; -1 (nothing touched) otherwise. out: faultOffset, ns. */
  engineCopyNow(
    handle: number,
    srcRegion: number,
    srcOffset: number,
    dstRegion: number,
    dstOffset: number,
    length: number,
    out: Float64Array,
  ): number;
  engineFence(handle: number, key: number, qp: number, timeoutMs: number): boolean;
  engineUnref(handle: number): void;
  engineClose(handle: number): void;

  /** CRC-32C (Castagnoli) of `bytes`, continuing from `seed` (0 to start; zlib's convention). */
  crc32c(seed: number, bytes: Uint8Array): number;

  /** A SOCK_SEQPACKET Unix socket listening at `path` (made 0600); connections arrive as 'connection' events. */
  seqpacketListen(path: string, onEvent: SeqpacketEventHandler): number;
  /** A client connection to `path`. */
  seqpacketConnect(path: string, onEvent: SeqpacketEventHandler): number;
  /** A connected SOCK_SEQPACKET socket a peer sent (its fd now belongs to the handle). */
  seqpacketAdopt(fd: number, onEvent: SeqpacketEventHandler): number;
  /** One message with copies of `fds` (SCM_RIGHTS); false when the peer's queue is full. */
  seqpacketSend(handle: number, bytes: Uint8Array, fds: number[]): boolean;
  /** Idempotent; no event follows. */
  seqpacketClose(handle: number): void;
  /** Close a descriptor a peer sent. */
  fdClose(fd: number): void;
  /** What a peer's descriptor is. */
  fdKind(fd: number): 'fifo' | 'file' | 'eventfd' | 'seqpacket' | 'memfd' | 'other';
  /** One write(2) that never blocks: bytes written, or -errno (-EAGAIN: the pipe is full). */
  fdWrite(fd: number, bytes: Uint8Array): number;
  /** The file at `path` opened and flock'ed exclusively (EWOULDBLOCK: another process holds it): its fd. */
  lockFile(path: string): number;
  /** A full memory barrier (atomic_thread_fence(seq_cst)). */
  fence(): void;
  /** Watch a doorbell eventfd: onRing(status) after each wake-up (its counter read). The fd stays the caller's. */
  eventfdWatch(fd: number, onRing: (status: number) => void): number;
  eventfdUnwatch(handle: number): void;
  /** A region over a sealed memfd (no shrinking or growing): a ring's memory, fd to send to a program (closed with the region). */
  mapSealed(size: number): RawMapping & { fd: number };
  /** Another process's memory as a region id (no buffer): pageRun, pagemap and the copy engine take it; closeRegion(id) forgets it. */
  foreignRegion(pid: number, address: bigint, length: number): number;

  /** libfabric (present only when the addon was built with libfabric-dev: see fabricBinding). */
  fabricListen?: (
    provider: string,
    host: string | null,
    port: number,
    onEvent: FabricEventHandler,
    threaded?: boolean,
  ) => { handle: number; port: number };
  fabricConnect?: (provider: string, host: string, port: number, onEvent: FabricEventHandler) => number;
  /** One message: `bytes`, or the parts gathered in order (copied once, into a reused send buffer). */
  /** `due`: the message asks for an answer (a write's ACK): the connection may poll for it before sleeping (fabricProgress). */
  /**
   * `lend` [regionId, offset]: the last part is that region's bytes at offset; they are sent from
   * there, not copied, when every page is present and the provider needs no registration of local
   * buffers (else copied; fabricProgress's `sends` counts which). A drop of lent pages (evict,
   * zap, advise, uffdMove's source) first finishes the send, or throws EBUSY after 1 s.
   */
  fabricSend?: (handle: number, bytes: Uint8Array | Uint8Array[], due?: boolean, lend?: [number, number]) => void;
  /**
   * From the 'message' handler of receive slot `slot`: keep the slot (its bytes stay put, the
   * copy engine may read them by region id) until fabricRelease; another slot is posted in its
   * place. Returns the slot's region, or null when every slot is taken (copy the bytes instead).
   * A held slot of a connection that closed is the caller's to closeRegion.
   */
  fabricHold?: (handle: number, slot: number) => RawMapping | null;
  /** A held slot's bytes are no longer needed (never from that slot's own 'message' handler). */
  fabricRelease?: (handle: number, slot: number) => void;
  fabricMrReg?: (handle: number, address: bigint, length: number, access: number) => { id: number; key: bigint; base: bigint };
  fabricMrDereg?: (handle: number, mr: number) => void;
  fabricRma?: (handle: number, write: boolean, id: number, localAddress: bigint, length: number, remoteAddress: bigint, key: bigint) => void;
  fabricClose?: (handle: number) => void;
  /**
   * The bounds a connection or listener keeps (each optional). A connection: receives kept
   * posted (one until set: enough for a hello), receive slots at most, bytes of sends not yet
   * completed at most (fabricSend throws ENOBUFS past it). A listener: TCP connections that
   * sent no connection request are shut down after `bareMs` (and the oldest past `maxBare`),
   * each told as 'refused'.
   */
  fabricLimits?: (handle: number, limits: { posted?: number; maxSlots?: number; maxPending?: number; bareMs?: number; maxBare?: number }) => void;
  /**
   * How a connection waits for an answer it expects (mode 0 wait: sleep on the wait fd at once;
   * 1 poll: poll the CQ up to `maxSpinUs` before sleeping; 2 adaptive: up to twice what the
   * answers seen took, never past `maxSpinUs`), and what it did: polls, polls that an answer
   * ended, µs spent polling, answers timed, their running mean in µs.
   */
  fabricProgress?: (
    handle: number,
    options?: { mode?: 0 | 1 | 2; maxSpinUs?: number },
  ) => { spins: number; hits: number; spunUs: number; replies: number; replyUs: number; sends?: FabricSendStats };

  /** hiredis (present only when the addon was built with libhiredis-dev: see redisBinding). Synchronous, with a timeout. */
  redisConnect?: (path: string, host: string, port: number, timeoutMs: number) => number;
  redisClose?: (handle: number) => void;
  /** One command; an error reply throws code ERR_REDIS_REPLY, a failed connection ERR_REDIS_IO (the next call reconnects). */
  redisCommand?: (handle: number, args: (string | Buffer)[], timeoutMs: number) => unknown;
  /**
   * MGET the stored pages at `addresses` (key PREFIX:ADDR, or PREFIX:{ADDR>>tagShift}:ADDR), check each against its
   * address and version, and copy page i to out[i * pageSize]; status[i] says how it went (ReadStatus), crcs[i] its
   * page CRC, detail[2i..2i+1] what a refused value said. `handles`: each node's connection (-1: not asked);
   * `slotNode`: the cluster's slot -> node table (empty: one server). Returns the messages of the pages whose request
   * failed as a whole (by index), or undefined.
   */
  redisFetch?: (
    handles: Int32Array,
    slotNode: Int32Array,
    prefix: string,
    tagShift: number,
    addresses: Float64Array,
    versions: Float64Array,
    count: number,
    seed: number,
    pageSize: number,
    out: Buffer,
    status: Int32Array,
    crcs: Uint32Array,
    detail: Float64Array,
    timeoutMs: number,
  ) => (string | undefined)[] | undefined;
  /**
   * One `command key [value]` per key, pipelined over the nodes: [sum of the integer replies, messages by key index or
   * undefined ('down': its node's handle was -1), why each node whose connection failed did (by node index)].
   */
  redisWrite?: (
    handles: Int32Array,
    slotNode: Int32Array,
    command: string,
    keys: string[],
    values: Buffer[] | null,
    timeoutMs: number,
  ) => [number, (string | undefined)[] | undefined, (string | undefined)[]];
  /** A key's Redis Cluster hash slot. */
  redisKeySlot?: (key: string) => number;
}

/**
 * What a libfabric connection tells JavaScript, from the event loop (uv_poll on the EQ's
 * and CQ's wait fds): 'request' (a listener's connection request, with the peer's
 * "ADDRESS:PORT": the handler returns true to accept it, anything else rejects it in the
 * connection manager), 'connection' (a listener accepted: the new handle), 'connected' (on a
 * threaded listener's connection: with the tid of the thread that progresses it),
 * 'message' (a Uint8Array viewing the native receive slot, and the slot's number: valid only
 * until the handler returns, then the slot takes the next message, unless held with fabricHold;
 * copy what must outlive it), 'refused' (a reason: a message the provider passed on that
 * this transport never sends, or on a listener a bare connection it cut), 'rma' (id, 0 or
 * -errno), 'shutdown' (the peer went away), 'error'.
 */
export type FabricEventHandler = (
  handle: number,
  kind: 'request' | 'connection' | 'connected' | 'message' | 'refused' | 'rma' | 'shutdown' | 'error',
  a?: unknown,
  b?: unknown,
) => boolean | void;

/**
 * What a SOCK_SEQPACKET socket tells JavaScript, from the event loop: 'connection' (on a listener:
 * the new connection's handle, the peer's pid, uid and gid from SO_PEERCRED), 'message' (a Buffer
 * with the datagram, the fds it carried (now the receiver's), flags: 1 truncated, 2 fds truncated),
 * 'close' (end of stream: the socket is closed), 'error' (an errno: the socket is closed).
 */
export type SeqpacketEventHandler = (
  kind: 'connection' | 'message' | 'close' | 'error',
  handle: number,
  a?: unknown,
  b?: unknown,
  c?: unknown,
  d?: unknown,
) => void;

/** libfabric's FI_REMOTE_WRITE / FI_REMOTE_READ access bits for fabricMrReg. */
export const FI_REMOTE_READ = 1 << 12;
export const FI_REMOTE_WRITE = 1 << 13;

function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'package.json')) && existsSync(join(dir, 'binding.gyp'))) return dir;
    const up = dirname(dir);
    if (up === dir) throw new Error('pagefault-rdma: cannot find the package root (binding.gyp) above ' + fileURLToPath(import.meta.url));
    dir = up;
  }
}

function load(): Binding {
  if (process.platform !== 'linux') {
    throw new Error(`pagefault-rdma needs Linux (userfaultfd, mincore, MADV_POPULATE); this is ${process.platform}`);
  }
  const require = createRequire(import.meta.url);
  const nodeGypBuild = require('node-gyp-build') as (dir: string) => unknown;
  const root = packageRoot();
  try {
    return nodeGypBuild(root) as Binding;
  } catch (err) {
    const e = new Error(
      `pagefault-rdma: the native addon is not built for this Node (${process.version}, ${process.arch}). ` +
        `Run "npm rebuild pagefault-rdma" (needs python3, make and g++), or "npm run build:native" in ${root}.`,
    );
    (e as Error & { cause?: unknown }).cause = err;
    throw e;
  }
}

export const binding: Binding = load();

export type FabricBinding = Required<
  Pick<
    Binding,
    | 'fabricListen'
    | 'fabricConnect'
    | 'fabricSend'
    | 'fabricHold'
    | 'fabricRelease'
    | 'fabricMrReg'
    | 'fabricMrDereg'
    | 'fabricRma'
    | 'fabricClose'
    | 'fabricLimits'
    | 'fabricProgress'
  >
>;

/** How a connection's payload sends went (fabricProgress's `sends`). */
export interface FabricSendStats {
  /** Payloads sent straight from their source's pages (no staging copy). */
  lent: number;
  /** Their bytes. */
  lentBytes: number;
  /** Payloads that could have been lent but were copied into the send buffer (a page not present, a provider that needs registration). */
  copied: number;
  /** Their bytes. */
  copiedBytes: number;
  /** Lent sends a drop of their pages had to finish first (posted to the provider). */
  finishedOnDrop: number;
  /** Lent sends a drop of their pages copied first (still in the backlog, not yet posted). */
  copiedOnDrop: number;
  /** Lent sends the provider may still read now. */
  lentNow: number;
}

export type RedisBinding = Required<Pick<Binding, 'redisConnect' | 'redisClose' | 'redisCommand' | 'redisFetch' | 'redisWrite' | 'redisKeySlot'>>;

/**
 * The folder holding the project's libibverbs.so.1 (native/libibverbs), found as node-gyp-build
 * finds the addon: the checkout's or install's own build (build/Release/libibverbs), else the
 * prebuild shipped for this platform (prebuilds/linux-x64, glibc). Throws
 * ERR_PFR_VERBS_MISSING, naming the package to install, when it was not built (`root`: the
 * package's folder).
 */
export function verbsLibDir(root = packageRoot()): string {
  const built = join(root, 'build', 'Release', 'libibverbs');
  if (existsSync(join(built, 'libibverbs.so.1'))) return built;
  const glibc = (process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined)?.header?.glibcVersionRuntime;
  // prebuildify copies the shared libraries of build/Release beside the addon's prebuild.
  const prebuilt = join(root, 'prebuilds', `${process.platform}-${process.arch}`);
  if (glibc && existsSync(join(prebuilt, 'libibverbs.so.1'))) return prebuilt;
  const e = new Error(
    'pagefault-rdma: its libibverbs.so.1 is not built: install the verbs headers (Debian/Ubuntu: sudo apt-get install libibverbs-dev) and run "npm rebuild pagefault-rdma"',
  ) as Error & { code: string };
  e.code = 'ERR_PFR_VERBS_MISSING';
  throw e;
}

/** The hiredis part of the addon, or an error naming the package to install when it was built without it. */
export function redisBinding(): RedisBinding {
  if (binding.redisConnect) return binding as RedisBinding;
  const e = new Error(
    'pagefault-rdma: the Redis client (hiredis) is not built in: install hiredis (Debian/Ubuntu: sudo apt-get install libhiredis-dev) and run "npm rebuild pagefault-rdma"',
  ) as Error & { code: string };
  e.code = 'ERR_HIREDIS_MISSING';
  throw e;
}

/** The libfabric part of the addon, or an error naming the package to install when it was built without it. */
export function fabricBinding(): FabricBinding {
  if (binding.fabricListen) return binding as FabricBinding;
  const e = new Error(
    'pagefault-rdma: the libfabric transport is not built in: install libfabric (Debian/Ubuntu: sudo apt-get install libfabric-dev) and run "npm rebuild pagefault-rdma"',
  ) as Error & { code: string };
  e.code = 'ERR_LIBFABRIC_MISSING';
  throw e;
}
