// The project's own memory server (`pagefault-rdma memory-server`, EDM's DMS) as a real child
// process, started and stopped here: pages go out and come back through a pager's real faults,
// a server killed and restarted makes its pages fail (never zeros), malformed frames from a raw
// socket are refused and counted while the real client goes on, and two clients never see each
// other's pages. Accesses are made by the native toucher (a failed one is ERR_PFR_ACCESS_FAILED;
// the main thread would die of SIGBUS).
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createConnection } from 'node:net';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PAGE_SIZE as P, RemotePager, touch, type PfrError, type RemotePagerOptions } from '../../lib/index.js';
import { startMemoryServer, type MemoryServerProcess } from '../../cli/programs/support/memory-server.js';
import {
  ABSENT,
  frame,
  HEADER_BYTES,
  HELLO_FIXED,
  MAGIC,
  MAX_BODY,
  MAX_VALUE,
  Op,
  REPLY,
  Status,
  VERSION,
  writeAddress,
} from '../../lib/remote-paging/memory-server-wire.js';
import { ROOT } from '../child.js';
import { until } from '../helpers.js';
import { fillPages, usePagers } from '../fixtures/pager.js';

const pagers = usePagers();

function pager(server: MemoryServerProcess, o: Omit<RemotePagerOptions, 'store'> & { prefix?: string }) {
  const { prefix, ...rest } = o;
  return pagers.watched({ ...rest, store: { server: { socket: server.socket, prefix: prefix ?? 'memsrv-test' } } });
}

const fill = fillPages;

/** Page i holds seed + i, every byte of it. */
function holds(data: Buffer, pages: number, seed: number): boolean {
  for (let i = 0; i < pages; i++) if (!data.subarray(i * P, (i + 1) * P).every((x) => x === ((seed + i) & 0xff))) return false;
  return true;
}

interface Failed {
  code?: string;
  offsets?: number[];
  result?: { data?: Buffer };
}
/** Read the region (or a range of it) with a native thread; the failure, if its access failed. */
const readBack = (p: RemotePager, offset = 0, length = p.region.size): Promise<{ data?: Buffer } & Failed> =>
  touch(p.region, { offset, length }).catch((e: unknown) => e as Failed);

interface RawFrame {
  op: number;
  status: number;
  count: number;
  body: Buffer;
}

function frames(all: Buffer): RawFrame[] {
  const out: RawFrame[] = [];
  for (let at = 0; at + HEADER_BYTES <= all.length;) {
    const len = all.readUInt32LE(at + 12);
    if (at + HEADER_BYTES + len > all.length) break;
    out.push({
      op: all[at + 2]!,
      status: all[at + 3]!,
      count: all.readUInt32LE(at + 8),
      body: all.subarray(at + HEADER_BYTES, at + HEADER_BYTES + len),
    });
    at += HEADER_BYTES + len;
  }
  return out;
}

/**
 * Send `bytes` on a raw connection; what the server answered, once it closed the connection
 * or `want` frames came (5 s at most), and whether it closed it.
 */
async function raw(socket: string, bytes: Buffer[], want = Infinity): Promise<{ frames: RawFrame[]; closed: boolean }> {
  const c = createConnection(socket);
  const chunks: Buffer[] = [];
  const closed = await new Promise<boolean>((resolve) => {
    const timer = setTimeout(() => resolve(false), 5000);
    c.on('data', (d: Buffer) => {
      chunks.push(d);
      if (frames(Buffer.concat(chunks)).length >= want) {
        clearTimeout(timer);
        resolve(false);
      }
    });
    c.on('close', () => (clearTimeout(timer), resolve(true)));
    c.on('error', () => undefined);
    c.on('connect', () => {
      for (const b of bytes) c.write(b);
    });
  });
  c.destroy();
  return { frames: frames(Buffer.concat(chunks)), closed };
}

function hello(ns: string, secret = randomBytes(16)): Buffer {
  const name = Buffer.from(ns, 'latin1');
  const f = frame(Op.HELLO, Status.OK, 1, 0, HELLO_FIXED + name.length);
  f.writeUInt16LE(VERSION, HEADER_BYTES);
  f.writeUInt16LE(name.length, HEADER_BYTES + 2);
  secret.copy(f, HEADER_BYTES + 4);
  name.copy(f, HEADER_BYTES + HELLO_FIXED);
  return f;
}

