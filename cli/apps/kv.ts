// A key-value server and its clients, memcached-like, the ODP paper's overcommit case. Rank 0
// serves a store of `keys` fixed-size values in one region registered under the trial's
// policy; every other rank is a client doing `batch` operations per step, one at a time:
//   SET: a SEND carrying the key, its new version and the value; the server copies the value
//        into the store and answers with a SEND.
//   GET: a SEND asking for the key; the server answers with the value's version, and the client
//        RDMA-READs the value straight out of the server's store (faults there under ODP).
// Each client works on its own keys (key ≡ client − 1 mod clients), so no two clients race
// on a value: it knows every version it set, and checks every GET (the version the server
// answers and every byte read). A value never set reads as zeros: the store is never
// initialised, so only the values used become resident (demand paging by actual use).
// Pinned, the server may lock only `memlockBytes` (RLIMIT_MEMLOCK): it registers the part of
// the store that fits (a shard) and refuses the keys beyond it; under ODP it serves them all.
import { PAGE_SIZE, SendFlags, WrOpcode } from '../../lib/index.js';
import { TrialBuffers } from './buffers.js';
import { Completions, countFaults, faultCount, FIRST_STEPS, type Kernel, newOutcome } from './kernel.js';
import { exchangeBuffers } from './world.js';

/** The key-value store's own parameters. */
export interface KvParams {
  /** Keys in the store (its size: keys × valueBytes). */
  keys: number;
  /** Bytes of each value (a whole number of pages). */
  valueBytes: number;
  /** Operations per client per step. */
  batch: number;
  /** What a pinned server may lock (RLIMIT_MEMLOCK), bytes; Infinity: no limit. */
  memlockBytes: number;
}

const HEADER = 64;
const OP_GET = 1;
const OP_SET = 2;
const OK = 0;
const REFUSED = 1;
// One SET in SET_EVERY operations; the rest are GETs (a read-mostly cache).
const SET_EVERY = 8;

/** The byte every position of `key`'s value holds at `version` (0: never set, zeros). */
function fillByte(key: number, version: number): number {
  return version === 0 ? 0 : ((key * 7 + version * 13 + 1) % 255) + 1;
}

/** One rank of the key-value job: rank 0 the server, the others clients; a step is `batch` operations per client. */
export const kv: Kernel<KvParams> = async (w, t, p) => (w.rank === 0 ? server(w, t, p) : client(w, t, p));

/** Keys the pinned server can lock, or all of them under ODP. */
function served(t: { policy: string }, p: KvParams): number {
  return t.policy === 'pin' ? Math.min(p.keys, Math.floor(p.memlockBytes / p.valueBytes)) : p.keys;
}

const server: Kernel<KvParams> = async (w, t, p) => {
  const clients = w.size - 1;
  const slot = Math.ceil((HEADER + p.valueBytes) / PAGE_SIZE) * PAGE_SIZE;
  const keysServed = served(t, p);
  const bufs = new TrialBuffers(w, t.policy, t.evictEachStep);
  try {
    // Pinned, only the shard that fits under the limit is registered (and locked); remote-paged,
    // the whole store is served but no more of it stays resident than a pinned server may lock.
    const { region: store, mr: storeMr } = await bufs.map(p.keys * p.valueBytes, {
      registerBytes: keysServed * p.valueBytes,
      ...(Number.isFinite(p.memlockBytes) ? { residentLimit: Math.max(PAGE_SIZE, Math.floor(p.memlockBytes / PAGE_SIZE) * PAGE_SIZE) } : {}),
    });
    const { region: inbox, mr: inMr } = await bufs.map(w.size * slot);
    const { region: outbox, mr: outMr } = await bufs.map(w.size * PAGE_SIZE);
    await exchangeBuffers(w, storeMr);
    const done = new Completions(w);
    const byQp = new Map<number, number>();
    const post = (c: number): void =>
      w.qps[c]!.postRecv({ wrId: c, sgList: [{ addr: inMr.addr + BigInt(c * slot), length: slot, lkey: inMr.lkey }] });
    for (let c = 1; c <= clients; c++) {
      byQp.set(w.qps[c]!.qpNum, c);
      post(c);
    }
    const versions = new Uint32Array(p.keys);
    const heard = new Array<number>(w.size).fill(0);
    // Refusals are counted by the clients (once each).
    const me = newOutcome(0, { refused: 0 });
    const before = faultCount(w);
    let steady = before;
    await w.barrier();
    for (let step = 0; step < t.steps; step++) {
      if (step === FIRST_STEPS) steady = faultCount(w);
      await bufs.evict();
      const t0 = performance.now();
      for (let n = 0; n < clients * p.batch; n++) {
        const wc = await done.receive();
        const c = byQp.get(wc.qpNum)!;
        const req = new DataView(inbox.buffer, c * slot, HEADER);
        const [op, key, version] = [req.getUint32(0, true), req.getUint32(4, true), req.getUint32(8, true)];
        const ok = key < keysServed;
        if (ok && op === OP_SET) {
          Buffer.from(inbox.buffer, c * slot + HEADER, p.valueBytes).copy(Buffer.from(store.buffer, key * p.valueBytes, p.valueBytes));
          versions[key] = version;
        }
        // The next request of this client may come as soon as it has the answer; none is left
        // posted after its last (the next trial's buffers are others).
        if (++heard[c]! < t.steps * p.batch) post(c);
        const res = new DataView(outbox.buffer, c * PAGE_SIZE, 16);
        res.setUint32(0, ok ? OK : REFUSED, true);
        res.setUint32(4, key, true);
        res.setUint32(8, versions[key] ?? 0, true);
        w.qps[c]!.postSend({
          wrId: c,
          opcode: WrOpcode.SEND,
          sgList: [{ addr: outMr.addr + BigInt(c * PAGE_SIZE), length: 16, lkey: outMr.lkey }],
          sendFlags: SendFlags.SIGNALED,
        });
        await done.wait(1, 0, 0);
      }
      me.stepUs.push((performance.now() - t0) * 1000);
    }
    countFaults(w, t, me, before, steady);
    await w.barrier();
    return me;
  } finally {
    await bufs.release();
  }
};

