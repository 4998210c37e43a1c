// Redis as the memory server, the way EDM's DMS uses it: one key per page (its address, under
// a prefix per application so several clients share one server), GET/SET of the page bytes
// with their checksum. node-redis (the `redis` package) is the client: maintained by Redis
// itself, binary-safe with a type mapping, and it pipelines every command issued in the same
// tick, so an eviction batch goes out as one write and a prefetch as one MGET.
import { createClient, RESP_TYPES } from 'redis';
import { PfrError } from '../errors.js';
import type { PageStore, StoredPage } from './store.js';

/** Where a RedisStore connects and how. */
export interface RedisStoreOptions {
  /** A Unix socket path (preferred on one host), or */
  socket?: string;
  /** host and port (default 127.0.0.1:6379), or */
  host?: string;
  /** TCP port (default 6379). */
  port?: number;
  /** a redis:// URL. */
  url?: string;
  /** Key prefix of this application (several clients share one server). Default 'pfr'. */
  prefix?: string;
  /** Per request: a request not answered in this time fails (ms). Default 2000. */
  timeoutMs?: number;
}

type Client = ReturnType<typeof connectClient>;

function connectClient(o: RedisStoreOptions) {
  const socket = o.socket
    ? { path: o.socket, reconnectStrategy: (n: number) => Math.min(50 * 2 ** n, 500) }
    : { host: o.host ?? '127.0.0.1', port: o.port ?? 6379, reconnectStrategy: (n: number) => Math.min(50 * 2 ** n, 500) };
  return createClient(o.url ? { url: o.url } : { socket }).withTypeMapping({ [RESP_TYPES.BLOB_STRING]: Buffer });
}

/** What Redis said, as a library error with a code. */
function storeError(err: unknown, what: string): PfrError {
  const msg = err instanceof Error ? err.message : String(err);
  if (/OOM|maxmemory/i.test(msg)) {
    return new PfrError(
      'ERR_PFR_STORE_FULL',
      `${what}: the Redis server is full (maxmemory reached with policy noeviction): give it more memory (CONFIG SET maxmemory), ` +
        'free keys of other applications, or keep more pages resident',
      { cause: err },
    );
  }
  return new PfrError('ERR_PFR_STORE_UNAVAILABLE', `${what}: the Redis server did not answer (${msg}); is it running and reachable?`, { cause: err });
}

export class RedisStore implements PageStore {
  /** Store name, as stats and errors print it. */
  readonly name = 'redis';
  /** Key prefix of this application's pages. */
  readonly prefix: string;
  /** A request not answered in this time fails, ms. */
  readonly timeoutMs: number;
  #client: Client;

  private constructor(client: Client, prefix: string, timeoutMs: number) {
    this.#client = client;
    this.prefix = prefix;
    this.timeoutMs = timeoutMs;
    // Connection errors surface as failed requests (with their own codes); the client
    // reconnects by itself, so a restarted server is used again without a new store.
    client.on('error', () => undefined);
  }

  /** Connect; fails with ERR_PFR_STORE_UNAVAILABLE if the server does not answer in time. */
  static async connect(options: RedisStoreOptions = {}): Promise<RedisStore> {
    const timeoutMs = options.timeoutMs ?? 2000;
    const client = connectClient(options);
    client.on('error', () => undefined);
    try {
      await withTimeout(client.connect(), timeoutMs, 'connect');
    } catch (err) {
      client.destroy();
      throw storeError(err, 'RedisStore.connect');
    }
    return new RedisStore(client, options.prefix ?? 'pfr', timeoutMs);
  }

  async getMany(keys: string[]): Promise<(Buffer | null)[]> {
    if (!keys.length) return [];
    try {
      return (await withTimeout(this.#client.mGet(keys.map((k) => `${this.prefix}:${k}`)), this.timeoutMs, 'MGET')) as (Buffer | null)[];
    } catch (err) {
      throw storeError(err, 'RedisStore.getMany');
    }
  }

  async setMany(pages: StoredPage[]): Promise<void> {
    if (!pages.length) return;
    try {
      // One SET per page, issued in one tick: node-redis sends them as one pipeline.
      await withTimeout(Promise.all(pages.map((p) => this.#client.set(`${this.prefix}:${p.key}`, p.value))), this.timeoutMs, 'SET');
    } catch (err) {
      throw storeError(err, 'RedisStore.setMany');
    }
  }

  /** Disconnect (forcibly if the server does not answer within a second). */
  async close(): Promise<void> {
    try {
      await withTimeout(this.#client.close(), 1000, 'close');
    } catch {
      this.#client.destroy();
    }
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
