// Redis as the memory server, the way EDM's DMS uses it: one key per page (its address, under
// the pager instance's prefix so several clients share one server), the page bytes with their
// checksum. The client is hiredis inside the addon (native/redis.cc), synchronous with a
// timeout on the DM-Handler's own thread: a fault's fetch is one socket write and one read with
// no event-loop turn in between, and its pages are checked natively into one buffer (measured:
// bench-remote; node-redis's promise per command and RESP3 decoder cost about 2× a C handler).
// An eviction batch is one pipeline of SETs, a prefetch one MGET.
//
// Several memory servers: a Redis Cluster. The store asks a seed node for CLUSTER SLOTS, keeps
// a connection per master and routes each key by its hash slot (native). A page's key carries
// a hash tag, its 256 KiB run (PREFIX:{RUN}:ADDR), so a prefetch batch lands on one shard, in
// one MGET. A MOVED reply (resharding, failover) re-reads the slots.
//
// A server that stops answering is known down after one request fails (a circuit breaker, per
// node): from then on its requests fail at once, instead of a full timeout each, until a PING
// (at most one per probeIntervalMs, sent when a request comes) answers again. A server that
// says "not now" (LOADING its data after a restart, BUSY, TRYAGAIN) is asked again, with a
// backoff, until the request's timeout: a bounded number of retries, then the request fails.
import { redisBinding, type RedisBinding } from '../../native/index.js';
import { PfrError } from '../errors.js';
import { invalidArg } from '../validate.js';
import { ReadStatus, type PageReads, type PageStore, type StoredPage } from './store.js';

/** Where a RedisStore connects and how. */
export interface RedisStoreOptions {
  /** A Unix socket path (preferred on one host; redis-server needs `--unixsocket PATH`), or */
  socket?: string;
  /** host and port (default 127.0.0.1:6379), or */
  host?: string;
  /** TCP port (default 6379). */
  port?: number;
  /** a redis://host:port URL, or */
  url?: string;
  /**
   * the nodes of a Redis Cluster to ask for the slot map (any one answering will do); pages
   * spread over its masters. Run the cluster with `cluster-require-full-coverage no`, so a
   * shard that fails stops only its own pages.
   */
  cluster?: Array<{
    /** A master's host (loopback or an address). */
    host: string;
    /** Its port. */
    port: number;
  }>;
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

// Error replies that mean "ask again shortly", and the first pause before asking again (doubled each time, at most 200 ms).
const TRANSIENT = /^(LOADING|BUSY|TRYAGAIN|MASTERDOWN)\b/;
const RETRY_MS = 10;

// Keys per pipeline at close: a request stays small while a pager's thousands of keys go in a few round trips.
const UNLINK_BATCH = 1000;

/** A cluster key's hash tag is the page's run of 2^18 bytes (256 KiB: 64 pages of 4 KiB): one prefetch window, one shard. */
export const CLUSTER_RUN_SHIFT = 18;

/** One server: its connection and its breaker. */
interface Node {
  where: string;
  host: string;
  port: number;
  path: string;
  handle: number;
  // The breaker: set while the server is known down.
  down?: { since: number; why: string; probedAt: number; probes: number };
}

const where = (o: RedisStoreOptions): string => (o.url ? o.url : o.socket ? `unix:${o.socket}` : `${o.host ?? '127.0.0.1'}:${o.port ?? 6379}`);

/** What Redis said (an error reply) or why it did not answer, as a library error with a code. */
function storeError(msg: string, what: string, at: string, refused: boolean, cause?: unknown): PfrError {
  if (/OOM|maxmemory/i.test(msg)) {
    return new PfrError(
      'ERR_PFR_STORE_FULL',
      `${what}: the Redis server is full (maxmemory reached with policy noeviction): give it more memory (CONFIG SET maxmemory), ` +
        'free keys of other applications, or keep more pages resident',
      { cause },
    );
  }
  if (refused) return new PfrError('ERR_PFR_STORE_UNAVAILABLE', `${what}: the Redis server at ${at} refused: ${msg}`, { cause });
  return new PfrError('ERR_PFR_STORE_UNAVAILABLE', `${what}: the Redis server at ${at} did not answer (${msg}); is it running and reachable?`, {
    cause,
  });
}

/** Why connecting failed, naming what is missing: the socket file, or a listener. */
function connectError(err: unknown, o: RedisStoreOptions, at: string): PfrError {
  const code = (err as { code?: string }).code;
  if (code === 'ERR_HIREDIS_MISSING') return new PfrError('ERR_PFR_UNSUPPORTED', `RedisStore.connect: ${(err as Error).message}`, { cause: err });
  if (o.socket && code === 'ENOENT') {
    return new PfrError(
      'ERR_PFR_STORE_UNAVAILABLE',
      `RedisStore.connect: no Redis socket at ${o.socket}: start redis-server with --unixsocket ${o.socket} ` +
        "(Debian's redis-server listens on 127.0.0.1:6379 only), or give { host, port }",
      { cause: err },
    );
  }
  if (code === 'ECONNREFUSED') {
    return new PfrError('ERR_PFR_STORE_UNAVAILABLE', `RedisStore.connect: nothing listens at ${at} (ECONNREFUSED): is redis-server running?`, {
      cause: err,
    });
  }
  if (code === 'EACCES') {
    return new PfrError(
      'ERR_PFR_STORE_UNAVAILABLE',
      `RedisStore.connect: no permission to connect to ${at} (EACCES): see redis-server's unixsocketperm`,
      {
        cause: err,
      },
    );
  }
  return storeError((err as Error).message, 'RedisStore.connect', at, false, err);
}

/** host and port of a redis:// URL. */
function parseUrl(url: string): { host: string; port: number } {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw invalidArg(`RedisStore.connect: url ${JSON.stringify(url)} is not a URL; give redis://host:port`);
  }
  if (u.protocol !== 'redis:' || u.username || u.password || (u.pathname && u.pathname !== '/')) {
    throw invalidArg(`RedisStore.connect: url ${JSON.stringify(url)}: only redis://host:port is supported (no user, password or database)`);
  }
  return { host: u.hostname || '127.0.0.1', port: u.port ? Number(u.port) : 6379 };
}

