// The memory server (EDM's DMS role) of `pagefault-rdma memory-server`: pages of other
// processes' pagers, held in this process's memory and served over a Unix socket or loopback
// TCP in the frames of memory-server-wire.ts. Each client names a namespace at its hello (its
// pager's key prefix, instance id included) and proves it with a secret: the connection reads
// and writes that namespace only, and no other client can take it over. A frame that breaks
// the protocol is refused (counted by reason, answered with the reason, the connection closed);
// the server goes on serving everyone else. The pages live as long as the process: a restarted
// server holds none, and says so with a new epoch at the hello.
import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, unlinkSync } from 'node:fs';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { dirname } from 'node:path';
import { PfrError } from '../errors.js';
import { checkInt, invalidArg } from '../validate.js';
import {
  ABSENT,
  errorFrame,
  FrameReader,
  frame,
  HEADER_BYTES,
  HELLO_FIXED,
  HELLO_REPLY_BYTES,
  MAX_BODY,
  MAX_COUNT,
  MAX_NAMESPACE,
  MAX_VALUE,
  Op,
  readAddress,
  REPLY,
  SECRET_BYTES,
  Status,
  validNamespace,
  VERSION,
  type Header,
} from './memory-server-wire.js';

/** Where and how `MemoryServer.listen` listens. */
export interface MemoryServerOptions {
  /** A Unix socket path (made 0600: only this user's processes connect), or */
  socket?: string;
  /** a TCP port on the loopback interface (0: any free port; `address` says which). */
  port?: number;
  /** The loopback address for `port`: 127.0.0.1 (default), ::1 or localhost. Nothing else is accepted. */
  host?: string;
  /** Bytes of page values the server may hold (default 1 GiB); a PUT past it is refused (ERR_PFR_STORE_FULL). */
  maxMemory?: number;
  /** Trace events the server keeps, the newest (default 0: no trace); read them with trace(). */
  traceEvents?: number;
}

/**
 * One event of the memory server's trace, in Chrome's trace-event layout: ts and dur in µs since
 * the epoch (performance.timeOrigin + now(): the clock the DM-Handler's trace uses, so the two
 * line up). `conn` is the connection it served (1, 2, … in the order accepted), 0 the server's own.
 */
export interface MemoryServerTraceEvent {
  /**
   * 'get' (a fetch batch served: args.pages asked, found, absent, bytes), 'put' (a write-back
   * batch: pages, bytes; full: refused for --max-memory), 'del', 'hello' (args.namespace),
   * 'refused' (args.reason), 'closed'; 'held' (ph 'C': pages and bytes held, after each change).
   */
  name: string;
  /** 'X': a span of `dur`; 'i': an instant; 'C': a counter. */
  ph: 'X' | 'i' | 'C';
  /** µs since the epoch. */
  ts: number;
  /** µs, for 'X'. */
  dur?: number;
  /** The connection served (1, 2, … in the order accepted); 0: the server's own (the pages-held counter). */
  conn: number;
  /** Counts (pages, bytes), the namespace, a refusal's reason. */
  args: Record<string, number | string>;
}

const nowUs = (): number => (performance.timeOrigin + performance.now()) * 1000;

/** What the server did (stats(); printed at exit). */
export interface MemoryServerStats {
  /** Connections accepted. */
  connections: number;
  /** Connections open now. */
  open: number;
  /** Namespaces known now: holding pages, or bound to a connection. */
  namespaces: number;
  /** Values held now. */
  pages: number;
  /** Bytes of the values held now. */
  bytes: number;
  /** GET requests served. */
  gets: number;
  /** PUT requests served (refused ones for the memory limit included). */
  puts: number;
  /** DEL requests served. */
  dels: number;
  /** Values sent. */
  pagesRead: number;
  /** Values stored. */
  pagesWritten: number;
  /** Values deleted. */
  pagesDeleted: number;
  /** GETs of a value the namespace does not hold (answered ABSENT). */
  absent: number;
  /** PUTs refused for the memory limit. */
  full: number;
  /** Frames refused (the connection closed). */
  refused: number;
  /** The same, by reason (a short fixed phrase per check). */
  refusedBy: Record<string, number>;
}

/** A connection must say hello within this time (ms). */
const HELLO_TIMEOUT_MS = 10_000;

/** The GET replies' buffer (larger replies get one of their own). */
const OUT_BYTES = 256 << 10;

const LOOPBACK = new Set(['127.0.0.1', '::1', 'localhost']);

