// The page store of a pager whose memory server is `pagefault-rdma memory-server` (see
// memory-server.ts), over a Unix socket or loopback TCP. One connection, requests pipelined
// (a prefetch batch is one GET, an eviction batch one PUT; a batch past the frame limits is
// split), answers matched by id and read from a buffer of its own (no stream machinery on the
// fault path). The connection is bound at its hello to this pager's namespace, with a secret
// only this store knows, so no other client reads these pages. A request not answered in
// timeoutMs fails and drops the connection; the next request connects again. A server that
// restarted holds none of the pages stored before (a new epoch at the hello): asked for them, it
// answers ABSENT, which the DM-Handler reports as ERR_PFR_PAGE_LOST, never as zeros.
import { randomBytes } from 'node:crypto';
import { connect, type Socket } from 'node:net';
import { PfrError } from '../errors.js';
import {
  ABSENT,
  FrameReader,
  frame,
  HEADER_BYTES,
  HELLO_FIXED,
  HELLO_REPLY_BYTES,
  MAX_BODY,
  MAX_COUNT,
  Op,
  REPLY,
  SECRET_BYTES,
  Status,
  validNamespace,
  VERSION,
  writeAddress,
  type Header,
} from './memory-server-wire.js';
import type { PageStore, StoredPage } from './store.js';

/** Where a MemoryServerStore connects. */
export interface MemoryServerStoreOptions {
  /** The server's Unix socket (`pagefault-rdma memory-server --socket PATH`), or */
  socket?: string;
  /** its loopback TCP port (`--port N`), and */
  port?: number;
  /** host (default 127.0.0.1). */
  host?: string;
  /** Key prefix of this application; each pager adds an instance id of its own (its namespace on the server). Default 'pfr'. */
  prefix?: string;
  /** A request not answered in this time fails (ms). Default 2000. */
  timeoutMs?: number;
  /**
   * After a request timed out the server counts as down: requests fail at once, but one at most
   * this often (ms) that tries it again. Default 1000.
   */
  probeIntervalMs?: number;
  /** Leave the pager's pages on the server at close, instead of deleting them. Default false. */
  persist?: boolean;
}

interface Pending {
  id: number;
  op: Op;
  deadline: number;
  resolve(r: { h: Header; body: Buffer }): void;
  reject(e: Error): void;
}

interface Conn {
  socket: Socket;
  pending: Map<number, Pending>;
  dead: boolean;
}

// One read buffer per thread: the reader copies each frame out of it.
const READ_BUFFER = Buffer.allocUnsafe(256 << 10);

// Keys are page addresses in hex (the DM-Handler's): the wire carries them as numbers.
function address(key: string): number {
  const a = parseInt(key, 16);
  if (!(a >= 0 && a < 2 ** 53) || a.toString(16) !== key)
    throw new PfrError('ERR_PFR_STORE_UNAVAILABLE', `MemoryServerStore: the key ${key} is not a page address in lower-case hex`);
  return a;
}

const where = (o: MemoryServerStoreOptions): string => (o.socket !== undefined ? `unix:${o.socket}` : `${o.host ?? '127.0.0.1'}:${o.port}`);

export class MemoryServerStore implements PageStore {
  /** Store name, as stats and errors print it. */
  readonly name = 'memory-server';
  /** This pager's namespace on the server. */
  readonly namespace: string;
  /** Where the server is (for messages). */
  readonly where: string;
  /** A request not answered in this time fails, ms. */
  readonly timeoutMs: number;
  /** While the server is down, how often a request tries it again, ms. */
  readonly probeIntervalMs: number;
  #restarts = 0;
  #o: MemoryServerStoreOptions;
  #secret = randomBytes(SECRET_BYTES);
  // The largest value stored so far (a 4 KiB page and its trailer until told otherwise).
  #valueBytes = 4096 + 24;
  #epoch: Buffer | undefined;
  #conn: Conn | undefined;
  #connecting: Promise<Conn> | undefined;
  #next = 1;
  #timer: NodeJS.Timeout | undefined;
  #closed = false;
  // Set while the server is known down (a request timed out): when, why, when it was last tried.
  #down: { since: number; why: string; triedAt: number } | undefined;

  private constructor(o: MemoryServerStoreOptions, namespace: string) {
    this.#o = o;
    this.namespace = namespace;
    this.where = where(o);
    this.timeoutMs = o.timeoutMs ?? 2000;
    this.probeIntervalMs = o.probeIntervalMs ?? 1000;
  }

  /** Times the server was found restarted (a new epoch at a reconnection): the pages stored before are gone. */
  get restarts(): number {
    return this.#restarts;
  }

  /** Connect and say hello; fails with ERR_PFR_STORE_UNAVAILABLE naming what is missing. */
  static async connect(options: MemoryServerStoreOptions & { namespace: string }): Promise<MemoryServerStore> {
    const { namespace, ...o } = options;
    if ((o.socket === undefined) === (o.port === undefined))
      throw new PfrError('ERR_PFR_STORE_UNAVAILABLE', 'MemoryServerStore: give the server as { socket: PATH } or { port: N } (loopback TCP)');
    if (!validNamespace(namespace))
      throw new PfrError('ERR_PFR_STORE_UNAVAILABLE', `MemoryServerStore: the namespace ${namespace} is not 1–200 printable ASCII characters`);
    const store = new MemoryServerStore(o, namespace);
    await store.#connection();
    return store;
  }

