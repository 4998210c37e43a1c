// A real client's session with a server, recorded off the wire (a TCP proxy between them keeps
// what the client sent), cut into the frames of each provider message, mutated (bit flips,
// truncations, splices, duplicates, drops, swaps) and replayed from a raw socket: the fuzz of
// test/fabric/fuzz.test.ts. Mutations touch this transport's frames only: libfabric's own
// header around each is rebuilt valid, as the provider's parser is libfabric's (port.test.ts
// tries that one, and README's "Security" says what it lets through).
import { connect, createServer, type Socket } from 'node:net';
import { Access, LibfabricTransport, mapRegion, SendFlags, WrOpcode, type Cluster } from '../../lib/index.js';
import { next } from '../verbs/helpers.js';
import { clientQp } from './port-server.js';
import { CM_REQUEST, Raw } from './raw.js';

/** The payloads of the provider messages a client sent, in order (each one of our frames, or a batch of them). */
export type Session = Uint8Array[];

export type Mutation =
  | { kind: 'flip'; msg: number; at: number; bit: number }
  | { kind: 'truncate'; msg: number; at: number }
  | { kind: 'splice'; msg: number; at: number; from: number; fromAt: number }
  | { kind: 'duplicate'; msg: number }
  | { kind: 'drop'; msg: number }
  | { kind: 'swap'; msg: number; with: number };

/**
 * Record a client's session with the server on `port`: it swaps QP numbers as the port server
 * wants, then writes into its MR, past its end, and reads it (which it may not): each answered.
 */
export async function record(port: number): Promise<Session> {
  let sent = Buffer.alloc(0);
  const proxy = createServer((down: Socket) => {
    const up = connect(port, '127.0.0.1');
    down.on('data', (d: Buffer) => {
      sent = Buffer.concat([sent, d]);
      up.write(d);
    });
    up.on('data', (d: Buffer) => down.write(d));
    const end = () => {
      up.destroy();
      down.destroy();
    };
    down.on('close', end).on('error', end);
    up.on('close', end).on('error', end);
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  const via = (proxy.address() as { port: number }).port;
  const t = await LibfabricTransport.connect({ host: '127.0.0.1', port: via, localNodes: [0], peers: [1] });
  const src = mapRegion(8 * 4096);
  let cluster: Cluster | undefined;
  try {
    const { ctx, pd, cq, qp, server: got, ...c } = await clientQp(t);
    cluster = c.cluster;
    new Uint8Array(src.buffer).fill(0x5a);
    const mr = ctx.regMr(pd, src, 0, src.size, Access.LOCAL_WRITE);
    const work: Array<[WrOpcode, number, number]> = [
      [WrOpcode.RDMA_WRITE, 0, 64],
      [WrOpcode.RDMA_WRITE, 0, 4 * 4096],
      [WrOpcode.RDMA_WRITE, 4 * 4096 - 32, 64],
      [WrOpcode.RDMA_READ, 0, 64],
    ];
    for (const [opcode, at, length] of work) {
      qp.postSend({
        wrId: 1,
        opcode,
        sgList: [{ addr: src.address, length, lkey: mr.lkey }],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: got.addr + BigInt(at), rkey: got.rkey },
      });
      // After an error the QP is in ERR: what follows is flushed, which is all the recording needs.
      await next(cq, 10_000);
    }
  } finally {
    cluster?.close();
    t.close();
    src.close();
    await new Promise<void>((resolve) => proxy.close(() => resolve()));
  }
  return split(sent);
}

// The provider messages after the connection request: each a 16-byte header (its total size
// at byte 8) and its payload.
function split(stream: Buffer): Session {
  const out: Session = [];
  for (let at = CM_REQUEST.length; at + 16 <= stream.length;) {
    const size = Number(stream.readBigUInt64LE(at + 8));
    const hdr = stream[at + 6]!;
    if (size < hdr || at + size > stream.length) break;
    out.push(Uint8Array.from(stream.subarray(at + hdr, at + size)));
    at += size;
  }
  return out;
}

/** The session with `mutations` applied in order (indices taken modulo what they index). */
export function mutate(session: Session, mutations: readonly Mutation[]): Session {
  const s = session.map((m) => Uint8Array.from(m));
  for (const m of mutations) {
    if (s.length === 0) break;
    const i = m.msg % s.length;
    const msg = s[i]!;
    switch (m.kind) {
      case 'flip':
        if (msg.length) msg[m.at % msg.length]! ^= 1 << (m.bit % 8);
        break;
      case 'truncate':
        s[i] = msg.subarray(0, m.at % Math.max(1, msg.length));
        break;
      case 'splice': {
        const other = s[m.from % s.length]!;
        const at = m.at % Math.max(1, msg.length);
        s[i] = Uint8Array.from([...msg.subarray(0, at), ...other.subarray(m.fromAt % Math.max(1, other.length))]);
        break;
      }
      case 'duplicate':
        s.splice(i, 0, Uint8Array.from(msg));
        break;
      case 'drop':
        s.splice(i, 1);
        break;
      case 'swap': {
        const j = m.with % s.length;
        [s[i], s[j]] = [s[j]!, msg];
        break;
      }
    }
  }
  // A provider message has a payload (a zero-length one is not a frame of ours).
  return s.filter((m) => m.length > 0);
}

/**
 * Replay `session` from a raw socket, each payload in a valid provider message; resolves with
 * the connection, still open (or closed: a server may refuse the request, or cut it at once).
 */
export async function replay(port: number, session: Session): Promise<Raw> {
  const raw = await Raw.open(port);
  await Promise.race([raw.accepted, raw.closed]);
  if (raw.open) for (const payload of session) raw.send(payload);
  return raw;
}
