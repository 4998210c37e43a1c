// The rendezvous of a job's ranks, what PMI's put / barrier / get do under MPI, reduced to
// what the ranks need: rank 0 listens on TCP, every other rank connects and says its rank,
// the job's size and its transport address; rank 0 answers with the table of all addresses.
// Then allgathers (a barrier is an allgather of nothing) for as long as the job runs.
// Frames: a 4-byte big-endian length, then one JSON object; each checked on arrival (its
// type and keys, lengths, counts, ranks in range, no rank twice), never trusted. The
// connections stay up until the job's end, so a rank that dies is known at once: rank 0
// tells every other rank and the whole job fails with the reason, never hangs. Every wait
// has a timeout.
import { connect, createServer, type Server, type Socket } from 'node:net';
import { PfrError } from '../errors.js';

/** The largest frame either side accepts (an allgather's answer carries every rank's value). */
export const MAX_RENDEZVOUS_FRAME = 64 << 20;
/** The most ranks a job has: one node each, and a system has at most 1024 nodes. */
export const MAX_JOB_SIZE = 1024;
/** How long a rank waits for the others by default (to arrive, or to reach an allgather). */
export const DEFAULT_RENDEZVOUS_TIMEOUT_MS = 30_000;

/** A job's rendezvous address: HOST:PORT (an IPv6 address in brackets). */
export interface HostPort {
  host: string;
  port: number;
}

/** Parse HOST:PORT (`[::1]:PORT` for IPv6); `what` names it in the error. */
export function parseHostPort(text: unknown, what: string): HostPort {
  const m = typeof text === 'string' ? /^(?:\[([0-9a-fA-F:.]+)\]|([^\s:[\]]{1,255})):(\d{1,5})$/.exec(text) : null;
  const port = m ? Number(m[3]) : NaN;
  if (!m || port < 1 || port > 65535)
    throw new PfrError('ERR_PFR_RENDEZVOUS', `${what} must be HOST:PORT with a port in 1..65535 (e.g. 127.0.0.1:18517), got ${JSON.stringify(text)}`);
  return { host: (m[1] ?? m[2])!, port };
}

/** Options of `Rendezvous.open`. */
export interface RendezvousOptions {
  rank: number;
  size: number;
  /** Where rank 0 listens and the others connect. */
  at: HostPort;
  /** This rank's transport address (HOST:PORT), sent to every rank through the table. */
  address: string;
  /** How long to wait for the others to arrive (and, rank 0 listening, for its port). */
  timeoutMs?: number;
}

type Msg = Record<string, unknown> & { t: string };

function protocolError(message: string): PfrError {
  return new PfrError('ERR_PFR_RENDEZVOUS', message);
}

function rankLost(message: string): PfrError {
  return new PfrError('ERR_PFR_RANK_LOST', message);
}

/** "rank 3" or "ranks 1, 2". */
const ranks = (xs: number[]) => `rank${xs.length === 1 ? '' : 's'} ${xs.join(', ')}`;

const isRank = (v: unknown, size: number): v is number => Number.isInteger(v) && (v as number) >= 0 && (v as number) < size;

/** Check `m`'s keys are exactly `keys` (besides t): a message with anything more or less is malformed. */
function keysOf(m: Msg, keys: string[]): void {
  const got = Object.keys(m)
    .filter((k) => k !== 't')
    .sort();
  const want = [...keys].sort();
  if (got.length !== want.length || got.some((k, i) => k !== want[i]))
    throw protocolError(`a '${m.t}' message must have the fields ${want.join(', ')}, got ${got.join(', ') || 'none'}`);
}

function checkReason(m: Msg): string {
  if (typeof m['reason'] !== 'string' || m['reason'].length > 4096)
    throw protocolError(`an '${m.t}' message's reason must be text (at most 4096 characters)`);
  return m['reason'];
}

/** Frames of one socket: length-prefixed JSON objects, each checked for its length and shape. */
class Framer {
  #buf: Buffer = Buffer.alloc(0);
  constructor(
    private readonly onMessage: (m: Msg) => void,
    private readonly onError: (e: PfrError) => void,
  ) {}

