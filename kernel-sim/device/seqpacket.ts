// SOCK_SEQPACKET Unix sockets over the addon (native/seqpacket.cc): a listener whose
// connections know their peer (SO_PEERCRED), and connections whose messages carry file
// descriptors. Each message reaches its handler as the datagram's bytes and the descriptors it
// brought, which the handler owns from then on (it keeps them or closes them).
import { binding } from '../../native/index.js';

/** Who is at the other end of a connection (SO_PEERCRED at connect time). */
export interface PeerCred {
  pid: number;
  uid: number;
  gid: number;
}

/** One datagram: its bytes, its descriptors, whether the kernel cut either short. */
export interface Datagram {
  bytes: Uint8Array;
  fds: number[];
  /** Longer than the receive buffer (PFR_CTL_MAX_MESSAGE): the rest was dropped. */
  truncated: boolean;
  /** More descriptors than the receiver takes: the rest were closed by the kernel. */
  fdsTruncated: boolean;
}

/** What a connection's owner hears. */
export interface ConnectionHandlers {
  message(d: Datagram): void;
  /** The peer went away (or the socket failed): the connection is closed. */
  close(): void;
}

/** A connected SOCK_SEQPACKET socket. */
export class SeqpacketConnection {
  readonly peer: PeerCred | undefined;
  #handle: number;
  #handlers: ConnectionHandlers | undefined;
  #closed = false;
  readonly #forget: (() => void) | undefined;

  /** Wrap a handle of the addon's (the listener makes them; connect() and adopt() too); `forget` runs once it is closed. */
  constructor(handle: number, peer?: PeerCred, forget?: () => void) {
    this.#handle = handle;
    this.peer = peer;
    this.#forget = forget;
  }

  /** A client connection to the socket at `path` (tests, the CLI's queries). */
  static connect(path: string): SeqpacketConnection {
    const conn: { c?: SeqpacketConnection } = {};
    const handle = binding.seqpacketConnect(path, (kind, _h, a, b, c) => conn.c?.dispatch(kind, a, b, c));
    conn.c = new SeqpacketConnection(handle);
    return conn.c;
  }

  /** A connected socket a peer sent: the fd belongs to the connection now. */
  static adopt(fd: number): SeqpacketConnection {
    const conn: { c?: SeqpacketConnection } = {};
    const handle = binding.seqpacketAdopt(fd, (kind, _h, a, b, c) => conn.c?.dispatch(kind, a, b, c));
    conn.c = new SeqpacketConnection(handle);
    return conn.c;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Start hearing messages (those that arrived before wait in the socket). */
  listen(handlers: ConnectionHandlers): void {
    this.#handlers = handlers;
  }

  /** Called by whoever owns the native handle's events. */
  dispatch(kind: string, a: unknown, b: unknown, c: unknown): void {
    if (kind === 'message') {
      const flags = c as number;
      const d: Datagram = { bytes: a as Uint8Array, fds: b as number[], truncated: (flags & 1) !== 0, fdsTruncated: (flags & 2) !== 0 };
      if (this.#handlers && !this.#closed) this.#handlers.message(d);
      else for (const fd of d.fds) binding.fdClose(fd);
    } else if (kind === 'close' || kind === 'error') {
      if (this.#closed) return;
      this.#closed = true;
      this.#forget?.();
      this.#handlers?.close();
    }
  }

  /** Send one message with copies of `fds`; false when the peer's queue is full (it does not read). */
  send(bytes: Uint8Array, fds: number[] = []): boolean {
    if (this.#closed) return false;
    return binding.seqpacketSend(this.#handle, bytes, fds);
  }

  /** Close the socket; no close event follows. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#forget?.();
    binding.seqpacketClose(this.#handle);
  }
}

/** A listening SOCK_SEQPACKET socket (mode 0600). */
export class SeqpacketListener {
  readonly path: string;
  #handle: number;
  readonly #connections = new Map<number, SeqpacketConnection>();
  #closed = false;

  constructor(path: string, onConnection: (c: SeqpacketConnection) => void) {
    this.path = path;
    this.#handle = binding.seqpacketListen(path, (kind, handle, a, b, c, d) => {
      if (kind === 'connection') {
        const id = a as number;
        const conn = new SeqpacketConnection(id, { pid: b as number, uid: c as number, gid: d as number }, () => this.#connections.delete(id));
        this.#connections.set(id, conn);
        onConnection(conn);
        return;
      }
      const conn = this.#connections.get(handle);
      if (conn) conn.dispatch(kind, a, b, c);
      else if (kind === 'message') for (const fd of b as number[]) binding.fdClose(fd);
    });
  }

  /** Stop listening (connections stay until closed). Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    binding.seqpacketClose(this.#handle);
  }
}
