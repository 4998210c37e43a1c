// A job of many processes, started the way HPC users start them: each process learns its
// rank and the job's size from its launcher (mpich's hydra: PMI_RANK / PMI_SIZE; Open MPI:
// OMPI_COMM_WORLD_RANK / _SIZE; `pagefault-rdma run`: PFR_RANK / PFR_SIZE), meets the others
// at rank 0's rendezvous (rendezvous.ts) to learn their transport addresses, then connects to
// every other rank over libfabric: one transport per process, hosting node `rank`, each lower
// rank dialled, each higher one accepted. A rank lost anywhere (its process gone, its
// connection silent past the peer timeout, its abort) fails the whole job: `signal` aborts
// with the reason, so every wait of the program ends.
import { hostname } from 'node:os';
import { DEFAULT_BIND, DEFAULT_TRANSPORT_LIMITS, LibfabricTransport, type LibfabricProvider } from '../../kernel-sim/fabric/libfabric-transport.js';
import { PfrError } from '../errors.js';
import { DEFAULT_RENDEZVOUS_TIMEOUT_MS, MAX_JOB_SIZE, parseHostPort, Rendezvous } from './rendezvous.js';

/** Which launcher started this process. */
export type Launcher = 'pagefault-rdma run' | 'mpich (hydra)' | 'Open MPI';

/** This process's place in its job, as its launcher set it. */
export interface LaunchInfo {
  /** This process's rank, 0..size-1. */
  rank: number;
  /** Processes in the job. */
  size: number;
  /** Which launcher's variables said so. */
  launcher: Launcher;
}

/** The environment variables each launcher sets: rank, size. */
const LAUNCHERS: ReadonlyArray<[Launcher, string, string]> = [
  ['pagefault-rdma run', 'PFR_RANK', 'PFR_SIZE'],
  ['mpich (hydra)', 'PMI_RANK', 'PMI_SIZE'],
  ['Open MPI', 'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'],
];

/** Where rank 0 listens for the rendezvous unless told otherwise (PFR_RENDEZVOUS, --rendezvous). */
export const DEFAULT_RENDEZVOUS = '127.0.0.1:18517';

/** How long a rank lost on the transport waits for the rendezvous to say why before failing with the loss itself. */
const LOSS_GRACE_MS = 1_000;

/** The rank and size the launcher set in `env` (the first launcher whose variables are there). */
export function launchInfo(env: NodeJS.ProcessEnv = process.env): LaunchInfo {
  for (const [launcher, rankVar, sizeVar] of LAUNCHERS) {
    const r = env[rankVar];
    const s = env[sizeVar];
    if (r === undefined && s === undefined) continue;
    const rank = Number(r);
    const size = Number(s);
    if (r === undefined || s === undefined || !/^\d+$/.test(r) || !/^\d+$/.test(s) || size < 1 || size > MAX_JOB_SIZE || rank >= size)
      throw new PfrError(
        'ERR_PFR_NO_LAUNCHER',
        `${launcher} set ${rankVar}=${String(r)} ${sizeVar}=${String(s)}: a rank must be an integer below the size, the size an integer in 1..${MAX_JOB_SIZE}`,
      );
    return { rank, size, launcher };
  }
  throw new PfrError(
    'ERR_PFR_NO_LAUNCHER',
    'this program is one process of a job: start it under a launcher, e.g. `pagefault-rdma run -n 4 -- PROGRAM ...` ' +
      '(or `mpiexec -n 4 npx pagefault-rdma PROGRAM ...` with mpich or Open MPI); ' +
      `it reads its rank and size from ${LAUNCHERS.map(([, r, s]) => `${r}/${s}`).join(', ')}`,
  );
}

/** Options of `Job.start`. */
export interface JobOptions {
  /** Rank 0's rendezvous, HOST:PORT (default: $PFR_RENDEZVOUS, else DEFAULT_RENDEZVOUS). Every rank must be given the same. */
  rendezvous?: string;
  /** The address this rank's transport listens on (default 127.0.0.1; 0.0.0.0: every interface, advertised by host name). */
  bind?: string;
  /** The libfabric provider of the transport (default tcp). */
  provider?: LibfabricProvider;
  /** How long the ranks wait for each other to arrive, and at each allgather (default 30 s). */
  timeoutMs?: number;
  /** A rank whose transport connection is silent this long is lost (LibfabricTransport's peerTimeoutMs). */
  peerTimeoutMs?: number;
  /** Where the launcher's variables are (default process.env). */
  env?: NodeJS.ProcessEnv;
}

/** One process of a job: its rank, the rendezvous, and a transport connected to every other rank (node = rank). */
export class Job {
  /** This process's rank: it hosts node `rank`. */
  readonly rank: number;
  /** Processes (ranks, nodes) in the job. */
  readonly size: number;
  /** The launcher that started it. */
  readonly launcher: Launcher;
  /** Hosts node `rank`; reaches every other rank's node. */
  readonly transport: LibfabricTransport;
  /** Aborted, with the reason, when any rank of the job is lost or fails. */
  readonly signal: AbortSignal;
  #rendezvous: Rendezvous;
  #abort: AbortController;
  #timeoutMs: number;
  #ending: { value: boolean };
  #closed = false;