interface Namespace {
  name: string;
  secret: Buffer;
  pages: Map<number, Buffer>;
  /** Connections bound to it now. */
  conns: number;
}

/** A memory server: `MemoryServer.listen({ socket })`, then `close()`. */
export class MemoryServer {
  /** Where it listens: `unix:PATH` or `HOST:PORT`. */
  readonly address: string;
  /** A new random id at each start: a client that sees it change knows the pages it stored are gone. */
  readonly epoch: Buffer = randomBytes(8);
  /** Bytes of page values it may hold. */
  readonly maxMemory: number;
  #server: Server;
  #socketPath: string | undefined;
  #spaces = new Map<string, Namespace>();
  #conns = new Set<Socket>();
  #connId = new WeakMap<Socket, number>();
  #bytes = 0;
  #pages = 0;
  #closing: Promise<void> | undefined;
  // The GET replies' buffer: one allocation for all of them, not an ArrayBuffer per reply (each
  // one is garbage the GC must find, and measured here that was a third of the server's CPU).
  #out = Buffer.allocUnsafeSlow(OUT_BYTES);
  // The trace: a ring of the newest #traceLimit events (0: none kept).
  #traceLimit: number;
  #trace: MemoryServerTraceEvent[] = [];
  #traceNext = 0;
  #traceDropped = 0;
  #stats = { connections: 0, gets: 0, puts: 0, dels: 0, pagesRead: 0, pagesWritten: 0, pagesDeleted: 0, absent: 0, full: 0, refused: 0 };
  #refusedBy: Record<string, number> = {};