export class RedisStore implements PageStore {
  /** Store name, as stats and errors print it. */
  readonly name: 'redis' | 'redis-cluster';
  /** The prefix of every key this store reads and writes. */
  readonly prefix: string;
  /** A request not answered in this time fails, ms. */
  readonly timeoutMs: number;
  /** While the server is down, at most one PING in this time (ms) checks whether it is back. */
  readonly probeIntervalMs: number;
  /** Where the server is (for messages): the seed nodes of a cluster. */
  readonly where: string;
  #redis: RedisBinding;
  #nodes: Node[] = [];
  // A cluster's slot -> node index (empty: one server, node 0), and the hash tag shift (0: no tags).
  #slotNode = new Int32Array(0);
  #tagShift = 0;
  #handles = new Int32Array(0);
  #closed = false;

  private constructor(redis: RedisBinding, o: RedisStoreOptions, timeoutMs: number, cluster: boolean) {
    this.#redis = redis;
    this.name = cluster ? 'redis-cluster' : 'redis';
    this.prefix = o.prefix ?? 'pfr';
    this.timeoutMs = timeoutMs;
    this.probeIntervalMs = o.probeIntervalMs ?? 1000;
    this.where = cluster ? `cluster ${o.cluster!.map((n) => `${n.host}:${n.port}`).join(',')}` : where(o);
    this.#tagShift = cluster ? CLUSTER_RUN_SHIFT : 0;
  }

  /** Connect (to every master of a cluster); fails with ERR_PFR_STORE_UNAVAILABLE, naming what is missing, if the server does not answer in time. */
  static async connect(options: RedisStoreOptions = {}): Promise<RedisStore> {
    const timeoutMs = options.timeoutMs ?? 2000;
    let redis: RedisBinding;
    try {
      redis = redisBinding();
    } catch (err) {
      throw connectError(err, options, where(options));
    }
    const cluster = options.cluster !== undefined;
    if (cluster && (!Array.isArray(options.cluster) || options.cluster.length === 0))
      throw invalidArg('RedisStore.connect: cluster must be a non-empty array of { host, port }');
    if (cluster && /[{}]/.test(options.prefix ?? ''))
      throw invalidArg("RedisStore.connect: a cluster prefix must not contain { or }: the pages' hash tags follow it");
    const store = new RedisStore(redis, options, timeoutMs, cluster);
    if (!cluster) {
      const t = options.url ? parseUrl(options.url) : { host: options.host ?? '127.0.0.1', port: options.port ?? 6379 };
      store.#nodes = [store.#open(options.socket ?? '', t.host, t.port, where(options), (err) => connectError(err, options, where(options)))];
      store.#handles = Int32Array.of(store.#nodes[0]!.handle);
      return store;
    }
    let last: unknown;
    for (const seed of options.cluster!) {
      try {
        store.#readSlots(seed);
        return store;
      } catch (err) {
        last = err;
      }
    }
    store.#closeAll();
    throw last instanceof PfrError ? last : connectError(last, options, store.where);
  }

  #open(path: string, host: string, port: number, at: string, fail: (err: unknown) => PfrError): Node {
    try {
      return { where: at, host, port, path, handle: this.#redis.redisConnect(path, host, port, this.timeoutMs) };
    } catch (err) {
      throw fail(err);
    }
  }