  async getMany(keys: string[]): Promise<(Buffer | null)[]> {
    const out: (Buffer | null)[] = [];
    // A GET's answer must fit a frame: at most this many values of the largest size stored.
    const per = Math.max(1, Math.min(MAX_COUNT, Math.floor(MAX_BODY / (this.#valueBytes + 4))));
    for (let i = 0; i < keys.length; i += per) {
      const batch = keys.slice(i, i + per);
      const req = frame(Op.GET, Status.OK, 0, batch.length, batch.length * 8);
      batch.forEach((k, j) => writeAddress(req, HEADER_BYTES + j * 8, address(k)));
      const { h, body } = await this.#request(Op.GET, req);
      out.push(...this.#values(h, body, batch.length));
    }
    return out;
  }

  async setMany(pages: StoredPage[]): Promise<void> {
    for (let i = 0; i < pages.length;) {
      // As many pages as one frame takes.
      let j = i,
        bytes = 0;
      while (j < pages.length && j - i < MAX_COUNT && bytes + 12 + pages[j]!.value.length <= MAX_BODY) bytes += 12 + pages[j++]!.value.length;
      if (j === i) throw new PfrError('ERR_PFR_STORE_FULL', `MemoryServerStore: a value of ${pages[i]!.value.length} bytes is larger than a frame`);
      const n = j - i;
      const req = frame(Op.PUT, Status.OK, 0, n, bytes);
      let at = HEADER_BYTES + n * 12;
      for (let k = 0; k < n; k++) {
        const p = pages[i + k]!;
        writeAddress(req, HEADER_BYTES + k * 12, address(p.key));
        this.#valueBytes = Math.max(this.#valueBytes, p.value.length);
        req.writeUInt32LE(p.value.length, HEADER_BYTES + k * 12 + 8);
        at += p.value.copy(req, at);
      }
      const { h } = await this.#request(Op.PUT, req);
      if (h.count !== n) throw this.#wrong(`stored ${h.count} of ${n} pages`);
      i = j;
    }
  }

  async deleteMany(keys: string[]): Promise<number> {
    let n = 0;
    for (let i = 0; i < keys.length; i += MAX_COUNT) {
      const batch = keys.slice(i, i + MAX_COUNT);
      const req = frame(Op.DEL, Status.OK, 0, batch.length, batch.length * 8);
      batch.forEach((k, j) => writeAddress(req, HEADER_BYTES + j * 8, address(k)));
      const { h } = await this.#request(Op.DEL, req);
      if (h.count > batch.length) throw this.#wrong(`deleted ${h.count} of ${batch.length} pages`);
      n += h.count;
    }
    return n;
  }

  /** Close the connection. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#timer);
    if (this.#conn) this.#drop(this.#conn, new PfrError('ERR_PFR_CLOSED', 'MemoryServerStore: closed'));
  }

  /** The values of a GET reply, checked against what was asked. */
  #values(h: Header, body: Buffer, n: number): (Buffer | null)[] {
    if (h.count !== n || body.length < n * 4) throw this.#wrong(`answered ${h.count} values for ${n} pages`);
    const out = new Array<Buffer | null>(n);
    let at = n * 4;
    for (let i = 0; i < n; i++) {
      const len = body.readUInt32LE(i * 4);
      if (len === ABSENT) {
        out[i] = null;
        continue;
      }
      if (at + len > body.length) throw this.#wrong('sent a GET reply shorter than its lengths say');
      out[i] = body.subarray(at, at + len);
      at += len;
    }
    if (at !== body.length) throw this.#wrong('sent a GET reply longer than its lengths say');
    return out;
  }

  #wrong(what: string): PfrError {
    return new PfrError('ERR_PFR_PAGE_CORRUPT', `MemoryServerStore: the memory server at ${this.where} ${what}; nothing of it is used`);
  }

  async #request(op: Op, req: Buffer): Promise<{ h: Header; body: Buffer }> {
    if (this.#closed) throw new PfrError('ERR_PFR_CLOSED', 'MemoryServerStore: closed');
    const d = this.#down;
    // While down, one request in a probe interval tries the server (its hello is part of that try).
    if (d && op !== Op.HELLO) {
      if (Date.now() - d.triedAt < this.probeIntervalMs) {
        throw new PfrError(
          'ERR_PFR_STORE_UNAVAILABLE',
          `MemoryServerStore: ${Op[op]}: the memory server at ${this.where} has been down for ${((Date.now() - d.since) / 1000).toFixed(1)} s ` +
            `(${d.why}); requests fail at once but one every ${this.probeIntervalMs} ms, which tries it again`,
        );
      }
      d.triedAt = Date.now();
    }
    const c = this.#conn && !this.#conn.dead ? this.#conn : await this.#connection();
    const id = this.#next;
    this.#next = (this.#next % 0xffffffff) + 1;
    req.writeUInt32LE(id, 4);
    const reply = new Promise<{ h: Header; body: Buffer }>((resolve, reject) => {
      c.pending.set(id, { id, op, deadline: Date.now() + this.timeoutMs, resolve, reject });
    });
    this.#arm();
    c.socket.write(req);
    const r = await reply;
    this.#down = undefined; // it answered
    if (r.h.status === Status.OK) return r;
    const why = r.body.toString('utf8');
    throw new PfrError(r.h.status === Status.FULL ? 'ERR_PFR_STORE_FULL' : 'ERR_PFR_STORE_UNAVAILABLE', `MemoryServerStore: ${why}`);
  }

  // One timer for every request in flight: armed for the oldest deadline, not one per request.
  #arm(): void {
    if (this.#timer || !this.#conn?.pending.size) return;
    const first = this.#conn.pending.values().next().value!;
    this.#timer = setTimeout(
      () => {
        this.#timer = undefined;
        const c = this.#conn;
        if (!c) return;
        const oldest = c.pending.values().next().value;
        if (oldest && oldest.deadline <= Date.now()) {
          const why = `it did not answer a ${Op[oldest.op]} within ${this.timeoutMs} ms`;
          this.#down ??= { since: Date.now(), why, triedAt: Date.now() };
          this.#drop(
            c,
            new PfrError(
              'ERR_PFR_STORE_UNAVAILABLE',
              `MemoryServerStore: the memory server at ${this.where}: ${why}; the connection is dropped and made again at a later request`,
            ),
          );
        } else this.#arm();
      },
      Math.max(1, first.deadline - Date.now()),
    );
    this.#timer.unref();
  }

  #drop(c: Conn, err: Error): void {
    if (c.dead) return;
    c.dead = true;
    c.socket.destroy();
    for (const p of c.pending.values()) p.reject(err);
    c.pending.clear();
    if (this.#conn === c) this.#conn = undefined;
  }

  #connection(): Promise<Conn> {
    this.#connecting ??= this.#open().finally(() => (this.#connecting = undefined));
    return this.#connecting;
  }

