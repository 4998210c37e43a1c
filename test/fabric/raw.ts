// A raw TCP connection to a libfabric tcp server, as an attacker on its port would make:
// libfabric tcp's 32-byte CM request (as captured from a real client: version 3, type
// connreq), then each message a 16-byte provider header (version 3, op msg, header size 16,
// total size little-endian) around one of our frames, or any header (libfabricHeader) for
// the provider's own parser. What the server sends back is decoded with the wire layout, a
// batch into its frames.
import { connect, type Socket } from 'node:net';
import { decodeFrame, type Frame } from '../../kernel-sim/fabric/framing.js';
import { Op } from '../../kernel-sim/fabric/wire-codec.js';

export class Raw {
  readonly frames: Frame[] = [];
  readonly closed: Promise<void>;
  /** Resolves once the server's answer to the connection request came (the endpoint is there). */
  readonly accepted: Promise<void>;
  #accept = (): void => {};
  /** Whether the connection is still open. */
  open = true;
  #sock: Socket;
  #buf = Buffer.alloc(0);
  #cm = false;

  private constructor(sock: Socket) {
    this.#sock = sock;
    this.closed = new Promise((resolve) =>
      sock.on('close', () => {
        this.open = false;
        resolve();
      }),
    );
    this.accepted = new Promise((resolve) => (this.#accept = resolve));
    sock.on('error', () => undefined);
    sock.on('data', (d: Buffer) => this.#data(d));
  }

  /** Connect and send tcp's connection request (version 3, type connreq): 32 bytes, as a real client does. */
  static async open(port: number): Promise<Raw> {
    const r = await Raw.bare(port);
    r.write(CM_REQUEST);
    return r;
  }

  /** Connect only: a TCP connection that sends nothing, not even the connection request. */
  static async bare(port: number): Promise<Raw> {
    const sock = connect(port, '127.0.0.1');
    await new Promise<void>((resolve, reject) => sock.once('connect', resolve).once('error', reject));
    return new Raw(sock);
  }

  /** Bytes as they are, on the socket. */
  write(bytes: Uint8Array): void {
    this.#sock.write(bytes);
  }

  /** Stop reading what the server sends (it piles up in the kernel, then in the server). */
  pause(): void {
    this.#sock.pause();
  }

  /** One provider message (version 3, op msg, header 16 bytes, total size little-endian) around `frame`. */
  send(frame: Uint8Array): void {
    this.#sock.write(Buffer.concat([libfabricHeader({ size: 16 + frame.length }), frame]));
  }

  close(): void {
    this.#sock.destroy();
  }

  #data(d: Buffer): void {
    this.#buf = Buffer.concat([this.#buf, d]);
    if (!this.#cm) {
      if (this.#buf.length < 32) return;
      this.#buf = this.#buf.subarray(32);
      this.#cm = true;
      this.#accept();
    }
    while (this.#buf.length >= 16) {
      const size = Number(this.#buf.readBigUInt64LE(8));
      if (this.#buf.length < size) return;
      const f = decodeFrame(this.#buf.subarray(this.#buf[6]!, size));
      // A batch (the frames one turn of the server had ready for us): its frames, in order.
      if (f.op === Op.BATCH) this.frames.push(...f.frames.map((x) => decodeFrame(x)));
      else this.frames.push(f);
      this.#buf = this.#buf.subarray(size);
    }
  }
}

/** libfabric tcp's connection request as a real client sends it: version 3, type connreq, no data. */
export const CM_REQUEST = Uint8Array.from({ length: 32 }, (_, i) => (i === 0 ? 3 : i === 24 ? 1 : 0));

/** libfabric 1.17 tcp's 16-byte message header: version 3, then op, flags, op_data, hdr_size and the total size as given. */
export function libfabricHeader(h: { op?: number; flags?: number; opData?: number; hdrSize?: number; size: number }): Buffer {
  const b = Buffer.alloc(16);
  b[0] = 3;
  b[1] = h.op ?? 0;
  b.writeUInt16LE(h.flags ?? 0, 2);
  b[4] = h.opData ?? 0;
  b[6] = h.hdrSize ?? 16;
  b.writeBigUInt64LE(BigInt(h.size), 8);
  return b;
}

/** Poll `ok` until it holds; fail naming `what` after `timeoutMs`. */
export async function until(what: string, ok: () => boolean, timeoutMs = 10_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