  private constructor(server: Server, address: string, socketPath: string | undefined, maxMemory: number, traceEvents: number) {
    this.#server = server;
    this.#traceLimit = traceEvents;
    this.address = address;
    this.#socketPath = socketPath;
    this.maxMemory = maxMemory;
    server.on('connection', (s) => this.#accept(s));
  }

  /** Listen; fails with a system error naming the fix (a socket another server holds, a port in use). */
  static async listen(options: MemoryServerOptions): Promise<MemoryServer> {
    const o = options ?? {};
    const maxMemory = o.maxMemory === undefined ? 2 ** 30 : checkInt('MemoryServer.listen: options.maxMemory', o.maxMemory, 1);
    const traceEvents = o.traceEvents === undefined ? 0 : checkInt('MemoryServer.listen: options.traceEvents', o.traceEvents, 0, 10_000_000);
    if ((o.socket === undefined) === (o.port === undefined))
      throw invalidArg('MemoryServer.listen: give exactly one of options.socket (a Unix socket path) and options.port (loopback TCP)');
    const server = createServer({ noDelay: true });
    if (o.socket !== undefined) {
      if (typeof o.socket !== 'string' || o.socket === '') throw invalidArg('MemoryServer.listen: options.socket must be a path');
      await listenUnix(server, o.socket);
      chmodSync(o.socket, 0o600);
      return new MemoryServer(server, `unix:${o.socket}`, o.socket, maxMemory, traceEvents);
    }
    const port = checkInt('MemoryServer.listen: options.port', o.port, 0, 65535);
    const host = o.host ?? '127.0.0.1';
    if (!LOOPBACK.has(host))
      throw invalidArg(`MemoryServer.listen: options.host ${host} is not a loopback address: the server listens on 127.0.0.1, ::1 or localhost only`);
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => (server.off('error', reject), resolve()));
    });
    const a = server.address() as { address: string; port: number };
    return new MemoryServer(server, `${a.address.includes(':') ? `[${a.address}]` : a.address}:${a.port}`, undefined, maxMemory, traceEvents);
  }

  /** True once close() was called. */
  get closed(): boolean {
    return this.#closing !== undefined;
  }

  /** What it served so far, and what it holds now. */
  stats(): MemoryServerStats {
    return {
      ...this.#stats,
      open: this.#conns.size,
      namespaces: this.#spaces.size,
      pages: this.#pages,
      bytes: this.#bytes,
      refusedBy: { ...this.#refusedBy },
    };
  }

  /** The trace's events kept (options.traceEvents > 0), oldest first, and how many older ones the ring dropped. */
  trace(): {
    /** The events kept, oldest first. */
    events: MemoryServerTraceEvent[];
    /** Older events the ring dropped (raise options.traceEvents to keep them). */
    dropped: number;
  } {
    return { events: [...this.#trace.slice(this.#traceNext), ...this.#trace.slice(0, this.#traceNext)], dropped: this.#traceDropped };
  }

  #event(e: MemoryServerTraceEvent): void {
    const limit = this.#traceLimit;
    if (this.#trace.length < limit) this.#trace.push(e);
    else {
      this.#trace[this.#traceNext] = e;
      this.#traceNext = (this.#traceNext + 1) % limit;
      this.#traceDropped++;
    }
  }

  // A span of connection `conn` from t0 (µs) to now, then the pages held (a counter), when the trace is on.
  #span(name: string, conn: number, t0: number, args: Record<string, number | string>, held = false): void {
    if (!this.#traceLimit) return;
    const now = nowUs();
    this.#event({ name, ph: 'X', ts: t0, dur: now - t0, conn, args });
    if (held) this.#event({ name: 'held', ph: 'C', ts: now, conn: 0, args: { pages: this.#pages, bytes: this.#bytes } });
  }

  #instant(name: string, conn: number, args: Record<string, number | string>): void {
    if (this.#traceLimit) this.#event({ name, ph: 'i', ts: nowUs(), conn, args });
  }

  /** Stop listening, close every connection, drop every page, remove the socket file. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= new Promise<void>((resolve) => {
      this.#server.close(() => resolve());
      for (const s of this.#conns) s.destroy();
    }).then(() => {
      if (this.#socketPath) unlinkQuiet(this.#socketPath);
      this.#spaces.clear();
      this.#pages = this.#bytes = 0;
    });
    return this.#closing;
  }

  /** close(), without waiting. */
  [Symbol.dispose](): void {
    void this.close();
  }

  #accept(s: Socket): void {
    const conn = ++this.#stats.connections;
    this.#conns.add(s);
    this.#connId.set(s, conn);
    let ns: Namespace | undefined;
    // A connection that never says hello is not kept open.
    const helloTimer = setTimeout(() => this.#refuse(s, reader, 'no hello in time', undefined), HELLO_TIMEOUT_MS).unref();
    const reader = new FrameReader(
      (h) => checkRequest(h, ns !== undefined),
      // checkRequest lets through a hello before the hello, and GET, PUT or DEL after it.
      (h, body) => {
        if (!ns) {
          clearTimeout(helloTimer);
          ns = this.#hello(s, reader, h, body);
        } else if (h.op === Op.GET) this.#get(s, reader, ns, h, body);
        else if (h.op === Op.PUT) this.#put(s, reader, ns, h, body);
        else this.#del(s, reader, ns, h, body);
      },
      (reason, h) => this.#refuse(s, reader, reason, h),
    );
    s.on('data', (chunk: Buffer) => reader.push(chunk));
    s.on('error', () => undefined); // a client that goes away mid-write: its connection just ends
    s.on('close', () => {
      this.#instant('closed', conn, ns ? { namespace: ns.name } : {});
      clearTimeout(helloTimer);
      reader.stop();
      this.#conns.delete(s);
      // A namespace with no pages and no connection is forgotten: every pager instance has a
      // namespace of its own, and a long-lived server must not keep one per pager it ever served.
      if (ns && --ns.conns === 0 && ns.pages.size === 0) this.#spaces.delete(ns.name);
    });
  }

  #refuse(s: Socket, reader: FrameReader, reason: string, h: Header | undefined): void {
    this.#instant('refused', this.#connId.get(s) ?? 0, { reason });
    reader.stop();
    this.#stats.refused++;
    this.#refusedBy[reason] = (this.#refusedBy[reason] ?? 0) + 1;
    s.end(errorFrame(h?.op ?? 0, Status.REFUSED, h?.id ?? 0, `memory server: refused: ${reason}`));
    // A client that never reads its refusal must not hold the connection open.
    setTimeout(() => s.destroy(), 1000).unref();
  }

  #hello(s: Socket, reader: FrameReader, h: Header, body: Buffer): Namespace | undefined {
    if (body.readUInt16LE(0) !== VERSION) return void this.#refuse(s, reader, 'unsupported version', h);
    const nsLength = body.readUInt16LE(2);
    const name = body.subarray(HELLO_FIXED);
    if (name.length !== nsLength || !validNamespace(name)) return void this.#refuse(s, reader, 'malformed hello', h);
    const key = name.toString('latin1');
    const secret = Buffer.from(body.subarray(4, 4 + SECRET_BYTES));
    let ns = this.#spaces.get(key);
    if (ns && !ns.secret.equals(secret)) {
      this.#instant('refused', this.#connId.get(s) ?? 0, { reason: 'namespace of another client', namespace: key });
      this.#stats.refused++;
      this.#refusedBy['namespace of another client'] = (this.#refusedBy['namespace of another client'] ?? 0) + 1;
      reader.stop();
      s.end(errorFrame(Op.HELLO, Status.NAMESPACE, h.id, `memory server: the namespace ${key} belongs to another client`));
      return undefined;
    }
    if (!ns) this.#spaces.set(key, (ns = { name: key, secret, pages: new Map(), conns: 0 }));
    ns.conns++;
    this.#instant('hello', this.#connId.get(s) ?? 0, { namespace: key, pagesHeld: ns.pages.size });
    const r = frame(Op.HELLO | REPLY, Status.OK, h.id, 0, HELLO_REPLY_BYTES);
    this.epoch.copy(r, HEADER_BYTES);
    r.writeUInt32LE(MAX_BODY, HEADER_BYTES + 8);
    r.writeUInt32LE(MAX_COUNT, HEADER_BYTES + 12);
    r.writeUInt32LE(MAX_VALUE, HEADER_BYTES + 16);
    send(s, r);
    return ns;
  }

  /** The addresses of a GET or DEL body (its length checked with the header), or undefined if one is not an address. */
  #addresses(h: Header, body: Buffer): number[] | undefined {
    const out = new Array<number>(h.count);
    for (let i = 0; i < h.count; i++) {
      const a = readAddress(body, i * 8);
      if (a < 0) return undefined;
      out[i] = a;
    }
    return out;
  }

  #get(s: Socket, reader: FrameReader, ns: Namespace, h: Header, body: Buffer): void {
    const t0 = this.#traceLimit ? nowUs() : 0;
    const addrs = this.#addresses(h, body);
    if (!addrs) return this.#refuse(s, reader, 'malformed get', h);
    const values = new Array<Buffer | undefined>(h.count);
    let total = h.count * 4,
      found = 0;
    for (let i = 0; i < h.count; i++) {
      const v = (values[i] = ns.pages.get(addrs[i]!));
      if (!v) continue;
      total += v.length;
      found++;
    }
    // A reply past the frame limit cannot happen: values are at most MAX_VALUE, and a client
    // asks for at most MAX_BODY of them (it is told both at the hello); refuse a GET that does.
    if (total > MAX_BODY) return this.#refuse(s, reader, 'get reply too large', h);
    const r = frame(Op.GET | REPLY, Status.OK, h.id, h.count, total, this.#out);
    let at = HEADER_BYTES + h.count * 4;
    for (let i = 0; i < h.count; i++) {
      const v = values[i];
      r.writeUInt32LE(v ? v.length : ABSENT, HEADER_BYTES + i * 4);
      if (v) at += v.copy(r, at);
    }
    this.#stats.gets++;
    this.#stats.pagesRead += found;
    this.#stats.absent += h.count - found;
    this.#span('get', this.#connId.get(s) ?? 0, t0, { pages: h.count, found, absent: h.count - found, bytes: total });
    // Written at once (the usual case): the kernel has the bytes, the buffer serves the next reply.
    if (!send(s, r) && r.buffer === this.#out.buffer) this.#out = Buffer.allocUnsafeSlow(OUT_BYTES);
  }

  #put(s: Socket, reader: FrameReader, ns: Namespace, h: Header, body: Buffer): void {
    const t0 = this.#traceLimit ? nowUs() : 0;
    const n = h.count;
    let total = n * 12,
      growth = 0;
    for (let i = 0; i < n; i++) {
      const a = readAddress(body, i * 12);
      const len = body.readUInt32LE(i * 12 + 8);
      if (a < 0 || len === 0 || len > MAX_VALUE) return this.#refuse(s, reader, 'malformed put', h);
      total += len;
      growth += len - (ns.pages.get(a)?.length ?? 0);
    }
    if (total !== body.length) return this.#refuse(s, reader, 'malformed put', h);
    this.#stats.puts++;
    if (this.#bytes + growth > this.maxMemory) {
      this.#stats.full++;
      this.#span('put', this.#connId.get(s) ?? 0, t0, { pages: n, bytes: body.length - n * 12, full: 'refused: --max-memory' });
      send(
        s,
        errorFrame(
          Op.PUT,
          Status.FULL,
          h.id,
          `memory server ${this.address} is full: it holds ${this.#bytes} of its ${this.maxMemory} bytes (--max-memory); nothing of this batch was stored`,
        ),
      );
      return;
    }
    let at = n * 12;
    for (let i = 0; i < n; i++) {
      const a = readAddress(body, i * 12);
      const len = body.readUInt32LE(i * 12 + 8);
      // A value of its own: a slice would keep the whole batch's body alive.
      const v = Buffer.allocUnsafeSlow(len);
      body.copy(v, 0, at, at + len);
      at += len;
      const old = ns.pages.get(a);
      if (old) this.#bytes -= old.length;
      else this.#pages++;
      ns.pages.set(a, v);
      this.#bytes += len;
    }
    this.#stats.pagesWritten += n;
    send(s, frame(Op.PUT | REPLY, Status.OK, h.id, n, 0));
    this.#span('put', this.#connId.get(s) ?? 0, t0, { pages: n, bytes: body.length - n * 12 }, true);
  }

  #del(s: Socket, reader: FrameReader, ns: Namespace, h: Header, body: Buffer): void {
    const t0 = this.#traceLimit ? nowUs() : 0;
    const addrs = this.#addresses(h, body);
    if (!addrs) return this.#refuse(s, reader, 'malformed del', h);
    let n = 0;
    for (const a of addrs) {
      const old = ns.pages.get(a);
      if (!old) continue;
      ns.pages.delete(a);
      this.#bytes -= old.length;
      this.#pages--;
      n++;
    }
    this.#stats.dels++;
    this.#stats.pagesDeleted += n;
    send(s, frame(Op.DEL | REPLY, Status.OK, h.id, n, 0));
    this.#span('del', this.#connId.get(s) ?? 0, t0, { pages: h.count, deleted: n }, true);
  }
}

