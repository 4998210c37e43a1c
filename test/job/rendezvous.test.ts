// The job bootstrap's rendezvous, fed what a stray process or a broken rank could send: rank 0
// refuses every malformed or out-of-place message (the connection is told why and closed, the
// job goes on), a rank that breaks the protocol once it belongs to the job fails the job, and a
// rank refuses a malformed table from rank 0. Plus where rank and size come from.
import { connect, createServer, type Server, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { launchInfo } from '../../lib/job/job.js';
import { MAX_RENDEZVOUS_FRAME, Rendezvous } from '../../lib/job/rendezvous.js';

const open: Array<{ close(): unknown }> = [];
afterEach(async () => {
  for (const x of open.splice(0)) await x.close();
});

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address() as { port: number };
  await new Promise((r) => s.close(r));
  return port;
}

function frame(m: unknown): Buffer {
  const body = Buffer.isBuffer(m) ? m : Buffer.from(JSON.stringify(m));
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  return Buffer.concat([head, body]);
}

/** The messages a socket received until it closed. */
function messagesUntilClose(s: Socket): Promise<Array<Record<string, unknown>>> {
  const chunks: Buffer[] = [];
  s.on('data', (d: Buffer) => chunks.push(d));
  return new Promise((resolve) =>
    s.on('close', () => {
      const all = Buffer.concat(chunks);
      const out: Array<Record<string, unknown>> = [];
      for (let at = 0; at + 4 <= all.length;) {
        const len = all.readUInt32BE(at);
        out.push(JSON.parse(all.subarray(at + 4, at + 4 + len).toString()) as Record<string, unknown>);
        at += 4 + len;
      }
      resolve(out);
    }),
  );
}

async function rawSend(port: number, ...bytes: Buffer[]): Promise<Array<Record<string, unknown>>> {
  const s = connect(port, '127.0.0.1');
  await new Promise((r) => s.once('connect', r));
  const got = messagesUntilClose(s);
  for (const b of bytes) s.write(b);
  return got;
}

