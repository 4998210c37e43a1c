// The device process's device (`pagefault-rdma device`): one per host and user, listening on
// the control socket of its runtime folder. Each connection is a program's context (or a short
// query); every message is checked as a packet from the wire (messages.ts), and a refusal is
// answered, counted by reason and logged while the device goes on with everyone else. A program
// that goes away has its objects released when its socket closes. With no connection for the
// idle timeout, the device says so (the command then stops it).
import { closeSync } from 'node:fs';
import { constants } from 'node:os';
import * as abi from './abi.js';
import { INFO_DATA_PATH, Op, REFUSAL_KINDS, Refusal } from './abi.js';
import { deviceInfo, firmwareVersion, hostGids, nodeGuid, type Gid } from './attributes.js';
import { ProgramContext, type DeviceServices, type Reply } from './context.js';
import { DeviceEngine, type DataPathCounters } from './data-path.js';
import { encodeReply, errnoStatus, parseRequest, Refused, ReplyWriter, requestIdOf, type Request } from './messages.js';
import type { FaultCounters } from './program-memory.js';
import { DeviceLock, runtimeDir, socketPath } from './runtime-dir.js';
import { SeqpacketListener, type Datagram, type SeqpacketConnection } from './seqpacket.js';

/** Options of `Device.start`. */
export interface DeviceOptions {
  /** The runtime folder (default: runtimeDir()). */
  dir?: string;
  /** The device's name (ibv_get_device_name), default 'pfr0'. */
  name?: string;
  /** The package version, for fw_ver. */
  version?: string;
  /** With no connection for this long, call onIdle (0: never). */
  idleTimeoutMs?: number;
  onIdle?: () => void;
  /** One line per event worth a log (connections, refusals). */
  log?: (line: string) => void;
  /** Run the data path (the engine consumes the rings; PFR_INFO_DATA_PATH). Default true. */
  dataPath?: boolean;
}

/** What the device counted (struct pfr_device_stats). */
export interface DeviceStats {
  connections: number;
  openContexts: number;
  messages: number;
  /** Refused messages by reason (enum pfr_refusal's names). */
  refused: Record<keyof typeof Refusal, number>;
  faultsRaised: number;
  faultsResolved: number;
  faultsFailed: number;
  /** Fault answers that broke the protocol (dropped). */
  faultAnswersRefused: number;
  releasedObjects: number;
  /** The data path's counters (WQEs, CQEs, refused entries, corrupt rings, doorbells; events in the device's own process only). */
  dataPath?: Partial<DataPathCounters> & Pick<DataPathCounters, 'sendWqes' | 'recvWqes' | 'cqes' | 'refusedWqes' | 'corruptRings' | 'doorbells'>;
}

interface Connection {
  conn: SeqpacketConnection;
  ctx: ProgramContext | undefined;
}

/** The device: its control socket, its programs' contexts, its counters. */
export class Device {
  readonly dir: string;
  readonly socketPath: string;
  readonly name: string;
  readonly gids: readonly Gid[];
  readonly #lock: DeviceLock;
  readonly #listener: SeqpacketListener;
  readonly #connections = new Set<Connection>();
  readonly #services: DeviceServices;
  readonly #options: DeviceOptions;
  /** The engine the contexts run on (undefined: the device serves the control path only). */
  readonly engine: DeviceEngine | undefined;
  readonly #refused = new Array<number>(REFUSAL_KINDS).fill(0);
  readonly #faults: FaultCounters = { raised: 0, resolved: 0, failed: 0, refused: 0 };
  #accepted = 0;
  #messages = 0;
  #released = 0;
  #nextContext = 1;
  #idle: NodeJS.Timeout | undefined;
  #closed = false;

