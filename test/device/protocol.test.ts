// The control protocol seen from a provider that says anything (test/fixtures/device-raw-client.c):
// every message is checked like a packet from the wire, refused with the errno the ABI names,
// counted by reason, and the device goes on serving; a program's objects go with its socket.
import { mkdtempSync, rmSync } from 'node:fs';
import { constants, tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import * as abi from '../../kernel-sim/device/abi.js';
import { Op } from '../../kernel-sim/device/abi.js';
import { queryStats } from '../../kernel-sim/device/client.js';
import { ReplyWriter } from '../../kernel-sim/device/messages.js';
import type { Layout } from '../../kernel-sim/device/layout.js';
import { compileFixture, deviceHere, RawClient } from './fixture.js';

const E = constants.errno;
let bin = '';
let build = '';
let dev: ReturnType<typeof deviceHere>;
const clients: RawClient[] = [];

beforeAll(() => {
  build = mkdtempSync(join(tmpdir(), `pfr-raw-${process.pid}-`));
  bin = compileFixture('device-raw-client', build);
});
afterAll(() => rmSync(build, { recursive: true, force: true }));
beforeEach(() => {
  dev = deviceHere();
});
afterEach(() => {
  for (const c of clients.splice(0)) c.close();
  dev.close();
});

function client(): RawClient {
  const c = new RawClient(bin, dev.dir);
  clients.push(c);
  return c;
}

const hex = (b: Uint8Array): string => (b.byteLength ? Buffer.from(b).toString('hex') : '-');
function body(layout: Layout, fields: Record<string, number | bigint>): string {
  const w = new ReplyWriter(layout);
  for (const [k, v] of Object.entries(fields)) {
    const f = layout.fields.get(k)!;
    if (typeof v === 'bigint') w.u64(k, v);
    else if (f.size === 1) w.u8(k, v);
    else if (f.size === 2) w.u16(k, v);
    else w.u32(k, v);
  }
  return hex(w.bytes);
}
const handle = (h: number): string => body(abi.handleBody, { handle: h });

/** A header for `raw`: magic, version, op, length, id, status, flags as given. */
function header(o: { magic?: number; version?: number; op?: number; length?: number; status?: number; flags?: number }, bodyLen = 0): string {
  const b = Buffer.alloc(abi.ctlHdr.size + bodyLen);
  b.writeUInt32LE(o.magic ?? abi.CTL_MAGIC, 0);
  b.writeUInt16LE(o.version ?? abi.ABI_VERSION, 4);
  b.writeUInt16LE(o.op ?? Op.QUERY_INFO, 6);
  b.writeUInt32LE(o.length ?? b.byteLength, 8);
  b.writeUInt32LE(7, 12);
  b.writeInt32LE(o.status ?? 0, 16);
  b.writeUInt32LE(o.flags ?? 0, 20);
  return b.toString('hex');
}

async function contextOf(c: RawClient): Promise<void> {
  const r = await c.reply('context');
  expect(r).toMatchObject({ status: 0, fds: 1 });
}

async function newHandle(c: RawClient, line: string): Promise<number> {
  const r = await c.reply(line);
  if (r === 'closed' || r.status !== 0) throw new Error(`${line}: ${JSON.stringify(r)}`);
  return r.body.readUInt32LE(0);
}

describe('framing: refused with EPROTO, and the connection closed', () => {
  const cases: [string, string][] = [
    ['a bad magic', header({ magic: 0x12345678 })],
    ['another ABI version', header({ version: 2 })],
    ['a length that is not the datagram', header({ length: 100 })],
    ['a request with a status', header({ status: -1 })],
    ['a request with flags', header({ flags: 1 })],
    ['fewer bytes than a header', '0102030405'],
    // Its header says 4096: only the kernel's MSG_TRUNC tells the rest was cut off.
    ['a datagram past 4096 bytes', header({ length: 4096 }, 5000 - abi.ctlHdr.size)],
  ];
  test.each(cases)('%s', async (_what, raw) => {
    const c = client();
    expect(await c.reply(`raw ${raw}`)).toMatchObject({ status: -E.EPROTO!, fds: 0 });
    expect(await c.ask('send 1 -')).toBe('closed');
    expect((await queryStats(dev.dir)).refused.FRAMING).toBe(1);
    // The device goes on: another program's connection is served.
    expect(await client().reply('send 1 -')).toMatchObject({ status: 0 });
  });
});

test('unknown ops, ops before GET_CONTEXT, bodies of the wrong size: refused, the connection kept', async () => {
  const c = client();
  expect(await c.reply('send 99 -')).toMatchObject({ status: -E.ENOSYS! });
  expect(await c.reply('send 0 -')).toMatchObject({ status: -E.ENOSYS! });
  expect(await c.reply(`send ${Op.ALLOC_PD} -`)).toMatchObject({ status: -E.EINVAL! });
  expect(await c.reply(`send ${Op.QUERY_INFO} 00000000`)).toMatchObject({ status: -E.EINVAL! });
  const info = await c.reply(`send ${Op.QUERY_INFO} -`);
  expect(info).toMatchObject({ status: 0, fds: 0 });
  expect((info as { body: Buffer }).body.subarray(0, 5).toString()).toBe('pfr0\0');
  await contextOf(c);
  expect(await c.reply('context')).toMatchObject({ status: -E.EINVAL! }); // once per connection
  expect(await c.reply(`send ${Op.ALLOC_PD} 00`)).toMatchObject({ status: -E.EINVAL! });
  const s = await queryStats(dev.dir);
  expect(s.refused).toMatchObject({ OP: 4, BODY: 2, FRAMING: 0 });
  expect(s.openContexts).toBe(1);
});

test('descriptors: exactly those of the op, each of its kind', async () => {
  const c = client();
  expect(await c.reply(`send ${Op.GET_CONTEXT} ${body(abi.getContext, { provider_abi: 1 })} pef`)).toMatchObject({ status: -E.EINVAL! });
  expect(await c.reply(`send ${Op.GET_CONTEXT} ${body(abi.getContext, { provider_abi: 1 })} pe`)).toMatchObject({ status: -E.EINVAL! });
  expect(await c.reply(`send ${Op.GET_CONTEXT} ${body(abi.getContext, { provider_abi: 1 })} eps`)).toMatchObject({ status: -E.EINVAL! });
  await contextOf(c);
  expect(await c.reply(`send ${Op.CREATE_COMP_CHANNEL} -`)).toMatchObject({ status: -E.EINVAL! });
  expect(await c.reply(`send ${Op.CREATE_COMP_CHANNEL} - e`)).toMatchObject({ status: -E.EINVAL! });
  expect(await c.reply(`send ${Op.ALLOC_PD} - p`)).toMatchObject({ status: -E.EINVAL! });
  expect(await c.reply(`send ${Op.CREATE_COMP_CHANNEL} - p`)).toMatchObject({ status: 0 });
  expect((await queryStats(dev.dir)).refused.FDS).toBe(6);
});

test('handles are the context own and of their kind; objects in use cannot go', async () => {
  const a = client();
  const b = client();
  await contextOf(a);
  await contextOf(b);
  const pd = await newHandle(a, `send ${Op.ALLOC_PD} -`);
  // b's context has no object by a's handle; a CQ op does not take a PD.
  expect(await b.reply(`send ${Op.DEALLOC_PD} ${handle(pd)}`)).toMatchObject({ status: -E.EINVAL! });
  expect(await a.reply(`send ${Op.DESTROY_CQ} ${handle(pd)}`)).toMatchObject({ status: -E.EINVAL! });
  expect(await a.reply(`send ${Op.DEALLOC_PD} ${handle(pd + 1000)}`)).toMatchObject({ status: -E.EINVAL! });
  const mr = await newHandle(
    a,
    `send ${Op.REG_MR} ${body(abi.regMr, { start: 0x10000n, length: 4096n, iova: 0x10000n, pd_handle: pd, access: 64 })}`,
  );
  expect(await a.reply(`send ${Op.DEALLOC_PD} ${handle(pd)}`)).toMatchObject({ status: -E.EBUSY! });
  expect(await a.reply(`send ${Op.DEREG_MR} ${handle(mr)}`)).toMatchObject({ status: 0 });
  expect(await a.reply(`send ${Op.DEREG_MR} ${handle(mr)}`)).toMatchObject({ status: -E.EINVAL! }); // never reused
  expect(await a.reply(`send ${Op.DEALLOC_PD} ${handle(pd)}`)).toMatchObject({ status: 0 });
  expect((await queryStats(dev.dir)).refused.HANDLE).toBe(4);
});

test('fields are checked against their ranges and the engine', async () => {
  const c = client();
  await contextOf(c);
  const pd = await newHandle(c, `send ${Op.ALLOC_PD} -`);
  const mr = (f: Record<string, number | bigint>): string =>
    `send ${Op.REG_MR} ${body(abi.regMr, { start: 0x10000n, length: 4096n, iova: 0x10000n, pd_handle: pd, ...f })}`;
  expect(await c.reply(mr({ access: 1 << 12 }))).toMatchObject({ status: -E.EINVAL! }); // unknown bit
  expect(await c.reply(mr({ access: 16 }))).toMatchObject({ status: -E.EOPNOTSUPP! }); // MW_BIND
  expect(await c.reply(mr({ access: 2 }))).toMatchObject({ status: -E.EINVAL! }); // REMOTE_WRITE without LOCAL_WRITE
  expect(await c.reply(mr({ access: 1, iova: 0x20000n }))).toMatchObject({ status: -E.EOPNOTSUPP! });
  expect(await c.reply(mr({ access: 1, length: 0n }))).toMatchObject({ status: -E.EINVAL! });
  expect(await c.reply(mr({ access: 1, start: 0n, length: 0xffffffffffffffffn }))).toMatchObject({ status: -E.EINVAL! }); // implicit needs ODP
  expect(await c.reply(mr({ access: 65, start: 0n, length: 0xffffffffffffffffn, iova: 0n }))).toMatchObject({ status: 0 });
  const cq = (cqe: number, channel = abi.NO_HANDLE): string => `send ${Op.CREATE_CQ} ${body(abi.createCq, { cqe, channel_handle: channel })}`;
  expect(await c.reply(cq(0))).toMatchObject({ status: -E.EINVAL! });
  expect(await c.reply(cq((1 << 22) + 1))).toMatchObject({ status: -E.EINVAL! });
  expect(await c.reply(cq(16, pd))).toMatchObject({ status: -E.EINVAL! });
  const made = await c.reply(cq(100));
  expect(made).toMatchObject({ status: 0, fds: 1 });
  const cqHandle = (made as { body: Buffer }).body.readUInt32LE(0);
  expect((made as { body: Buffer }).body.readUInt32LE(4)).toBe(128); // a power of two
  const qp = (f: Record<string, number>): string =>
    `send ${Op.CREATE_QP} ${body(abi.createQp, { pd_handle: pd, send_cq_handle: cqHandle, recv_cq_handle: cqHandle, srq_handle: abi.NO_HANDLE, xrcd_handle: abi.NO_HANDLE, qp_type: 2, max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, ...f })}`;
  expect(await c.reply(qp({ qp_type: 3 }))).toMatchObject({ status: -E.EOPNOTSUPP! }); // UC
  expect(await c.reply(qp({ max_send_sge: 17 }))).toMatchObject({ status: -E.EINVAL! });
  expect(await c.reply(qp({ max_send_wr: 0 }))).toMatchObject({ status: -E.EINVAL! });
  const q = await c.reply(qp({}));
  expect(q).toMatchObject({ status: 0, fds: 1 });
  const qpHandle = (q as { body: Buffer }).body.readUInt32LE(0);
  expect(await c.reply(`send ${Op.DESTROY_CQ} ${handle(cqHandle)}`)).toMatchObject({ status: -E.EBUSY! });
  const modify = (f: Record<string, number>): string => `send ${Op.MODIFY_QP} ${body(abi.modifyQp, { qp_handle: qpHandle, ...f })}`;
  expect(await c.reply(modify({ attr_mask: 1, qp_state: 2 }))).toMatchObject({ status: -E.EINVAL! }); // RESET -> RTR
  expect(await c.reply(modify({ attr_mask: 1, qp_state: 1 }))).toMatchObject({ status: -E.EINVAL! }); // INIT needs PKEY|PORT|ACCESS
  expect(await c.reply(modify({ attr_mask: 0x39, qp_state: 1, port_num: 2 }))).toMatchObject({ status: -E.EINVAL! });
  expect(await c.reply(modify({ attr_mask: 0x39, qp_state: 1, port_num: 1, qp_access_flags: 7 }))).toMatchObject({ status: 0 });
  expect(await c.reply(`send ${Op.QUERY_GID} ${body(abi.portIndex, { port_num: 1, index: 999 })}`)).toMatchObject({ status: -E.EINVAL! });
  expect(await c.reply(`send ${Op.QUERY_PORT} ${body(abi.portIndex, { port_num: 2 })}`)).toMatchObject({ status: -E.EINVAL! });
  const s = await queryStats(dev.dir);
  expect(s.refused.BODY).toBeGreaterThanOrEqual(16);
});

test('a program that goes away has its objects released', async () => {
  const c = client();
  await contextOf(c);
  const pd = await newHandle(c, `send ${Op.ALLOC_PD} -`);
  await newHandle(c, `send ${Op.REG_MR} ${body(abi.regMr, { start: 0x10000n, length: 8192n, iova: 0x10000n, pd_handle: pd, access: 65 })}`);
  await newHandle(c, `send ${Op.CREATE_CQ} ${body(abi.createCq, { cqe: 8, channel_handle: abi.NO_HANDLE })}`);
  expect(dev.device.contexts()[0]!.objects.size).toBe(3);
  c.child.kill('SIGKILL');
  for (let i = 0; i < 200 && dev.device.contexts().length; i++) await new Promise((r) => setTimeout(r, 10));
  const s = await queryStats(dev.dir);
  expect(s).toMatchObject({ openContexts: 0, releasedObjects: 3 });
});

// Random requests on a live context, fields and all: each is answered (0 or -errno), never
// crashes the device, and the device still serves afterwards.
test('random requests are answered and the device goes on (fast-check)', async () => {
  const c = client();
  await contextOf(c);
  const op = fc.integer({ min: 0, max: abi.OP_MAX + 2 }).filter((o) => o !== Op.GET_CONTEXT);
  await fc.assert(
    fc.asyncProperty(op, fc.uint8Array({ maxLength: 160 }), async (o, b) => {
      const r = await c.reply(`send ${o} ${hex(b)}`);
      expect(r).not.toBe('closed');
      expect((r as { status: number }).status).toBeLessThanOrEqual(0);
    }),
    { numRuns: 300 },
  );
  expect(await client().reply(`send ${Op.QUERY_INFO} -`)).toMatchObject({ status: 0 });
}, 60_000);

// The fault socket is a peer's too: the device drops and counts every answer that breaks the
// fault protocol, and the fault it waits for is settled only by a right one.
test('fault answers are checked: wrong ones dropped and counted, the right one settles the fault', async () => {
  const c = client();
  await contextOf(c);
  const ctx = dev.device.contexts()[0]!;
  const pending = ctx.memory.resolve(5, 0x10000n, 4096, true, abi.FaultMethod.POPULATE, 5000);
  const req = Buffer.from((await c.ask('fault-read')).split(' ')[1]!, 'hex');
  expect(req.byteLength).toBe(abi.faultRequest.size);
  expect(req.readUInt32LE(abi.faultRequest.offset('magic'))).toBe(abi.FAULT_MAGIC);
  expect(req.readBigUInt64LE(abi.faultRequest.offset('addr'))).toBe(0x10000n);
  expect(req.readUInt32LE(abi.faultRequest.offset('flags'))).toBe(abi.FAULT_WRITE);
  const id = req.readBigUInt64LE(abi.faultRequest.offset('fault_id'));
  const answer = (f: { magic?: number; op?: number; id?: bigint; status?: number; size?: number }): string => {
    const b = Buffer.alloc(f.size ?? abi.faultResponse.size);
    if (b.byteLength >= abi.faultResponse.size) {
      b.writeUInt32LE(f.magic ?? abi.FAULT_MAGIC, abi.faultResponse.offset('magic'));
      b.writeUInt16LE(abi.ABI_VERSION, abi.faultResponse.offset('abi_version'));
      b.writeUInt16LE(f.op ?? abi.FaultOp.RESOLVED, abi.faultResponse.offset('op'));
      b.writeBigUInt64LE(f.id ?? id, abi.faultResponse.offset('fault_id'));
      b.writeInt32LE(f.status ?? 0, abi.faultResponse.offset('status'));
      b.writeUInt32LE(1, abi.faultResponse.offset('pages'));
    }
    return `fault-send ${b.toString('hex')}`;
  };
  for (const wrong of [{ size: 8 }, { size: 40 }, { magic: 1 }, { op: abi.FaultOp.REQUEST }, { id: id + 99n }, { status: 5 }])
    expect(await c.ask(answer(wrong))).toBe('sent');
  expect(await c.ask(answer({}))).toBe('sent');
  expect(await pending).toMatchObject({ status: 0, pages: 1 });
  expect(await queryStats(dev.dir)).toMatchObject({ faultsRaised: 1, faultsResolved: 1, faultAnswersRefused: 6 });
});

// An XRC domain named by a file is the device's domain of that inode, shared by every context
// that opens it (ibv_open_xrcd with an fd, as ibv_xsrq_pingpong's), with O_CREAT and O_EXCL.
test('XRC domains by file: one per inode on the device, O_CREAT and O_EXCL as the kernel has them', async () => {
  const [a, b] = [client(), client()];
  await contextOf(a);
  await contextOf(b);
  const O_CREAT = 0o100;
  const O_EXCL = 0o200;
  const open = (flags: number, oflags: number): string => `send ${Op.OPEN_XRCD} ${body(abi.openXrcd, { flags, oflags })}`;
  expect(await a.reply(open(0, 0))).toMatchObject({ status: 0 });
  expect(await a.reply(open(0, O_CREAT))).toMatchObject({ status: -E.EINVAL! }); // oflags without a file
  expect(await a.reply(open(1, O_CREAT))).toMatchObject({ status: -E.EINVAL! }); // the file is missing
  expect(await a.reply(`${open(1, O_CREAT)} p`)).toMatchObject({ status: -E.EINVAL! }); // a pipe is not a file
  // Both clients' "f" is their own /proc/self/exe: one binary, one inode.
  expect(await b.reply(`${open(1, 0)} f`)).toMatchObject({ status: -E.ENOENT! });
  const x = await newHandle(a, `${open(1, O_CREAT | O_EXCL)} f`);
  expect(await b.reply(`${open(1, O_CREAT | O_EXCL)} f`)).toMatchObject({ status: -E.EEXIST! });
  expect(await b.reply(`${open(1, 0)} f`)).toMatchObject({ status: 0 });
  expect(await a.reply(`send ${Op.CLOSE_XRCD} ${handle(x)}`)).toMatchObject({ status: 0 });
  a.close();
  b.close();
  for (let i = 0; i < 200 && dev.device.contexts().length; i++) await new Promise((r) => setTimeout(r, 10));
  // Nobody holds it now: the domain is gone, and without O_CREAT it cannot be opened.
  const c = client();
  await contextOf(c);
  expect(await c.reply(`${open(1, 0)} f`)).toMatchObject({ status: -E.ENOENT! });
});
