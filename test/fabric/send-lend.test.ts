// Sends without a staging copy (native/fabric.cc, fabricSend's `lend`): a payload whose pages a
// presence proof shows present is sent from the source's own pages; one whose pages could
// fault is copied into the send buffer; a drop of lent pages before the provider has read them
// finishes the send first, so the peer gets the bytes as they were, never zeros. Two raw
// connections in one process over libfabric tcp on loopback; fabricProgress's `sends` says
// which path each send took. Then the transport: a 1 MiB RDMA WRITE over the engine lends its
// payload, and its bytes land.
import { afterEach, describe, expect, it } from 'vitest';
import { LibfabricTransport } from '../../kernel-sim/index.js';
import { Access, Cluster, connectQps, mapRegion, SendFlags, WcStatus, WrOpcode } from '../../lib/index.js';
import { binding, fabricBinding, type RawMapping } from '../../native/index.js';
import { closeAll, next, track } from '../verbs/helpers.js';
import { built, ci } from './spawn.js';

const handles: number[] = [];
const regions: RawMapping[] = [];
afterEach(() => {
  for (const h of handles.splice(0)) fabricBinding().fabricClose(h);
  for (const r of regions.splice(0)) binding.closeRegion(r.id, r.buffer);
  closeAll();
});

const MIB = 1 << 20;
const PAYLOAD = 4 * MIB - 4096; // one message (the receive slots hold 4 MiB), more than the socket takes at once
const byte = (seed: number, at: number) => (seed * 29 + at * 7 + (at >> 12)) & 0xff || 1; // never 0

async function pair() {
  const fi = fabricBinding();
  const got: Uint8Array[] = [];
  let accepted = 0;
  let arrived: () => void = () => {};
  const listening = fi.fabricListen('tcp', '127.0.0.1', 0, (h, kind, a) => {
    if (kind === 'request') return true;
    if (kind === 'connection') {
      handles.push((accepted = a as number));
      fi.fabricLimits(accepted, { posted: 8 });
    }
    if (kind === 'message' && h === accepted) {
      got.push((a as Uint8Array).slice());
      arrived();
    }
  });
  handles.push(listening.handle);
  let client = 0;
  await new Promise<void>((resolve, reject) => {
    client = fi.fabricConnect('tcp', '127.0.0.1', listening.port, (_h, kind, a) => {
      if (kind === 'connected') resolve();
      if (kind === 'error' || kind === 'shutdown') reject(a as Error);
    });
    handles.push(client);
  });
  const until = async (n: number) => {
    const deadline = Date.now() + 20_000;
    while (got.length < n) {
      if (Date.now() > deadline) throw new Error(`${got.length} of ${n} messages arrived`);
      await new Promise<void>((resolve) => {
        arrived = resolve;
        setTimeout(resolve, 50);
      });
    }
  };
  return { fi, client, got, until, sends: () => fi.fabricProgress(client).sends! };
}

function region(shared: boolean, seed: number): RawMapping {
  const r = binding.mapRegion(PAYLOAD + 4096, shared, false, false);
  regions.push(r);
  const v = new Uint8Array(r.buffer);
  for (let at = 0; at < v.length; at++) v[at] = byte(seed, at);
  return r;
}

const head = (seed: number) => new Uint8Array(16).fill(seed);