  private constructor(options: DeviceOptions) {
    this.#options = options;
    this.dir = options.dir ?? runtimeDir();
    this.name = options.name ?? 'pfr0';
    this.gids = hostGids();
    this.#lock = DeviceLock.take(this.dir);
    this.socketPath = socketPath(this.dir);
    this.engine = options.dataPath === false ? undefined : new DeviceEngine();
    let key = 0x1000;
    let qpn = 0x10;
    let srqn = 0x10;
    this.#services = {
      name: this.name,
      guid: nodeGuid(),
      fwVer: firmwareVersion(options.version ?? '0.0.0'),
      gids: this.gids,
      infoFlags: this.engine ? INFO_DATA_PATH : 0,
      newKey: () => (key = key >= 0xfffff000 ? 0x1000 : key + 1),
      newQpNum: () => (qpn = qpn >= 0xffffff ? 0x10 : qpn + 1),
      newSrqNum: () => (srqn = srqn >= 0xffffff ? 0x10 : srqn + 1),
      counts: { mr: 0, qp: 0, cq: 0, srq: 0, pd: 0, ah: 0 },
      faults: this.#faults,
      xrcds: new Map(),
      engine: this.engine,
    };
    try {
      this.#listener = new SeqpacketListener(this.socketPath, (c) => this.#accept(c));
    } catch (err) {
      this.engine?.close();
      this.#lock.release();
      throw err;
    }
    this.#armIdle();
  }

  /** Take the runtime folder (one device per folder) and listen on its socket. */
  static start(options: DeviceOptions = {}): Device {
    return new Device(options);
  }

  /** Whether the data path runs (PFR_INFO_DATA_PATH: the engine consumes the rings). */
  get dataPath(): boolean {
    return (this.#services.infoFlags & INFO_DATA_PATH) !== 0;
  }

  /** The contexts of the programs connected now. */
  contexts(): ProgramContext[] {
    return [...this.#connections].flatMap((c) => (c.ctx ? [c.ctx] : []));
  }

  stats(): DeviceStats {
    const refused = Object.fromEntries(
      Object.entries(Refusal)
        .filter(([, v]) => typeof v === 'number')
        .map(([k, v]) => [k, this.#refused[v as number]!]),
    ) as Record<keyof typeof Refusal, number>;
    return {
      connections: this.#accepted,
      openContexts: this.contexts().length,
      messages: this.#messages,
      refused,
      faultsRaised: this.#faults.raised,
      faultsResolved: this.#faults.resolved,
      faultsFailed: this.#faults.failed,
      faultAnswersRefused: this.#faults.refused,
      releasedObjects: this.#released,
      dataPath: this.engine ? { ...this.engine.counters } : undefined,
    };
  }

  #log(line: string): void {
    this.#options.log?.(line);
  }

  #armIdle(): void {
    clearTimeout(this.#idle);
    this.#idle = undefined;
    const ms = this.#options.idleTimeoutMs ?? 0;
    if (ms > 0 && this.#connections.size === 0 && !this.#closed) this.#idle = setTimeout(() => this.#options.onIdle?.(), ms);
  }

  #accept(conn: SeqpacketConnection): void {
    this.#accepted++;
    const peer = conn.peer!;
    if (peer.uid !== (process.getuid?.() ?? 0)) {
      this.#refused[Refusal.PEER]!++;
      this.#log(`refused a connection of uid ${peer.uid} (pid ${peer.pid}): the device serves uid ${process.getuid?.()} only`);
      conn.close();
      return;
    }
    const c: Connection = { conn, ctx: undefined };
    this.#connections.add(c);
    this.#armIdle();
    conn.listen({ message: (d) => this.#message(c, d), close: () => this.#drop(c) });
  }

  #message(c: Connection, d: Datagram): void {
    this.#messages++;
    let req: Request | undefined;
    let reply: Reply;
    try {
      req = parseRequest(d, c.ctx !== undefined);
      reply = this.#dispatch(c, req);
    } catch (err) {
      for (const fd of d.fds) closeSync(fd);
      this.#refuse(c, d, req, err);
      return;
    }
    // The request's descriptors are the device's to close unless the handler kept them (it
    // keeps them only once nothing can fail: a refusal keeps none).
    for (const fd of d.fds) if (!reply.kept?.includes(fd)) closeSync(fd);
    let sent = false;
    try {
      sent = c.conn.send(encodeReply(req.op, req.requestId, 0, reply.body), reply.fds ?? []);
    } catch (err) {
      this.#log(`pid ${c.conn.peer?.pid}: the reply to ${Op[req.op]} could not be sent: ${(err as Error).message}`);
    }
    if (!sent) this.#drop(c); // a program that does not read its replies, or whose socket failed
  }

  #dispatch(c: Connection, req: Request): Reply {
    switch (req.op) {
      case Op.QUERY_INFO:
        return { body: deviceInfo(this.name, this.#services.guid, this.#services.infoFlags, 1) };
      case Op.QUERY_STATS:
        return { body: this.#statsBody() };
      case Op.GET_CONTEXT: {
        const ctx = new ProgramContext(this.#nextContext++, c.conn.peer!, this.#services, req);
        c.ctx = ctx;
        this.#log(`context ${ctx.handle}: pid ${ctx.peer.pid}`);
        return ctx.contextReply();
      }
      default:
        return c.ctx!.answer(req);
    }
  }

  #refuse(c: Connection, d: Datagram, req: Request | undefined, err: unknown): void {
    const op = req?.op ?? (d.bytes.byteLength >= 8 ? new DataView(d.bytes.buffer, d.bytes.byteOffset).getUint16(6, true) : 0);
    const id = req?.requestId ?? requestIdOf(d);
    let status: number;
    let fatal = false;
    if (err instanceof Refused) {
      this.#refused[err.reason]!++;
      status = errnoStatus(err.errno);
      fatal = err.fatal;
      this.#log(`pid ${c.conn.peer?.pid}: refused ${Op[op] ?? `op ${op}`} (${err.errno}): ${err.message}`);
    } else {
      // A system call the device made failed (a memfd past a limit, …): the program hears its errno.
      const code = (err as { code?: string }).code ?? '';
      const n = (constants.errno as Record<string, number>)[code];
      status = n ? -n : -constants.errno.EIO;
      this.#refused[Refusal.RESOURCE]!++;
      this.#log(`pid ${c.conn.peer?.pid}: ${Op[op] ?? `op ${op}`} failed: ${(err as Error).message}`);
    }
    c.conn.send(encodeReply(op, id, status));
    if (fatal) {
      c.conn.close();
      this.#drop(c);
    }
  }

  #statsBody(): Uint8Array {
    const s = this.stats();
    const w = new ReplyWriter(abi.deviceStats);
    w.u64('connections', BigInt(s.connections)).u64('open_contexts', BigInt(s.openContexts)).u64('messages', BigInt(s.messages));
    const v = new DataView(w.bytes.buffer);
    this.#refused.forEach((n, i) => v.setBigUint64(abi.deviceStats.offset('refused') + 8 * i, BigInt(n), true));
    w.u64('faults_raised', BigInt(s.faultsRaised)).u64('faults_resolved', BigInt(s.faultsResolved)).u64('faults_failed', BigInt(s.faultsFailed));
    w.u64('fault_answers_refused', BigInt(s.faultAnswersRefused));
    w.u64('released_objects', BigInt(s.releasedObjects));
    const d = s.dataPath;
    if (d)
      w.u64('send_wqes', BigInt(d.sendWqes))
        .u64('recv_wqes', BigInt(d.recvWqes))
        .u64('cqes', BigInt(d.cqes))
        .u64('refused_wqes', BigInt(d.refusedWqes))
        .u64('corrupt_rings', BigInt(d.corruptRings))
        .u64('doorbells', BigInt(d.doorbells));
    return w.bytes;
  }

  // The connection is gone (the program ended or closed its context): its objects are released.
  #drop(c: Connection): void {
    if (!this.#connections.delete(c)) return;
    c.conn.close();
    if (c.ctx) {
      const n = c.ctx.release();
      this.#released += n;
      const f = c.ctx.dataPath?.faults;
      const faults = f ? `, its transfers took ${f.source} source and ${f.destination} destination faults` : '';
      this.#log(`context ${c.ctx.handle}: pid ${c.ctx.peer.pid} went away, ${n} object${n === 1 ? '' : 's'} released${faults}`);
    }
    this.#armIdle();
  }

  /** Stop: every context released, the socket and the lock let go. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#idle);
    this.#listener.close();
    for (const c of [...this.#connections]) this.#drop(c);
    this.engine?.close();
    this.#lock.release();
  }
}
