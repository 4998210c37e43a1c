// Redis as the memory server, the way EDM's DMS uses it: one key per page (its address, under
// the pager instance's prefix so several clients share one server), GET/SET of the page bytes
// with their checksum. node-redis (the `redis` package) is the client: maintained by Redis
// itself, binary-safe with a type mapping, and it pipelines every command issued in the same
// tick, so an eviction batch goes out as one write and a prefetch as one MGET.
//
// A server that stops answering is known down after one request times out (a circuit
// breaker): from then on requests fail at once, instead of a full timeout each, until a PING
// (at most one per probeIntervalMs, sent when a request comes) answers again. A server that
// says "not now" (LOADING its data after a restart, BUSY, TRYAGAIN) is asked again, with a
// backoff, until the request's timeout: a bounded number of retries, then the request fails.
import { createClient, ErrorReply, RESP_TYPES } from 'redis';
import { PfrError } from '../errors.js';
import type { PageStore, StoredPage } from './store.js';

/** Where a RedisStore connects and how. */
export interface RedisStoreOptions {
  /** A Unix socket path (preferred on one host; redis-server needs `--unixsocket PATH`), or */
  socket?: string;
  /** host and port (default 127.0.0.1:6379), or */
  host?: string;
  /** TCP port (default 6379). */
  port?: number;
  /** a redis:// URL. */
  url?: string;
  /**
   * Key prefix of this application (several clients share one server). Default 'pfr'. Each
   * pager adds an instance id of its own (`RemotePager.keyPrefix`), so no pager reads another's pages.
   */
  prefix?: string;
  /** Per request: a request not answered in this time fails (ms). Default 2000. */
  timeoutMs?: number;
  /** Once the server is known down, how often a request may try a PING to find it back (ms). Default 1000. */
  probeIntervalMs?: number;
  /**
   * Leave the pager's keys in Redis at close (for inspection), instead of deleting them. No
   * pager reads them again: a new pager has a new instance id, and the versions that make a
   * stored page trustworthy live in the pager that wrote it. Default false.
   */
  persist?: boolean;
}

type Client = ReturnType<typeof connectClient>;

// Error replies that mean "ask again shortly", and the first pause before asking again (doubled each time, at most 200 ms).
const TRANSIENT = /^(LOADING|BUSY|TRYAGAIN|MASTERDOWN)\b/;
const RETRY_MS = 10;

// Keys per UNLINK at close: one command stays small while a pager's thousands of keys go in a few round trips.
const UNLINK_BATCH = 1000;

function connectClient(o: RedisStoreOptions) {
  const reconnectStrategy = (n: number) => Math.min(50 * 2 ** n, 500);
  const socket = o.socket ? { path: o.socket, reconnectStrategy } : { host: o.host ?? '127.0.0.1', port: o.port ?? 6379, reconnectStrategy };
  return createClient(o.url ? { url: o.url } : { socket }).withTypeMapping({ [RESP_TYPES.BLOB_STRING]: Buffer });
}

const where = (o: RedisStoreOptions): string => (o.url ? o.url : o.socket ? `unix:${o.socket}` : `${o.host ?? '127.0.0.1'}:${o.port ?? 6379}`);

/** What Redis said, as a library error with a code. */
function storeError(err: unknown, what: string, at: string): PfrError {
  const msg = err instanceof Error ? err.message : String(err);
  if (/OOM|maxmemory/i.test(msg)) {
    return new PfrError(
      'ERR_PFR_STORE_FULL',
      `${what}: the Redis server is full (maxmemory reached with policy noeviction): give it more memory (CONFIG SET maxmemory), ` +
        'free keys of other applications, or keep more pages resident',
      { cause: err },
    );
  }
  if (err instanceof ErrorReply)
    return new PfrError('ERR_PFR_STORE_UNAVAILABLE', `${what}: the Redis server at ${at} refused: ${msg}`, { cause: err });
  return new PfrError('ERR_PFR_STORE_UNAVAILABLE', `${what}: the Redis server at ${at} did not answer (${msg}); is it running and reachable?`, {
    cause: err,
  });
}

/** Why connecting failed, naming what is missing: the socket file, or a listener. */
function connectError(err: unknown, o: RedisStoreOptions): PfrError {
  const code = (err as { code?: string }).code;
  if (o.socket && code === 'ENOENT') {
    return new PfrError(
      'ERR_PFR_STORE_UNAVAILABLE',
      `RedisStore.connect: no Redis socket at ${o.socket}: start redis-server with --unixsocket ${o.socket} ` +
        "(Debian's redis-server listens on 127.0.0.1:6379 only), or give { host, port }",
      { cause: err },
    );
  }
  if (code === 'ECONNREFUSED') {
    return new PfrError('ERR_PFR_STORE_UNAVAILABLE', `RedisStore.connect: nothing listens at ${where(o)} (ECONNREFUSED): is redis-server running?`, {
      cause: err,
    });
  }
  if (code === 'EACCES') {
    return new PfrError(
      'ERR_PFR_STORE_UNAVAILABLE',
      `RedisStore.connect: no permission to connect to ${where(o)} (EACCES): see redis-server's unixsocketperm`,
      {
        cause: err,
      },
    );
  }
  return storeError(err, 'RedisStore.connect', where(o));
}