function get(addresses: bigint[]): Buffer {
  const f = frame(Op.GET, Status.OK, 2, addresses.length, addresses.length * 8);
  addresses.forEach((a, i) => writeAddress(f, HEADER_BYTES + i * 8, Number(a)));
  return f;
}

describe('a memory server in a process of its own', () => {
  let server: MemoryServerProcess;
  beforeAll(async () => void (server = await startMemoryServer()));
  afterAll(async () => server?.dispose());

  it('takes a working set four times the resident limit and gives every byte back on real faults', async () => {
    const { p, errors } = await pager(server, { size: 64 * P, residentLimit: 16 * P });
    fill(p, 64, 0x11); // the main thread's own writes: pages leave for the server as the limit is passed
    await until('evictions down to the watermark', () => p.stats().resident <= 16);
    const r = await readBack(p);
    expect(r.code).toBeUndefined();
    expect(holds(r.data!, 64, 0x11)).toBe(true);
    // And the main thread reads them too, every page through a fault of its own where evicted.
    const mine = Buffer.from(p.region.buffer);
    expect(holds(mine, 64, 0x11)).toBe(true);
    const s = p.stats();
    expect(s.writtenBack).toBeGreaterThanOrEqual(48);
    expect(s.majorFaults).toBeGreaterThanOrEqual(48);
    expect(s.lost + s.corrupt + s.poisoned + s.errors).toBe(0);
    expect(errors).toEqual([]);
    // close() deletes exactly the pages it stored from the server.
    expect((await p.close()).keysLeft).toBe(0);
    expect(p.stats().keysDeleted).toBeGreaterThan(0);
  });

  it('a prefetch window comes in one GET with its faulting page, every byte checked', async () => {
    const { p, errors } = await pager(server, { size: 64 * P, prefetch: 15 });
    fill(p, 64, 0x70);
    await p.evict();
    expect(holds((await readBack(p)).data!, 64, 0x70)).toBe(true);
    const s = p.stats();
    expect(s.majorFaults + s.prefetched).toBe(64);
    expect(s.prefetched).toBeGreaterThanOrEqual(48); // at most one fault in 16 pages went to the server
    expect(errors).toEqual([]);
  });

  it('a server killed and restarted holds none of the pages: each fails its access, none reads as zeros', async () => {
    const { p, errors } = await pager(server, { size: 32 * P });
    fill(p, 16, 0x40); // pages 16–31 are never written: never stored
    expect(await p.evict()).toBe(16);
    await server.stop('SIGKILL');
    await server.start(); // a new process: no pages, a new epoch
    const r = await readBack(p);
    expect(r.code).toBe('ERR_PFR_ACCESS_FAILED');
    expect((r.offsets ?? []).map((o) => o / P)).toEqual(Array.from({ length: 16 }, (_, i) => i));
    expect(r.result!.data!.subarray(16 * P).every((x) => x === 0)).toBe(true); // never stored: zeros, rightly
    await until('an error per lost page', () => errors.length >= 16);
    expect(new Set(errors.map((e) => e.code))).toEqual(new Set(['ERR_PFR_PAGE_LOST']));
    expect(p.stats()).toMatchObject({ lost: 16, majorFaults: 0 });
    // The pager goes on with the new server: a page written now goes out and comes back.
    const b = new Uint8Array(p.region.buffer);
    b.fill(0x77, 20 * P, 21 * P);
    await p.evict(20 * P, P);
    expect(holds((await touch(p.region, { offset: 20 * P, length: P })).data!, 1, 0x77)).toBe(true);
  });

  it('a server that stops answering counts as down: the next fetches fail at once, and it is used again once back', async () => {
    const p = await RemotePager.create({ size: 8 * P, timeoutMs: 300, store: { server: { socket: server.socket, probeIntervalMs: 1500 } } });
    pagers.track(p);
    const errors: PfrError[] = [];
    p.on('error', (e) => errors.push(e));
    fill(p, 8, 0x30);
    await p.evict();
    process.kill(server.pid!, 'SIGSTOP');
    try {
      const first = await readBack(p, 0, P);
      expect(first.code).toBe('ERR_PFR_ACCESS_FAILED');
      const second = await readBack(p, P, P);
      expect(second.code).toBe('ERR_PFR_ACCESS_FAILED');
      await until('both failures reported', () => errors.length >= 2);
      expect(errors.map((e) => e.code)).toEqual(['ERR_PFR_STORE_UNAVAILABLE', 'ERR_PFR_STORE_UNAVAILABLE']);
      expect(errors[0]!.message).toMatch(/did not answer a GET within 300 ms/);
      expect(errors[1]!.message).toMatch(/has been down for .* requests fail at once/);
    } finally {
      process.kill(server.pid!, 'SIGCONT');
    }
    await new Promise((r) => setTimeout(r, 1600)); // past the probe interval: the next fetch tries it again
    const rest = await touch(p.region, { offset: 2 * P, length: 6 * P });
    expect(holds(rest.data!, 6, 0x32)).toBe(true);
  });

  it('a server that is gone: the pager cannot start, and says how to start one', async () => {
    await expect(RemotePager.create({ size: 4 * P, store: { server: { socket: `${server.socket}.none` } } })).rejects.toMatchObject({
      code: 'ERR_PFR_STORE_UNAVAILABLE',
      message: expect.stringMatching(/pagefault-rdma memory-server --socket/) as unknown,
    });
  });

  it('two clients never see each other’s pages, even with one prefix and a known namespace', async () => {
    const a = await pager(server, { size: 8 * P, prefix: 'shared' });
    const b = await pager(server, { size: 8 * P, prefix: 'shared' });
    fill(a.p, 8, 0x10);
    fill(b.p, 8, 0x90);
    await a.p.evict();
    await b.p.evict();
    expect(holds((await readBack(a.p)).data!, 8, 0x10)).toBe(true);
    expect(holds((await readBack(b.p)).data!, 8, 0x90)).toBe(true);
    await a.p.evict();
    // A third client that knows a's namespace but not its secret is refused at its hello…
    const taken = await raw(server.socket, [hello(a.p.keyPrefix)]);
    expect(taken.frames[0]).toMatchObject({ op: Op.HELLO | REPLY, status: Status.NAMESPACE });
    expect(taken.closed).toBe(true);
    // …and in a namespace of its own, a's addresses are absent.
    const own = await raw(server.socket, [hello('intruder:1'), get([a.p.region.address, a.p.region.address + BigInt(P)])], 2);
    const reply = own.frames[1]!;
    expect(reply).toMatchObject({ op: Op.GET | REPLY, status: Status.OK, count: 2 });
    expect([reply.body.readUInt32LE(0), reply.body.readUInt32LE(4)]).toEqual([ABSENT, ABSENT]);
    expect(holds((await readBack(a.p)).data!, 8, 0x10)).toBe(true);
  });
});

