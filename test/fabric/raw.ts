// A raw TCP connection to a libfabric tcp server, as an attacker on its port would make:
// libfabric tcp's 32-byte CM request (as captured from a real client: version 3, type
// connreq), then each message a 16-byte provider header (version 3, op msg, header size 16,
// total size little-endian) around one of our frames. What the server sends back is decoded
// with the wire layout, a batch into its frames.
import { connect, type Socket } from 'node:net';
import { decodeFrame, Op, type Frame } from '../../kernel-sim/fabric/headers.js';

export class Raw {
  readonly frames: Frame[] = [];
  readonly closed: Promise<void>;
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
    sock.on('error', () => undefined);
    sock.on('data', (d: Buffer) => this.#data(d));
  }

  /** Connect and send tcp's connection request (version 3, type connreq): 32 bytes, as a real client does. */
  static async open(port: number): Promise<Raw> {
    const sock = connect(port, '127.0.0.1');
    await new Promise<void>((resolve, reject) => sock.once('connect', resolve).once('error', reject));
    const r = new Raw(sock);
    const req = Buffer.alloc(32);
    req[0] = 3;
    req[24] = 1;
    sock.write(req);
    return r;
  }

  /** One provider message (version 3, op msg, header 16 bytes, total size little-endian) around `frame`. */
  send(frame: Uint8Array): void {
    const h = Buffer.alloc(16);
    h[0] = 3;
    h[6] = 16;
    h.writeBigUInt64LE(BigInt(16 + frame.length), 8);
    this.#sock.write(Buffer.concat([h, frame]));
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

/** Poll `ok` until it holds; fail naming `what` after `timeoutMs`. */
export async function until(what: string, ok: () => boolean, timeoutMs = 10_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