export class RedisStore implements PageStore {
  /** Store name, as stats and errors print it. */
  readonly name = 'redis';
  /** The prefix of every key this store reads and writes. */
  readonly prefix: string;
  /** A request not answered in this time fails, ms. */
  readonly timeoutMs: number;
  /** While the server is down, at most one PING in this time (ms) checks whether it is back. */
  readonly probeIntervalMs: number;
  /** Where the server is (for messages). */
  readonly where: string;
  #client: Client;
  // The breaker: set while the server is known down.
  #down: { since: number; why: string; probedAt: number; probes: number; probe?: Promise<boolean> } | undefined;

  private constructor(client: Client, o: RedisStoreOptions, timeoutMs: number) {
    this.#client = client;
    this.prefix = o.prefix ?? 'pfr';
    this.timeoutMs = timeoutMs;
    this.probeIntervalMs = o.probeIntervalMs ?? 1000;
    this.where = where(o);
    // Connection errors surface as failed requests (with their own codes); the client
    // reconnects by itself, so a restarted server is used again without a new store.
    client.on('error', () => undefined);
  }

  /** Connect; fails with ERR_PFR_STORE_UNAVAILABLE, naming what is missing, if the server does not answer in time. */
  static async connect(options: RedisStoreOptions = {}): Promise<RedisStore> {
    const timeoutMs = options.timeoutMs ?? 2000;
    const client = connectClient(options);
    // The client retries a failed connect by itself; its first socket error says why at once.
    let onError!: (e: unknown) => void;
    const refused = new Promise<never>((_, reject) => (onError = reject));
    client.on('error', (e: unknown) => onError(e));
    try {
      await withTimeout(Promise.race([client.connect(), refused]), timeoutMs, 'connect');
    } catch (err) {
      client.destroy();
      throw connectError(err, options);
    } finally {
      client.removeAllListeners('error');
    }
    return new RedisStore(client, options, timeoutMs);
  }

  async getMany(keys: string[]): Promise<(Buffer | null)[]> {
    if (!keys.length) return [];
    return (await this.#request('MGET', () => this.#client.mGet(keys.map((k) => `${this.prefix}:${k}`)))) as (Buffer | null)[];
  }

  async setMany(pages: StoredPage[]): Promise<void> {
    if (!pages.length) return;
    // One SET per page, issued in one tick: node-redis sends them as one pipeline.
    await this.#request('SET', () => Promise.all(pages.map((p) => this.#client.set(`${this.prefix}:${p.key}`, p.value))));
  }

  async deleteMany(keys: string[]): Promise<number> {
    let n = 0;
    for (let i = 0; i < keys.length; i += UNLINK_BATCH) {
      const batch = keys.slice(i, i + UNLINK_BATCH).map((k) => `${this.prefix}:${k}`);
      n += await this.#request('UNLINK', () => this.#client.unlink(batch));
    }
    return n;
  }

  /** Disconnect (forcibly if the server does not answer within a second). */
  async close(): Promise<void> {
    try {
      await withTimeout(this.#client.close(), 1000, 'close');
    } catch {
      this.#client.destroy();
    }
  }

  async #request<T>(what: string, send: () => Promise<T>): Promise<T> {
    if (this.#down && !(await this.#probe())) throw this.#downError(what);
    const end = Date.now() + this.timeoutMs;
    try {
      for (let tries = 1, pause = RETRY_MS; ; tries++, pause = Math.min(pause * 2, 200)) {
        try {
          return await withTimeout(send(), Math.max(1, end - Date.now()), what);
        } catch (err) {
          if (!(err instanceof ErrorReply && TRANSIENT.test(err.message)) || Date.now() + pause >= end) {
            if (tries > 1 && err instanceof ErrorReply) err.message += ` (asked ${tries} times in ${this.timeoutMs} ms)`;
            throw err;
          }
          await new Promise((r) => setTimeout(r, pause));
        }
      }
    } catch (err) {
      const e = storeError(err, `RedisStore: ${what}`, this.where);
      // A refusal (an error reply: full, wrong type) comes from a server that is up.
      if (!(err instanceof ErrorReply))
        this.#down ??= { since: Date.now(), why: `${what}: ${(err as Error).message}`, probedAt: Date.now(), probes: 0 };
      throw e;
    }
  }

  // Half-open: one PING at a time, at most one per probeIntervalMs; the requests that come
  // meanwhile share its answer or fail at once.
  async #probe(): Promise<boolean> {
    const d = this.#down!;
    if (!d.probe) {
      if (Date.now() - d.probedAt < this.probeIntervalMs) return false;
      d.probedAt = Date.now();
      d.probes++;
      // Any answer will do, an error reply too (LOADING after a restart): the requests retry those.
      d.probe = withTimeout(this.#client.ping(), this.timeoutMs, 'PING').then(
        () => true,
        (e: unknown) => e instanceof ErrorReply,
      );
      void d.probe.then(() => (d.probe = undefined));
    }
    const up = await d.probe;
    if (up && this.#down === d) this.#down = undefined;
    return up;
  }

  #downError(what: string): PfrError {
    const d = this.#down!;
    return new PfrError(
      'ERR_PFR_STORE_UNAVAILABLE',
      `RedisStore: ${what}: the Redis server at ${this.where} has been down for ${((Date.now() - d.since) / 1000).toFixed(1)} s (${d.why}); ` +
        `requests fail at once until it answers a PING again (${d.probes} tried so far, one at most every ${this.probeIntervalMs} ms, ` +
        `each waiting ${this.timeoutMs} ms)`,
    );
  }
}

async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