describe('malformed frames from a raw socket', () => {
  let server: MemoryServerProcess;
  beforeAll(async () => void (server = await startMemoryServer()));
  afterAll(async () => server?.dispose());

  it('are refused and counted, each connection closed, while the real client keeps working', async () => {
    const { p, errors } = await pager(server, { size: 16 * P });
    fill(p, 16, 0x21);
    await p.evict();
    const header = (op: number, count: number, bodyLength: number, magic = MAGIC): Buffer => {
      const f = frame(op, Status.OK, 9, count, 0);
      f.writeUInt16LE(magic, 0);
      f.writeUInt32LE(bodyLength, 12);
      return f;
    };
    const putOf = (len: number): Buffer => {
      const f = frame(Op.PUT, Status.OK, 3, 1, 12);
      writeAddress(f, HEADER_BYTES, 0x1000);
      f.writeUInt32LE(len, HEADER_BYTES + 8);
      return f;
    };
    const cases: [string, Buffer[]][] = [
      ['bad magic', [Buffer.from('GET pfr:1 HTTP/1.1\r\n\r\n')]],
      ['request before hello', [get([0x1000n])]],
      ['malformed hello', [hello('has space')]],
      // A connection without a hello cannot make the server set aside a big body.
      ['malformed hello', [header(Op.HELLO, 0, 32 << 20)]],
      ['body too large', [hello('raw:1'), header(Op.GET, 1, MAX_BODY + 1)]],
      ['malformed get', [hello('raw:2'), header(Op.GET, 2, 8), Buffer.alloc(8)]],
      ['malformed del', [hello('raw:8'), header(Op.DEL, 1, 8), Buffer.from([0, 0, 0, 0, 0, 0, 0, 0x80])]],
      ['malformed put', [hello('raw:3'), putOf(MAX_VALUE + 1)]],
      ['unknown op', [hello('raw:4'), header(0x33, 0, 0)]],
      ['second hello', [hello('raw:5'), hello('raw:5')]],
      ['not a request', [hello('raw:6'), header(Op.GET | REPLY, 0, 0)]],
    ];
    for (const [reason, bytes] of cases) {
      const r = await raw(server.socket, bytes);
      expect(r.closed, reason).toBe(true);
      const refusal = r.frames.at(-1)!;
      expect(refusal.status, reason).toBe(Status.REFUSED);
      expect(refusal.body.toString(), reason).toContain(reason);
    }
    // A frame cut into single bytes is still one frame: answered, not refused.
    const split = [...Buffer.concat([hello('raw:7'), get([0x1000n])])].map((x) => Buffer.from([x]));
    const ok = await raw(server.socket, split, 2);
    expect(ok.frames.map((f) => [f.op, f.status])).toEqual([
      [Op.HELLO | REPLY, Status.OK],
      [Op.GET | REPLY, Status.OK],
    ]);
    expect(ok.closed).toBe(false);
    // The real client never noticed.
    expect(holds((await readBack(p)).data!, 16, 0x21)).toBe(true);
    expect(errors).toEqual([]);
    await p.close();
    // SIGTERM: the server stops cleanly and prints what it refused, by reason.
    expect(await server.stop('SIGTERM')).toBe(0);
    const last = server.output.join(' ').replace(/\s+/g, ' ');
    expect(last).toMatch(/memory server stopped \(SIGTERM\)/);
    expect(last).toMatch(new RegExp(`refused ${cases.length} \\(`));
    const counts = new Map<string, number>();
    for (const [reason] of cases) counts.set(reason, (counts.get(reason) ?? 0) + 1);
    for (const [reason, n] of counts) expect(last).toContain(`${reason}: ${n}`);
    // Every client gone, every page deleted: no namespace is kept for them.
    expect(last).toMatch(/held 0 pages, 0 B in 0 namespaces/);
  });
});