/**
 * Why a request's header is refused before its body is read, if it is: the body of everything
 * but a PUT has a size the header fixes, and a connection without a hello may send only a small
 * hello (so it cannot make the server set aside a large body).
 */
function checkRequest(h: Header, bound: boolean): string | undefined {
  if (h.status !== Status.OK || h.op & REPLY) return 'not a request';
  if (!bound) {
    if (h.op !== Op.HELLO) return 'request before hello';
    return h.count !== 0 || h.bodyLength < HELLO_FIXED || h.bodyLength > HELLO_FIXED + MAX_NAMESPACE ? 'malformed hello' : undefined;
  }
  if (h.op === Op.GET) return h.bodyLength !== h.count * 8 ? 'malformed get' : undefined;
  if (h.op === Op.DEL) return h.bodyLength !== h.count * 8 ? 'malformed del' : undefined;
  if (h.op === Op.PUT) return h.bodyLength < h.count * 12 ? 'malformed put' : undefined;
  return h.op === Op.HELLO ? 'second hello' : 'unknown op';
}

// A client that sends requests without reading the answers is not read from until it has
// taken what is queued for it: the server's memory is not its to fill. True if the kernel took
// the bytes at once (nothing holds `bytes` any more).
function send(s: Socket, bytes: Buffer): boolean {
  const ok = s.write(bytes);
  if (!ok && !s.isPaused()) {
    s.pause();
    s.once('drain', () => s.resume());
  }
  return ok && s.writableLength === 0 && !s.destroyed;
}