  push(chunk: Buffer): void {
    this.#buf = this.#buf.length ? Buffer.concat([this.#buf, chunk]) : chunk;
    while (this.#buf.length >= 4) {
      const len = this.#buf.readUInt32BE(0);
      if (len === 0 || len > MAX_RENDEZVOUS_FRAME) return this.onError(protocolError(`a frame of ${len} bytes (1..${MAX_RENDEZVOUS_FRAME})`));
      if (this.#buf.length < 4 + len) return;
      const body = this.#buf.subarray(4, 4 + len);
      this.#buf = this.#buf.subarray(4 + len);
      let m: unknown;
      try {
        m = JSON.parse(body.toString('utf8'));
      } catch (e) {
        return this.onError(protocolError(`a frame that is not JSON (${(e as Error).message})`));
      }
      if (m === null || typeof m !== 'object' || Array.isArray(m) || typeof (m as Msg).t !== 'string')
        return this.onError(protocolError('a frame that is not a message (an object with a type t)'));
      this.onMessage(m as Msg);
    }
  }
}

function send(socket: Socket, m: Msg): void {
  const body = Buffer.from(JSON.stringify(m), 'utf8');
  if (body.length > MAX_RENDEZVOUS_FRAME)
    throw protocolError(`a '${m.t}' message of ${body.length} bytes is more than a rendezvous frame carries (${MAX_RENDEZVOUS_FRAME})`);
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  socket.write(Buffer.concat([head, body]));
}

/** One allgather round: the values so far, by rank. */
interface Round {
  values: unknown[];
  have: boolean[];
  count: number;
}

/** A waiter on the rendezvous (the table, or an allgather's answer). */
interface Waiter {
  resolve: (v: unknown[]) => void;
  reject: (e: Error) => void;
}

/**
 * One rank's end of the rendezvous: rank 0 serves it, the others are its clients. After
 * `open`, `addresses` holds every rank's transport address; `allgather` and `barrier` run
 * until `close`. A failure anywhere in the job (a rank gone, a malformed message, a rank
 * that aborted) ends every wait with the reason, and `failed` says it.
 */
export class Rendezvous {
  readonly rank: number;
  readonly size: number;
  /** Every rank's transport address, by rank (once open). */
  addresses: readonly string[] = [];
  /** Messages and connections rank 0 refused from processes that are not the job's ranks. */
  readonly refused: string[] = [];
  #server: Server | undefined;
  #root: Socket | undefined; // a member's connection to rank 0
  #members = new Map<number, Socket>(); // rank 0: the socket of each rank that said hello
  #said = new Set<number>(); // rank 0: ranks that said bye (their close is the normal end)
  #round: Round | undefined;
  #seq = 0;
  #waiter: Waiter | undefined;
  #failed: Error | undefined;
  #failListeners: Array<(e: Error) => void> = [];
  #closed = false;

  private constructor(rank: number, size: number) {
    this.rank = rank;
    this.size = size;
  }

  /** Join the job's rendezvous: rank 0 listens and waits for every rank, the others connect. */
  static async open(o: RendezvousOptions): Promise<Rendezvous> {
    if (!Number.isInteger(o.size) || o.size < 1 || o.size > MAX_JOB_SIZE)
      throw protocolError(`a job's size must be an integer in 1..${MAX_JOB_SIZE}, got ${String(o.size)}`);
    if (!isRank(o.rank, o.size)) throw protocolError(`a rank must be an integer in 0..${o.size - 1}, got ${String(o.rank)}`);
    parseHostPort(o.address, 'the transport address');
    const r = new Rendezvous(o.rank, o.size);
    const timeoutMs = o.timeoutMs ?? DEFAULT_RENDEZVOUS_TIMEOUT_MS;
    try {
      r.addresses = o.rank === 0 ? await r.#serve(o, timeoutMs) : await r.#join(o, timeoutMs);
    } catch (e) {
      await r.close(0);
      throw e;
    }
    return r;
  }

  /** The error the job failed with, if it did. */
  get failed(): Error | undefined {
    return this.#failed;
  }