describe('a memory server at its memory limit', () => {
  let server: MemoryServerProcess;
  beforeAll(async () => void (server = await startMemoryServer(['--max-memory', '64K'])));
  afterAll(async () => server?.dispose());

  it('refuses the write: ERR_PFR_STORE_FULL, and the pages stay resident with their bytes', async () => {
    const { p, errors } = await pager(server, { size: 32 * P, evictBatch: 32 });
    fill(p, 32, 0x50);
    await expect(p.evict()).rejects.toMatchObject({ code: 'ERR_PFR_STORE_FULL', message: expect.stringMatching(/--max-memory/) as unknown });
    expect(errors.map((e) => e.code)).toContain('ERR_PFR_STORE_FULL');
    expect(p.stats()).toMatchObject({ evicted: 0, resident: 32 });
    expect(holds(Buffer.from(p.region.buffer), 32, 0x50)).toBe(true);
  });
});

describe('pagefault-rdma memory-server', () => {
  const cli = (...args: string[]) =>
    spawnSync(process.execPath, [`${ROOT}/dist/cli/main.js`, 'memory-server', ...args], { encoding: 'utf8', timeout: 15_000 });

  it('serves a pager over loopback TCP too (--port 0: a free port, printed)', async () => {
    const proc = spawn(process.execPath, [`${ROOT}/dist/cli/main.js`, 'memory-server', '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      const lines: string[] = [];
      createInterface({ input: proc.stdout }).on('line', (l) => lines.push(l));
      await until('the server to listen', () => lines.some((l) => /listening on 127\.0\.0\.1:\d+/.test(l)));
      const port = Number(/127\.0\.0\.1:(\d+)/.exec(lines.join(' '))![1]);
      const p = await RemotePager.create({ size: 16 * P, residentLimit: 4 * P, store: { server: { port } } });
      pagers.track(p);
      fill(p, 16, 0x60);
      await p.evict();
      expect(holds((await readBack(p)).data!, 16, 0x60)).toBe(true);
      expect(p.stats().majorFaults).toBeGreaterThanOrEqual(16);
      expect((await p.close()).keysLeft).toBe(0);
    } finally {
      proc.kill('SIGKILL');
    }
  });

  it('listens on loopback only, and on one of a socket or a port', () => {
    const wide = cli('--port', '0', '--host', '0.0.0.0');
    expect(wide.status).not.toBe(0);
    expect(wide.stderr).toMatch(/not a loopback address/);
    const neither = cli();
    expect(neither.status).not.toBe(0);
    expect(neither.stderr).toMatch(/give --socket PATH or --port N/);
  });
});