function unlinkQuiet(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    // already gone
  }
}

// A socket file left by a server that died is taken over; one a live server answers on is not.
async function listenUnix(server: Server, path: string): Promise<void> {
  const attempt = () =>
    new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(path, () => (server.off('error', reject), resolve()));
    });
  try {
    await attempt();
  } catch (err) {
    if ((err as { code?: string }).code !== 'EADDRINUSE') throw listenError(err, path);
    const live = await new Promise<boolean>((resolve) => {
      const c = createConnection(path);
      c.once('connect', () => (c.destroy(), resolve(true)));
      c.once('error', () => resolve(false));
    });
    if (live)
      throw new PfrError('ERR_PFR_STORE_UNAVAILABLE', `memory server: another server listens at ${path}: stop it, or give another --socket`, {
        cause: err,
      });
    unlinkQuiet(path);
    await attempt().catch((e: unknown) => {
      throw listenError(e, path);
    });
  }
}

function listenError(err: unknown, path: string): Error {
  const code = (err as { code?: string }).code;
  const fix = !existsSync(dirname(path))
    ? `the folder ${dirname(path)} does not exist`
    : code === 'EACCES'
      ? 'choose a folder this user may write'
      : '';
  return Object.assign(new Error(`memory server: cannot listen at ${path}: ${(err as Error).message}${fix ? `; ${fix}` : ''}`, { cause: err }), {
    code,
  });
}