  async #open(): Promise<Conn> {
    const o = this.#o;
    // Its socket is set below: the reader it feeds needs the connection first.
    const c = { pending: new Map(), dead: false } as unknown as Conn;
    const reader = new FrameReader(
      (h) => (h.op & REPLY ? undefined : 'not a reply'),
      (h, body) => {
        const p = c.pending.get(h.id);
        if (!p || h.op !== (p.op | REPLY)) return this.#drop(c, this.#wrong(`answered a request it was not asked (id ${h.id}, op ${h.op})`));
        c.pending.delete(h.id);
        p.resolve({ h, body });
      },
      (reason) => this.#drop(c, this.#wrong(`sent a malformed frame (${reason})`)),
    );
    const onread = { buffer: READ_BUFFER, callback: (n: number) => (reader.push(READ_BUFFER, n), true) };
    const socket =
      o.socket !== undefined ? connect({ path: o.socket, onread }) : connect({ host: o.host ?? '127.0.0.1', port: o.port!, onread, noDelay: true });
    c.socket = socket;
    socket.on('error', (err) => this.#drop(c, this.#unavailable(err)));
    socket.on('close', () => {
      reader.stop();
      this.#drop(c, new PfrError('ERR_PFR_STORE_UNAVAILABLE', `MemoryServerStore: the memory server at ${this.where} closed the connection`));
    });
    const ns = Buffer.from(this.namespace, 'latin1');
    const hello = frame(Op.HELLO, Status.OK, 0, 0, HELLO_FIXED + ns.length);
    hello.writeUInt16LE(VERSION, HEADER_BYTES);
    hello.writeUInt16LE(ns.length, HEADER_BYTES + 2);
    this.#secret.copy(hello, HEADER_BYTES + 4);
    ns.copy(hello, HEADER_BYTES + HELLO_FIXED);
    this.#conn = c;
    let epoch: Buffer;
    try {
      const { h, body } = await this.#request(Op.HELLO, hello);
      if (body.length !== HELLO_REPLY_BYTES || h.count !== 0) throw this.#wrong('sent a malformed hello reply');
      epoch = body.subarray(0, 8);
    } catch (err) {
      this.#drop(c, err as Error);
      throw err;
    }
    // A new epoch: the server restarted and holds none of the pages stored before.
    if (this.#epoch && !this.#epoch.equals(epoch)) this.#restarts++;
    this.#epoch = epoch;
    return c;
  }

  #unavailable(err: Error): PfrError {
    const code = (err as { code?: string }).code;
    const fix =
      code === 'ENOENT' || code === 'ECONNREFUSED'
        ? `: is it running? start one with "pagefault-rdma memory-server ${this.#o.socket !== undefined ? `--socket ${this.#o.socket}` : `--port ${this.#o.port}`}"`
        : '';
    return new PfrError('ERR_PFR_STORE_UNAVAILABLE', `MemoryServerStore: cannot reach the memory server at ${this.where} (${err.message})${fix}`, {
      cause: err,
    });
  }
}