  // CLUSTER SLOTS from `seed` (or any node known): a connection per master, the slot table.
  #readSlots(seed?: { host: string; port: number }): void {
    let slots: unknown;
    if (seed) {
      const n = this.#open('', seed.host, seed.port, `${seed.host}:${seed.port}`, (err) => connectError(err, {}, `${seed.host}:${seed.port}`));
      try {
        slots = this.#redis.redisCommand(n.handle, ['CLUSTER', 'SLOTS'], this.timeoutMs);
      } finally {
        this.#redis.redisClose(n.handle);
      }
    } else {
      const up = this.#nodes.find((n) => !n.down);
      if (!up) return;
      slots = this.#redis.redisCommand(up.handle, ['CLUSTER', 'SLOTS'], this.timeoutMs);
    }
    if (!Array.isArray(slots) || slots.length === 0)
      throw new PfrError(
        'ERR_PFR_STORE_UNAVAILABLE',
        `RedisStore.connect: ${this.where} answered CLUSTER SLOTS with no slots: is the cluster created (redis-cli --cluster create)?`,
      );
    const table = new Int32Array(16384).fill(-1);
    for (const entry of slots as [number, number, [Buffer, number]][]) {
      const [from, to, [ip, port]] = entry;
      const host = ip.toString() || seed?.host || '127.0.0.1';
      let i = this.#nodes.findIndex((n) => n.host === host && n.port === port);
      if (i < 0) {
        i = this.#nodes.push(this.#open('', host, port, `${host}:${port}`, (err) => connectError(err, {}, `${host}:${port}`))) - 1;
      }
      table.fill(i, from, to + 1);
    }
    this.#slotNode = table;
    this.#handles = new Int32Array(this.#nodes.length);
  }

  /** The key of a page in the store: PREFIX:ADDR, or PREFIX:{RUN}:ADDR in a cluster. */
  fullKey(key: string): string {
    return this.#tagShift ? `${this.prefix}:{${(BigInt(`0x${key}`) >> BigInt(this.#tagShift)).toString(16)}}:${key}` : `${this.prefix}:${key}`;
  }

  async readPages(r: PageReads): Promise<void> {
    r.messages = await this.#request('MGET', () => {
      const m = this.#redis.redisFetch(
        this.#live(),
        this.#slotNode,
        this.prefix,
        this.#tagShift,
        r.addresses,
        r.versions,
        r.count,
        r.seed,
        r.pageSize,
        r.out,
        r.status,
        r.crcs,
        r.detail,
        this.timeoutMs,
      );
      if (!m) return { result: m, failures: undefined };
      const unreachable: (string | undefined)[] = [];
      for (let i = 0; i < r.count; i++) if (r.status[i] === ReadStatus.UNREACHABLE) unreachable[this.#nodeOfAddress(r.addresses[i]!)] ??= m[i];
      return { result: m, failures: this.#failures('MGET', m, unreachable) };
    });
    if (!r.messages) return;
    for (let i = 0; i < r.count; i++) {
      const s = r.status[i]!;
      if (s !== ReadStatus.DOWN && s !== ReadStatus.REFUSED && s !== ReadStatus.UNREACHABLE) continue;
      const node = this.#nodes[this.#nodeOfAddress(r.addresses[i]!)]; // none: a slot no master serves
      r.messages[i] =
        s === ReadStatus.DOWN && node?.down
          ? this.#downError('MGET', node).message
          : storeError(r.messages[i] ?? '', 'RedisStore: MGET', node?.where ?? this.where, s === ReadStatus.REFUSED).message;
    }
  }

  async getMany(keys: string[]): Promise<(Buffer | null)[]> {
    // Not the fault path (readPages is): a key at a time, for any caller of the PageStore interface.
    return keys.map((k) => {
      const full = this.fullKey(k);
      const node = this.#nodes[this.#nodeOfKey(full)];
      if (!node) throw storeError('no node serves its hash slot', 'RedisStore: GET', this.where, false);
      try {
        return this.#redis.redisCommand(node.handle, ['GET', full], this.timeoutMs) as Buffer | null;
      } catch (err) {
        throw storeError((err as Error).message, 'RedisStore: GET', node.where, (err as { code?: string }).code === 'ERR_REDIS_REPLY', err);
      }
    });
  }

  async setMany(pages: StoredPage[]): Promise<void> {
    if (pages.length)
      await this.#write(
        'SET',
        pages.map((p) => this.fullKey(p.key)),
        pages.map((p) => p.value),
      );
  }

  async deleteMany(keys: string[]): Promise<number> {
    let n = 0;
    for (let i = 0; i < keys.length; i += UNLINK_BATCH)
      n += await this.#write(
        'UNLINK',
        keys.slice(i, i + UNLINK_BATCH).map((k) => this.fullKey(k)),
        null,
      );
    return n;
  }

  // One `command key [value]` per key, pipelined; resolves to the sum of the integer replies, or throws the first failure.
  async #write(what: string, keys: string[], values: Buffer[] | null): Promise<number> {
    let sum = 0;
    const messages = await this.#request(what, () => {
      const [s, m, unreachable] = this.#redis.redisWrite(this.#live(), this.#slotNode, what, keys, values, this.timeoutMs);
      sum = s;
      return { result: m, failures: m && this.#failures(what, m, unreachable) };
    });
    const i = messages?.findIndex((m) => m !== undefined) ?? -1;
    if (i < 0) return sum;
    const node = this.#nodes[this.#nodeOfKey(keys[i]!)];
    if (node?.down && messages![i] === 'down') throw this.#downError(what, node);
    throw storeError(messages![i]!, `RedisStore: ${what}`, node?.where ?? this.where, !node?.down);
  }

  /** Disconnect. Idempotent. */
  async close(): Promise<void> {
    this.#closeAll();
  }

  #closeAll(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const n of this.#nodes) this.#redis.redisClose(n.handle);
  }

  #nodeOfAddress(address: number): number {
    return this.#slotNode.length ? this.#nodeOfKey(this.fullKey(address.toString(16))) : 0;
  }

  #nodeOfKey(full: string): number {
    return this.#slotNode.length ? this.#slotNode[this.#redis.redisKeySlot(full)]! : 0;
  }

  // The handles to send on: -1 for a node known down, unless a PING now finds it back (at most one per probeIntervalMs).
  #live(): Int32Array {
    const now = Date.now();
    this.#nodes.forEach((n, i) => {
      const d = n.down;
      if (d && now - d.probedAt >= this.probeIntervalMs) {
        d.probedAt = now;
        d.probes++;
        try {
          this.#redis.redisCommand(n.handle, ['PING'], this.timeoutMs);
          n.down = undefined;
        } catch (err) {
          // Any answer will do, an error reply too (LOADING after a restart): the requests retry those.
          if ((err as { code?: string }).code === 'ERR_REDIS_REPLY') n.down = undefined;
        }
      }
      this.#handles[i] = n.down ? -1 : n.handle;
    });
    return this.#handles;
  }

  // What failed in a request's answer: transient refusals (ask again), MOVED (re-read the
  // slots); the nodes that did not answer get their breaker opened.
  #failures(what: string, messages: (string | undefined)[], unreachable: (string | undefined)[]): { transient: boolean; moved: boolean } {
    let transient = false,
      moved = false;
    for (const m of messages) {
      if (m === undefined) continue;
      if (/^MOVED /.test(m)) moved = true;
      else if (TRANSIENT.test(m)) transient = true;
    }
    unreachable.forEach((why, i) => {
      const n = this.#nodes[i];
      if (why !== undefined && n) n.down ??= { since: Date.now(), why: `${what}: ${why}`, probedAt: Date.now(), probes: 0 };
    });
    return { transient, moved };
  }

  // One request, asked again while the server says "not now" (until the timeout) and once after a MOVED.
  async #request<T extends (string | undefined)[] | undefined>(
    what: string,
    send: () => { result: T; failures: { transient: boolean; moved: boolean } | undefined },
  ): Promise<T> {
    if (this.#closed) throw new PfrError('ERR_PFR_CLOSED', `RedisStore: ${what}: the store is closed`);
    const end = Date.now() + this.timeoutMs;
    let moved = false;
    for (let tries = 1, pause = RETRY_MS; ; tries++, pause = Math.min(pause * 2, 200)) {
      const { result, failures } = send();
      if (!failures) return result;
      if (failures.moved && !moved) {
        moved = true;
        try {
          this.#readSlots();
        } catch {
          // the next answer says what is wrong
        }
        continue;
      }
      if (!failures.transient || Date.now() + pause >= end) {
        if (tries > 1)
          for (const [i, m] of (result ?? []).entries()) if (m !== undefined) result![i] = `${m} (asked ${tries} times in ${this.timeoutMs} ms)`;
        return result;
      }
      await new Promise((r) => setTimeout(r, pause));
    }
  }

  #downError(what: string, node: Node): PfrError {
    const d = node.down!;
    return new PfrError(
      'ERR_PFR_STORE_UNAVAILABLE',
      `RedisStore: ${what}: the Redis server at ${node.where} has been down for ${((Date.now() - d.since) / 1000).toFixed(1)} s (${d.why}); ` +
        `requests fail at once until it answers a PING again (${d.probes} tried so far, one at most every ${this.probeIntervalMs} ms, ` +
        `each waiting ${this.timeoutMs} ms)`,
    );
  }
}