describe("rank 0's rendezvous", () => {
  it('refuses malformed and out-of-place messages from strangers, names why, and the job still meets', async () => {
    const port = await freePort();
    const at = { host: '127.0.0.1', port };
    const root = Rendezvous.open({ rank: 0, size: 3, at, address: '127.0.0.1:1000', timeoutMs: 10_000 });
    await new Promise((r) => setTimeout(r, 100)); // listening
    const hello = (o: Record<string, unknown>) => frame({ t: 'hello', rank: 1, size: 3, address: '127.0.0.1:1001', ...o });
    const cases: Array<[Buffer, RegExp]> = [
      [Buffer.from([0, 0, 0, 0]), /a frame of 0 bytes/],
      [Buffer.from([0xff, 0xff, 0xff, 0xff]), new RegExp(`a frame of 4294967295 bytes \\(1\\.\\.${MAX_RENDEZVOUS_FRAME}\\)`)],
      [frame(Buffer.from('{not json')), /not JSON/],
      [frame([1, 2]), /not a message/],
      [frame({ t: 'gather', seq: 0, value: null }), /a 'gather' message before the hello/],
      [hello({ rank: 3 }), /a hello from rank 3 \(ranks 1\.\.2 connect\)/],
      [hello({ rank: 0 }), /a hello from rank 0/],
      [hello({ rank: 1.5 }), /a hello from rank 1\.5/],
      [hello({ size: 4 }), /a job of 4 ranks \(this job has 3\)/],
      [hello({ extra: 1 }), /must have the fields address, rank, size, got address, extra, rank, size/],
      [hello({ address: 'no-port' }), /rank 1's address must be HOST:PORT/],
      [hello({ address: '127.0.0.1:70000' }), /must be HOST:PORT with a port in 1\.\.65535/],
    ];
    for (const [bytes, why] of cases) {
      const got = await rawSend(port, bytes);
      expect(got, String(why)).toEqual([{ t: 'refused', reason: expect.stringMatching(why) as string }]);
    }
    // Rank 1 arrives (a raw socket that stays), then someone else claims rank 1 again.
    const one = connect(port, '127.0.0.1');
    await new Promise((r) => one.once('connect', r));
    const oneGot = messagesUntilClose(one);
    one.write(hello({}));
    await new Promise((r) => setTimeout(r, 100));
    expect(await rawSend(port, hello({}))).toEqual([{ t: 'refused', reason: 'a second hello from rank 1' }]);
    // Rank 2 (a real member) completes the job: both get the table.
    const two = await Rendezvous.open({ rank: 2, size: 3, at, address: '127.0.0.1:1002', timeoutMs: 10_000 });
    open.push(two);
    const r0 = await root;
    open.push(r0);
    expect(r0.addresses).toEqual(['127.0.0.1:1000', '127.0.0.1:1001', '127.0.0.1:1002']);
    expect(two.addresses).toEqual(r0.addresses);
    expect(r0.refused).toHaveLength(cases.length + 1);
    // A rank of the job that breaks the protocol fails the whole job, with the reason.
    one.write(frame({ t: 'gather', seq: 7, value: null }));
    const failed = await new Promise<Error>((r) => two.onFailure(r));
    expect(r0.failed).toMatchObject({
      code: 'ERR_PFR_RENDEZVOUS',
      message: expect.stringMatching(/rank 1 sent a malformed message: allgather 7 while the job is at allgather 0/) as string,
    });
    // The other ranks learn it as a failure of the job, with rank 0's reason.
    expect(failed).toMatchObject({ code: 'ERR_PFR_RANK_LOST', message: r0.failed!.message });
    await expect(two.barrier(1000)).rejects.toBe(failed);
    expect((await oneGot).at(-1)).toEqual({ t: 'abort', reason: failed.message });
    one.destroy();
  });

  it('a killed rank fails the job at once: every wait ends with who went away', async () => {
    const port = await freePort();
    const at = { host: '127.0.0.1', port };
    const root = Rendezvous.open({ rank: 0, size: 3, at, address: '127.0.0.1:1000', timeoutMs: 10_000 });
    const one = connect(port, '127.0.0.1');
    await new Promise((r) => setTimeout(r, 100));
    one.write(frame({ t: 'hello', rank: 1, size: 3, address: '127.0.0.1:1001' }));
    const two = await Rendezvous.open({ rank: 2, size: 3, at, address: '127.0.0.1:1002', timeoutMs: 10_000 });
    open.push(two, await root);
    const waiting = two.barrier(10_000);
    const t = performance.now();
    one.destroy(); // rank 1's process is gone: its socket closes without a bye
    await expect(waiting).rejects.toMatchObject({
      code: 'ERR_PFR_RANK_LOST',
      message: expect.stringMatching(/rank 1 \(127\.0\.0\.1:1001\) went away/) as string,
    });
    expect(performance.now() - t).toBeLessThan(5_000);
  });
});

describe("a rank's side", () => {
  let fake: Server | undefined;
  afterEach(() => fake?.close());

  /** A fake rank 0 that answers the hello with `reply`. */
  async function fakeRoot(reply: (hello: Record<string, unknown>) => Buffer): Promise<number> {
    fake = createServer((s) => {
      let buf = Buffer.alloc(0);
      s.on('data', (d: Buffer) => {
        buf = Buffer.concat([buf, d]);
        if (buf.length >= 4 && buf.length >= 4 + buf.readUInt32BE(0))
          s.write(reply(JSON.parse(buf.subarray(4).toString()) as Record<string, unknown>));
      });
      s.on('error', () => undefined);
    });
    await new Promise<void>((r) => fake!.listen(0, '127.0.0.1', r));
    return (fake.address() as { port: number }).port;
  }

  const member = (port: number) =>
    Rendezvous.open({ rank: 1, size: 3, at: { host: '127.0.0.1', port }, address: '127.0.0.1:2001', timeoutMs: 5_000 });

  it.each([
    ['a table one address short', () => frame({ t: 'table', addresses: ['127.0.0.1:2000', '127.0.0.1:2001'] }), /the table must list 3 addresses/],
    ['a table giving it another address', () => frame({ t: 'table', addresses: ['127.0.0.1:2000', '127.0.0.1:9', '127.0.0.1:2002'] }), /not its own/],
    [
      'a table listing an address twice',
      () => frame({ t: 'table', addresses: ['127.0.0.1:2000', '127.0.0.1:2001', '127.0.0.1:2000'] }),
      /an address twice/,
    ],
    ['an answer before the table', () => frame({ t: 'gathered', seq: 0, values: [] }), /a 'gathered' message before the table/],
    ['an oversized frame', () => Buffer.from([0x7f, 0, 0, 0]), /a frame of 2130706432 bytes/],
  ])('refuses %s from rank 0', async (_name, reply, why) => {
    const port = await fakeRoot(reply);
    await expect(member(port)).rejects.toMatchObject({ code: 'ERR_PFR_RENDEZVOUS', message: expect.stringMatching(why) as string });
  });

  it('says it cannot reach rank 0, and what to check, once its timeout is over', async () => {
    const port = await freePort();
    const t = performance.now();
    await expect(
      Rendezvous.open({ rank: 1, size: 2, at: { host: '127.0.0.1', port }, address: '127.0.0.1:2001', timeoutMs: 600 }),
    ).rejects.toMatchObject({
      code: 'ERR_PFR_RENDEZVOUS',
      message: expect.stringMatching(/cannot reach rank 0's rendezvous .* within 600 ms .*is rank 0 running/) as string,
    });
    expect(performance.now() - t).toBeGreaterThanOrEqual(500);
  });
});

describe('rank and size from the launcher', () => {
  it.each([
    [
      { PFR_RANK: '2', PFR_SIZE: '4' },
      { rank: 2, size: 4, launcher: 'pagefault-rdma run' },
    ],
    [
      { PMI_RANK: '1', PMI_SIZE: '8' },
      { rank: 1, size: 8, launcher: 'mpich (hydra)' },
    ],
    [
      { OMPI_COMM_WORLD_RANK: '0', OMPI_COMM_WORLD_SIZE: '2' },
      { rank: 0, size: 2, launcher: 'Open MPI' },
    ],
  ])('%o', (env, want) => expect(launchInfo(env)).toEqual(want));

  it('outside a launcher, or with variables that make no job, says how to start one', () => {
    expect(() => launchInfo({})).toThrow(
      expect.objectContaining({ code: 'ERR_PFR_NO_LAUNCHER', message: expect.stringMatching(/run -n 4 -- PROGRAM.*mpiexec -n 4/) as string }),
    );
    for (const env of [{ PMI_RANK: '4', PMI_SIZE: '4' }, { PMI_RANK: '1' }, { PFR_RANK: '-1', PFR_SIZE: '2' }, { PFR_RANK: '0', PFR_SIZE: '2000' }])
      expect(() => launchInfo(env)).toThrow(expect.objectContaining({ code: 'ERR_PFR_NO_LAUNCHER' }));
  });
});