const client: Kernel<KvParams> = async (w, t, p) => {
  const clients = w.size - 1;
  const c = w.rank;
  const own = Math.ceil((p.keys - (c - 1)) / clients);
  const slot = Math.ceil((HEADER + p.valueBytes) / PAGE_SIZE) * PAGE_SIZE;
  const bufs = new TrialBuffers(w, t.policy, t.evictEachStep);
  try {
    // [request: header + value | answer | value read]
    const { region: buf, mr } = await bufs.map(2 * slot + PAGE_SIZE);
    const store = (await exchangeBuffers(w, mr))[0]!;
    const done = new Completions(w);
    const qp = w.qps[0]!;
    const req = new DataView(buf.buffer, 0, HEADER);
    const answer = new DataView(buf.buffer, slot, 16);
    const read = Buffer.from(buf.buffer, slot + PAGE_SIZE, p.valueBytes);
    const versions = new Uint32Array(own);
    const me = newOutcome(c, { opsPerStep: p.batch, refused: 0 });
    const before = faultCount(w);
    let steady = before;
    // A deterministic stream of keys and operations per client (an LCG): the same in every trial.
    let seed = c * 2654435761;
    // Its high bits: an LCG's low bits have short periods (bit i repeats every 2^(i+1) draws), which
    // tied whether an operation is a SET to which key it names, so only a few keys were ever set.
    const next = (): number => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) >>> 16;
    await w.barrier();
    for (let step = 0; step < t.steps; step++) {
      if (step === FIRST_STEPS) steady = faultCount(w);
      await bufs.evict();
      const t0 = performance.now();
      for (let i = 0; i < p.batch; i++) {
        const k = next() % own;
        const key = c - 1 + k * clients;
        const set = next() % SET_EVERY === 0;
        const version = set ? versions[k]! + 1 : 0;
        req.setUint32(0, set ? OP_SET : OP_GET, true);
        req.setUint32(4, key, true);
        req.setUint32(8, version, true);
        if (set) Buffer.from(buf.buffer, HEADER, p.valueBytes).fill(fillByte(key, version));
        qp.postRecv({ wrId: 0, sgList: [{ addr: mr.addr + BigInt(slot), length: 16, lkey: mr.lkey }] });
        qp.postSend({
          wrId: 1,
          opcode: WrOpcode.SEND,
          sgList: [{ addr: mr.addr, length: HEADER + (set ? p.valueBytes : 0), lkey: mr.lkey }],
          sendFlags: SendFlags.SIGNALED,
        });
        await done.wait(1, 0, 0);
        await done.receive();
        if (answer.getUint32(0, true) === REFUSED) {
          me.refused!++;
          continue;
        }
        if (set) {
          versions[k] = version;
          continue;
        }
        // The server's version must be the last this client set, and the bytes its value.
        const v = answer.getUint32(8, true);
        if (v !== versions[k]) me.mismatches++;
        qp.postSend({
          wrId: 2,
          opcode: WrOpcode.RDMA_READ,
          sgList: [{ addr: mr.addr + BigInt(slot + PAGE_SIZE), length: p.valueBytes, lkey: mr.lkey }],
          sendFlags: SendFlags.SIGNALED,
          rdma: { remoteAddr: store.addr + BigInt(key * p.valueBytes), rkey: store.rkey },
        });
        await done.wait(1, 0, 0);
        if (!isFilled(read, fillByte(key, versions[k]!))) me.mismatches++;
        me.bytesVerified += p.valueBytes;
      }
      me.stepUs.push((performance.now() - t0) * 1000);
    }
    countFaults(w, t, me, before, steady);
    await w.barrier();
    return me;
  } finally {
    await bufs.release();
  }
};

/** Whether every byte of `b` is `byte`. */
function isFilled(b: Buffer, byte: number): boolean {
  for (let i = 0; i < b.length; i++) if (b[i] !== byte) return false;
  return true;
}