  /** Hear once when the job fails (a rank gone or aborted, a malformed message). */
  onFailure(listener: (e: Error) => void): void {
    if (this.#failed) queueMicrotask(() => listener(this.#failed!));
    else this.#failListeners.push(listener);
  }

  /** Every rank's `value` (JSON), by rank, once every rank has given its own. */
  allgather(value: unknown, timeoutMs = DEFAULT_RENDEZVOUS_TIMEOUT_MS): Promise<unknown[]> {
    if (this.#failed) return Promise.reject(this.#failed);
    if (this.#closed) return Promise.reject(new PfrError('ERR_PFR_CLOSED', 'the rendezvous is closed'));
    if (this.#waiter) return Promise.reject(protocolError('allgather: one allgather at a time (await the one in progress)'));
    const seq = this.#seq;
    const p = this.#wait(timeoutMs, () =>
      this.rank === 0
        ? `${ranks(this.#missingInRound())} did not reach allgather ${seq} within ${timeoutMs} ms`
        : `rank 0 did not answer allgather ${seq} within ${timeoutMs} ms`,
    );
    if (this.rank === 0) this.#give(0, value);
    else send(this.#root!, { t: 'gather', seq, value: value ?? null });
    return p;
  }

  /** Wait until every rank has reached this barrier. */
  async barrier(timeoutMs = DEFAULT_RENDEZVOUS_TIMEOUT_MS): Promise<void> {
    await this.allgather(null, timeoutMs);
  }

  /** This rank fails: every other rank is told `reason` and fails too. */
  abort(reason: string): void {
    if (this.#failed || this.#closed) return;
    if (this.rank === 0) this.#fail(rankLost(`rank 0 failed: ${reason}`));
    else {
      send(this.#root!, { t: 'abort', reason: reason.slice(0, 4096) });
      this.#fail(rankLost(`rank ${this.rank} failed: ${reason}`), false);
    }
  }

  /**
   * Leave the rendezvous (after the job's last allgather): its connections close without
   * failing anyone. Rank 0 waits (up to `timeoutMs`) for the other ranks to leave first, so
   * that none of them sees it gone before its own close. Idempotent.
   */
  async close(timeoutMs = 5_000): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#waiter?.reject(new PfrError('ERR_PFR_CLOSED', 'the rendezvous was closed'));
    this.#waiter = undefined;
    if (this.#root) {
      if (!this.#root.destroyed && !this.#failed) send(this.#root, { t: 'bye' });
      this.#root.end();
      return;
    }
    const gone = [...this.#members.values()].filter((s) => !s.closed).map((s) => new Promise((r) => s.once('close', r)));
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([Promise.all(gone), new Promise((r) => (timer = setTimeout(r, timeoutMs)))]);
    clearTimeout(timer);
    for (const s of this.#members.values()) s.destroy();
    this.#server?.close();
  }

  #wait(timeoutMs: number, why: () => string): Promise<unknown[]> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiter = undefined;
        const e = protocolError(why());
        this.abort(e.message);
        reject(e);
      }, timeoutMs);
      this.#waiter = {
        resolve: (v) => {
          clearTimeout(timer);
          this.#waiter = undefined;
          resolve(v);
        },
        reject: (e) => {
          clearTimeout(timer);
          this.#waiter = undefined;
          reject(e);
        },
      };
    });
  }

  // The job failed: every wait ends, every rank is told (rank 0 tells them; a member that
  // learned it from rank 0, `tell` false, has nobody to tell).
  #fail(e: Error, tell = true): void {
    if (this.#failed) return;
    this.#failed = e;
    // The job is over: rank 0 tells the ranks still in it why, and lets them go.
    if (this.rank === 0 && tell)
      for (const [r, s] of this.#members) {
        if (!this.#said.has(r) && !s.destroyed) send(s, { t: 'abort', reason: e.message });
        s.end();
      }
    this.#waiter?.reject(e);
    for (const l of this.#failListeners.splice(0)) l(e);
  }

  // ---- rank 0 ----

  #serve(o: RendezvousOptions, timeoutMs: number): Promise<string[]> {
    const addresses: string[] = new Array<string>(o.size);
    addresses[0] = o.address;
    const table = this.#wait(timeoutMs, () => {
      const missing = [...Array(this.size).keys()].filter((r) => r > 0 && !this.#members.has(r));
      return (
        `${ranks(missing)} did not reach the rendezvous at ${o.at.host}:${o.at.port} within ${timeoutMs} ms` +
        (this.refused.length ? ` (refused: ${this.refused.slice(-3).join('; ')})` : '')
      );
    });
    const server = (this.#server = createServer((s) => this.#accept(s, addresses, timeoutMs)));
    server.on('error', (e: NodeJS.ErrnoException) => {
      const hint =
        e.code === 'EADDRINUSE'
          ? ': another job uses it; give this job another (--rendezvous HOST:PORT)'
          : e.code === 'EADDRNOTAVAIL'
            ? ": it is not an address of rank 0's host (the rendezvous is rank 0's)"
            : '';
      this.#waiter?.reject(
        new PfrError('ERR_PFR_RENDEZVOUS', `rank 0 cannot listen on ${o.at.host}:${o.at.port} for the rendezvous${hint} (${e.message})`, {
          cause: e,
        }),
      );
    });
    server.listen(o.at.port, o.at.host);
    if (o.size === 1) queueMicrotask(() => this.#waiter?.resolve(addresses));
    return table as Promise<string[]>;
  }

  #refuse(s: Socket, reason: string): void {
    this.refused.push(reason);
    if (!s.destroyed) send(s, { t: 'refused', reason });
    // Told why, then gone (a stranger that keeps its side open keeps nothing here).
    s.end(() => s.destroy());
  }

  #accept(s: Socket, addresses: string[], timeoutMs: number): void {
    let rank: number | undefined;
    const hello = setTimeout(() => this.#refuse(s, `no hello within ${timeoutMs} ms`), timeoutMs);
    s.on('close', () => {
      clearTimeout(hello);
      if (rank === undefined || this.#said.has(rank) || this.#closed) return;
      this.#fail(rankLost(`rank ${rank} (${addresses[rank]}) went away before the job's end: its process died or was killed`));
    });
    s.on('error', () => undefined); // 'close' follows
    const framer = new Framer(
      (m) => {
        try {
          if (rank === undefined) {
            rank = this.#hello(m, addresses);
            clearTimeout(hello);
            this.#members.set(rank, s);
            if (this.#members.size === this.size - 1) {
              for (const sock of this.#members.values()) send(sock, { t: 'table', addresses });
              this.#waiter?.resolve(addresses);
            }
          } else this.#fromMember(rank, m);
        } catch (e) {
          if (rank === undefined) return this.#refuse(s, (e as Error).message);
          this.#fail(protocolError(`rank ${rank} sent a malformed message: ${(e as Error).message}`));
        }
      },
      (e) => {
        if (rank === undefined) this.#refuse(s, e.message);
        else this.#fail(protocolError(`rank ${rank} sent a malformed message: ${e.message}`));
      },
    );
    // Nothing more is read from a connection refused, or let go when the job failed.
    s.on('data', (d: Buffer) => s.writableEnded || framer.push(d));
  }

  // A connection's first message must be its hello: a rank of this job, not yet arrived.
  #hello(m: Msg, addresses: string[]): number {
    if (m.t !== 'hello') throw protocolError(`a '${m.t}' message before the hello`);
    keysOf(m, ['rank', 'size', 'address']);
    if (m['size'] !== this.size) throw protocolError(`a hello for a job of ${String(m['size'])} ranks (this job has ${this.size})`);
    if (!isRank(m['rank'], this.size) || m['rank'] === 0)
      throw protocolError(`a hello from rank ${String(m['rank'])} (ranks 1..${this.size - 1} connect)`);
    const rank = m['rank'];
    if (this.#members.has(rank)) throw protocolError(`a second hello from rank ${rank}`);
    parseHostPort(m['address'], `rank ${rank}'s address`);
    addresses[rank] = m['address'] as string;
    return rank;
  }

  #fromMember(rank: number, m: Msg): void {
    switch (m.t) {
      case 'gather': {
        keysOf(m, ['seq', 'value']);
        if (m['seq'] !== this.#seq) throw protocolError(`allgather ${String(m['seq'])} while the job is at allgather ${this.#seq}`);
        if (this.#round?.have[rank]) throw protocolError(`a second value for allgather ${this.#seq}`);
        this.#give(rank, m['value']);
        return;
      }
      case 'abort':
        keysOf(m, ['reason']);
        this.#fail(rankLost(`rank ${rank} failed: ${checkReason(m)}`));
        return;
      case 'bye':
        keysOf(m, []);
        this.#said.add(rank);
        return;
      default:
        throw protocolError(`an unknown message type '${m.t}'`);
    }
  }

  #missingInRound(): number[] {
    return [...Array(this.size).keys()].filter((r) => !this.#round?.have[r]);
  }

  #give(rank: number, value: unknown): void {
    const round = (this.#round ??= { values: new Array<unknown>(this.size).fill(null), have: new Array<boolean>(this.size).fill(false), count: 0 });
    round.values[rank] = value ?? null;
    round.have[rank] = true;
    if (++round.count < this.size) return;
    this.#round = undefined;
    const seq = this.#seq++;
    for (const s of this.#members.values()) send(s, { t: 'gathered', seq, values: round.values });
    this.#waiter?.resolve(round.values);
  }

  // ---- ranks 1.. ----

  async #join(o: RendezvousOptions, timeoutMs: number): Promise<string[]> {
    const where = `${o.at.host}:${o.at.port}`;
    const end = performance.now() + timeoutMs;
    // Rank 0 may not listen yet (a launcher starts every rank at once): try again until the timeout.
    for (;;) {
      try {
        this.#root = await connectOnce(o.at, Math.max(1, end - performance.now()));
        break;
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        if ((code !== 'ECONNREFUSED' && code !== 'ENOENT') || performance.now() > end)
          throw new PfrError(
            'ERR_PFR_RENDEZVOUS',
            `rank ${this.rank} cannot reach rank 0's rendezvous at ${where} within ${timeoutMs} ms (${(e as Error).message}): ` +
              'is rank 0 running, and do all ranks have the same rendezvous address (--rendezvous HOST:PORT)?',
            { cause: e },
          );
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    const root = this.#root;
    const table = this.#wait(timeoutMs, () => `rank 0 at ${where} sent no table of the job's addresses within ${timeoutMs} ms`);
    let state: 'table' | 'running' = 'table';
    root.on('error', () => undefined); // 'close' follows
    root.on('close', () => {
      if (!this.#closed) this.#fail(rankLost(`rank 0 (the rendezvous at ${where}) went away before the job's end`), false);
    });
    const malformed = (e: Error) => {
      this.#fail(protocolError(`rank 0 at ${where} sent a malformed message: ${e.message}`), false);
      root.destroy();
    };
    const framer = new Framer((m) => {
      try {
        if (m.t === 'abort') {
          keysOf(m, ['reason']);
          return this.#fail(rankLost(checkReason(m)), false);
        }
        if (m.t === 'refused') {
          keysOf(m, ['reason']);
          return this.#fail(protocolError(`rank 0 at ${where} refused rank ${this.rank}: ${checkReason(m)}`), false);
        }
        if (state === 'table') {
          if (m.t !== 'table') throw protocolError(`a '${m.t}' message before the table`);
          this.#waiter?.resolve(this.#table(m, o.address));
          state = 'running';
          return;
        }
        if (m.t !== 'gathered') throw protocolError(`an unexpected '${m.t}' message`);
        keysOf(m, ['seq', 'values']);
        if (m['seq'] !== this.#seq || !this.#waiter) throw protocolError(`allgather ${String(m['seq'])}'s answer while at allgather ${this.#seq}`);
        const values = m['values'];
        if (!Array.isArray(values) || values.length !== this.size) throw protocolError(`an allgather's answer must hold ${this.size} values`);
        this.#seq++;
        this.#waiter.resolve(values);
      } catch (e) {
        malformed(e as Error);
      }
    }, malformed);
    root.on('data', (d: Buffer) => framer.push(d));
    send(root, { t: 'hello', rank: this.rank, size: this.size, address: o.address });
    return (await table) as string[];
  }

  #table(m: Msg, own: string): string[] {
    keysOf(m, ['addresses']);
    const a = m['addresses'];
    if (!Array.isArray(a) || a.length !== this.size) throw protocolError(`the table must list ${this.size} addresses`);
    a.forEach((x, r) => parseHostPort(x, `rank ${r}'s address in the table`));
    if (a[this.rank] !== own) throw protocolError(`the table gives rank ${this.rank} the address ${String(a[this.rank])}, not its own (${own})`);
    if (new Set(a).size !== a.length) throw protocolError('the table lists an address twice');
    return a as string[];
  }
}

function connectOnce(at: HostPort, timeoutMs: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(at.port, at.host);
    const timer = setTimeout(() => {
      s.destroy();
      reject(Object.assign(new Error(`no answer within ${Math.round(timeoutMs)} ms`), { code: 'ETIMEDOUT' }));
    }, timeoutMs);
    s.once('connect', () => {
      clearTimeout(timer);
      s.setNoDelay(true);
      resolve(s);
    });
    s.once('error', (e) => {
      clearTimeout(timer);
      s.destroy();
      reject(e);
    });
  });
}