describe.skipIf(!built && !ci)('sends without a staging copy', () => {
  it('a resident source is lent, a page that could fault is copied, both byte for byte', async () => {
    const { fi, client, got, until, sends } = await pair();
    // Resident: lent.
    const a = region(false, 1);
    const before = new Uint8Array(a.buffer, 4096, PAYLOAD).slice();
    fi.fabricSend(client, [head(1), new Uint8Array(a.buffer, 4096, PAYLOAD)], false, [a.id, 4096]);
    expect(sends()).toMatchObject({ lent: 1, copied: 0, lentBytes: PAYLOAD });
    await until(1);
    expect(Buffer.compare(got[0]!, Buffer.concat([head(1), before]))).toBe(0);
    // A memfd region zapped: mincore still counts its pages (the page cache has them) but no
    // page-table entry is present, so an access would fault: copied (a minor fault here, on
    // this thread, never inside the provider's progress later), with the page cache's bytes.
    const b = region(true, 2);
    const bBytes = new Uint8Array(b.buffer, 4096, PAYLOAD).slice();
    binding.zap(b.id, 0, b.buffer.byteLength);
    fi.fabricSend(client, [head(2), new Uint8Array(b.buffer, 4096, PAYLOAD)], false, [b.id, 4096]);
    expect(sends()).toMatchObject({ lent: 1, copied: 1, copiedBytes: PAYLOAD });
    await until(2);
    expect(Buffer.compare(got[1]!, Buffer.concat([head(2), bBytes]))).toBe(0);
    // A part that is not the region's bytes at that offset is refused, nothing sent.
    expect(() => fi.fabricSend(client, [head(3), new Uint8Array(a.buffer, 0, 4096)], false, [a.id, 4096])).toThrow(/not the region's bytes/);
    expect(() => fi.fabricSend(client, [head(3), new Uint8Array(a.buffer, 0, 4096)], false, [999_999, 0])).toThrow();
    expect(sends().lent + sends().copied).toBe(2);
  }, 60_000);

  it('pages evicted while lent: the drop finishes the send first, the peer gets the bytes, never zeros', async () => {
    const { fi, client, got, until, sends } = await pair();
    const a = region(false, 4);
    const before = new Uint8Array(a.buffer, 4096, PAYLOAD).slice();
    // The receiver is this same thread: until this test's turn ends it reads nothing, so the
    // provider cannot have taken 4 MiB from the source yet.
    fi.fabricSend(client, [head(4), new Uint8Array(a.buffer, 4096, PAYLOAD)], false, [a.id, 4096]);
    expect(sends()).toMatchObject({ lent: 1, lentNow: 1 });
    // Evicted between the proof and the provider's read: anonymous memory reads back as zeros
    // once dropped, so a send that went on reading it would carry zeros.
    binding.evict(a.id, 0, a.buffer.byteLength);
    expect(sends()).toMatchObject({ lentNow: 0, finishedOnDrop: 1 });
    expect(binding.residency(a.id, 0, a.buffer.byteLength).every((x) => x === 0)).toBe(true);
    expect(new Uint8Array(a.buffer, 4096, 4096).every((x) => x === 0)).toBe(true);
    await until(1);
    expect(got[0]!.length).toBe(16 + PAYLOAD);
    expect(Buffer.compare(got[0]!, Buffer.concat([head(4), before]))).toBe(0);
    // The next send of the now-zero (and again present) pages is lent afresh: the proof is new.
    new Uint8Array(a.buffer, 4096, PAYLOAD).set(before);
    fi.fabricSend(client, [head(5), new Uint8Array(a.buffer, 4096, PAYLOAD)], false, [a.id, 4096]);
    expect(sends().lent).toBe(2);
    await until(2);
    expect(Buffer.compare(got[1]!, Buffer.concat([head(5), before]))).toBe(0);
  }, 60_000);

  it('a memfd punched through another mapping of it (an alias) finishes the send lent from the first', async () => {
    const { fi, client, got, until, sends } = await pair();
    const a = region(true, 8);
    const alias = binding.mapAlias(a.id);
    regions.push(alias);
    const before = new Uint8Array(a.buffer, 4096, PAYLOAD).slice();
    fi.fabricSend(client, [head(8), new Uint8Array(a.buffer, 4096, PAYLOAD)], false, [a.id, 4096]);
    expect(sends()).toMatchObject({ lent: 1, lentNow: 1 });
    // MADV_REMOVE on the alias punches the file: the lent mapping's pages go too, at another address.
    binding.evict(alias.id, 0, alias.buffer.byteLength);
    expect(sends()).toMatchObject({ lentNow: 0, finishedOnDrop: 1 });
    expect(new Uint8Array(a.buffer, 4096, 4096).every((x) => x === 0)).toBe(true);
    await until(1);
    expect(Buffer.compare(got[0]!, Buffer.concat([head(8), before]))).toBe(0);
  }, 60_000);

  it('a drop of lent pages its peer never takes gives up after its bound: EBUSY, nothing dropped', async () => {
    const fi = fabricBinding();
    // A peer that accepts and then never progresses its side: its socket fills, then the sender's.
    const listening = fi.fabricListen('tcp', '127.0.0.1', 0, (_h, kind, a) => {
      if (kind === 'request') return true;
      if (kind === 'connection') handles.push(a as number);
    });
    handles.push(listening.handle);
    let client = 0;
    await new Promise<void>((resolve, reject) => {
      client = fi.fabricConnect('tcp', '127.0.0.1', listening.port, (_h, kind, a) => {
        if (kind === 'connected') resolve();
        if (kind === 'error' || kind === 'shutdown') reject(a as Error);
      });
      handles.push(client);
    });
    // Its one posted receive takes the first message; the rest stay on the sockets (a few MiB).
    const a = region(false, 6);
    for (let i = 0; i < 6; i++) fi.fabricSend(client, [head(6), new Uint8Array(a.buffer, 4096, PAYLOAD)], false, [a.id, 4096]);
    const lent = fi.fabricProgress(client).sends!;
    expect(lent.lent + lent.copied).toBe(6);
    const t0 = Date.now();
    let err: (Error & { code?: string }) | undefined;
    try {
      binding.evict(a.id, 0, a.buffer.byteLength);
    } catch (e) {
      err = e as Error & { code?: string };
    }
    expect(err?.code).toBe('EBUSY');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(900);
    expect(Date.now() - t0).toBeLessThan(10_000);
    // Nothing was dropped: the pages are there with their bytes.
    expect(binding.residency(a.id, 0, a.buffer.byteLength).every((x) => x === 1)).toBe(true);
    expect(new Uint8Array(a.buffer)[4096 + 12345]).toBe(byte(6, 4096 + 12345));
  }, 60_000);

  it('a 1 MiB RDMA WRITE over the transport is sent from its source pages and lands byte for byte', async () => {
    const server = track(LibfabricTransport.listen({ port: 0, localNodes: [1] }));
    const client = track(await LibfabricTransport.connect({ host: '127.0.0.1', port: server.port, localNodes: [0] }));
    await server.waitForPeer(5000);
    const sides = [0, 1].map((node) => {
      const cluster = track(Cluster.create({ nodes: 2, transport: node === 0 ? client : server }));
      const ctx = cluster.openDevice(node);
      const pd = ctx.allocPd();
      const cq = ctx.createCq(16);
      const qp = ctx.createQp(pd, { sendCq: cq, recvCq: cq, cap: { maxSendWr: 16 } });
      const buf = track(mapRegion(2 * MIB));
      const mr = ctx.regMr(pd, buf, 0, buf.size, Access.LOCAL_WRITE | Access.REMOTE_WRITE);
      return { cq, qp, buf, mr };
    });
    const [c, s] = sides as [(typeof sides)[0], (typeof sides)[0]];
    connectQps(c.qp, s.qp);
    const src = new Uint8Array(c.buf.buffer);
    for (let i = 0; i < src.length; i++) src[i] = byte(7, i);
    c.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [{ addr: c.buf.address, length: MIB, lkey: c.mr.lkey }],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: s.buf.address, rkey: s.mr.rkey },
    });
    expect((await next(c.cq, 20_000)).status).toBe(WcStatus.SUCCESS);
    expect(Buffer.compare(new Uint8Array(s.buf.buffer, 0, MIB), src.subarray(0, MIB))).toBe(0);
    const st = client.sendStats();
    expect(st.lent).toBeGreaterThanOrEqual(1);
    expect(st.lentBytes).toBeGreaterThanOrEqual(MIB / 2);
    expect(st.copied).toBe(0);
  }, 60_000);
});