  private constructor(
    info: LaunchInfo,
    transport: LibfabricTransport,
    rendezvous: Rendezvous,
    abort: AbortController,
    timeoutMs: number,
    ending: { value: boolean },
  ) {
    this.rank = info.rank;
    this.size = info.size;
    this.launcher = info.launcher;
    this.transport = transport;
    this.#rendezvous = rendezvous;
    this.#abort = abort;
    this.signal = abort.signal;
    this.#timeoutMs = timeoutMs;
    this.#ending = ending;
  }

  /** Learn rank and size from the launcher, meet the others at the rendezvous, connect to all of them. */
  static async start(o: JobOptions = {}): Promise<Job> {
    const env = o.env ?? process.env;
    const info = launchInfo(env);
    const at = parseHostPort(o.rendezvous ?? env['PFR_RENDEZVOUS'] ?? DEFAULT_RENDEZVOUS, 'the rendezvous address (--rendezvous, PFR_RENDEZVOUS)');
    const timeoutMs = o.timeoutMs ?? DEFAULT_RENDEZVOUS_TIMEOUT_MS;
    const bind = o.bind ?? DEFAULT_BIND;
    // The other ranks, and only they, connect here (each hello must name one of them): all of
    // them may be connected, and all may dial at once while the job starts.
    const others = [...Array(info.size).keys()].filter((r) => r !== info.rank);
    const transport = LibfabricTransport.listen({
      port: 0,
      host: bind,
      localNodes: [info.rank],
      peers: others,
      limits: { maxPeers: Math.max(1, others.length), maxWaiting: Math.max(DEFAULT_TRANSPORT_LIMITS.maxWaiting, others.length) },
      ...(o.provider ? { provider: o.provider } : {}),
      ...(o.peerTimeoutMs !== undefined ? { peerTimeoutMs: o.peerTimeoutMs } : {}),
    });
    const advertised = bind === '0.0.0.0' ? hostname() : bind;
    const abort = new AbortController();
    // Once the ranks are ending the job, a transport closing is the normal end, not a loss.
    const ending = { value: false };
    let rendezvous: Rendezvous | undefined;
    try {
      rendezvous = await Rendezvous.open({ rank: info.rank, size: info.size, at, address: `${advertised}:${transport.port}`, timeoutMs });
      const rdv = rendezvous;
      rdv.onFailure((e) => abort.abort(e));
      transport.onPeerLost((node, reason) => {
        if (ending.value) return;
        const why = reason?.message.replace(/^the peer went away: /, '') ?? 'its connection shut down';
        const e = new PfrError('ERR_PFR_RANK_LOST', `rank ${node} went away (its transport connection: ${why})`);
        // A rank that fails closes its connections just after telling rank 0 why: the
        // rendezvous gets a moment to bring that first cause before this loss becomes the reason.
        setTimeout(() => {
          abort.abort(e);
          rdv.abort(e.message);
        }, LOSS_GRACE_MS).unref();
      });
      // Lower ranks are dialled, higher ones dial here: one connection per pair.
      const failed = new Promise<never>((_, reject) => rdv.onFailure(reject));
      await Promise.race([
        failed,
        Promise.all([
          ...rdv.addresses.slice(0, info.rank).map((a, r) => {
            const { host, port } = parseHostPort(a, `rank ${r}'s address`);
            return transport.connectPeer(host, port, timeoutMs);
          }),
          transport.waitForNodes(others, timeoutMs),
        ]),
      ]);
      // Everyone is connected to everyone before any rank starts its work.
      await rdv.barrier(timeoutMs);
    } catch (e) {
      rendezvous?.abort((e as Error).message);
      await rendezvous?.close(0);
      transport.close();
      throw e;
    }
    return new Job(info, transport, rendezvous, abort, timeoutMs, ending);
  }

  /** Every rank's `value` (JSON), by rank. Fails if the job fails meanwhile. */
  allgather<T = unknown>(value: T, timeoutMs = this.#timeoutMs): Promise<T[]> {
    return this.#rendezvous.allgather(value, timeoutMs) as Promise<T[]>;
  }

  /** Wait until every rank has reached this barrier. */
  barrier(timeoutMs = this.#timeoutMs): Promise<void> {
    return this.#rendezvous.barrier(timeoutMs);
  }

  /** This rank fails: every other rank is told why, and fails too. */
  abort(reason: string): void {
    this.#rendezvous.abort(reason);
    this.#abort.abort(new PfrError('ERR_PFR_RANK_LOST', `rank ${this.rank} failed: ${reason}`));
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /**
   * Leave the job: a last barrier (no rank closes its transport while another still uses
   * it), then the rendezvous and the transport. A failure meanwhile is in `signal`. Idempotent.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#ending.value = true;
    if (!this.signal.aborted) await this.#rendezvous.barrier(this.#timeoutMs).catch(() => undefined);
    // A failed job waits for nobody: a rank may be stopped, its socket never closing.
    await this.#rendezvous.close(this.signal.aborted ? 0 : undefined);
    this.transport.close();
  }
}
