// The two-process programs over libfabric (rc-pingpong like rdma-core's ibv_rc_pingpong;
// write-bw, write-lat, read-bw, send-lat, atomic-lat like perftest's): a server without HOST,
// a client with it, one file per command in commands/ built from here. The work is
// examples/fabric-peer.ts. The client decides the run's parameters; the server adopts them.
import { hostname } from 'node:os';
import { InvalidArgumentError, Option, type Command } from 'commander';
import {
  DEFAULT_BIND,
  DEFAULT_MAX_SPIN_US,
  DEFAULT_TRANSPORT_LIMITS,
  LIBFABRIC_PROVIDERS,
  latencyStats,
  POLICIES,
  PROGRESS_MODES,
  type LibfabricProvider,
  type ProgressMode,
  type PolicyName,
} from '../lib/index.js';
import {
  DEFAULT_RX_DEPTH,
  DEFAULT_SERVER_LIMITS,
  MAX_MSG,
  MTUS,
  PEER_TIMEOUT_MS,
  runPeer,
  type AtomicType,
  type Endpoint,
  type FaultTime,
  type FabricOp,
  type PeerResult,
  type RunParams,
  type SizeRun,
} from '../examples/fabric-peer.js';
import { LATENCY_COLUMNS, latencyCells, parsePositiveInt, parseSize, print, Table } from '../examples/support/format.js';
import type { TraceFile } from '../examples/support/trace-file.js';
import { defineProgram, type CommonOptions, type Program, type RunOutcome } from './program.js';
import { MAX_RESTARTS, supervise, tellSupervisor, workerPort } from './supervise.js';

/** rc_pingpong's and perftest's default port. */
export const DEFAULT_PORT = 18515;

export interface FabricOptions extends CommonOptions {
  port: number;
  bind: string;
  size: number;
  iters: number;
  odp: boolean;
  policy: PolicyName;
  evict: boolean;
  provider: LibfabricProvider;
  mtu?: number;
  stall?: boolean;
  all?: boolean;
  atomic_type?: AtomicType;
  events?: boolean;
  iodp?: boolean;
  prefetch?: boolean;
  rxDepth?: number;
  report_gbits?: boolean;
  out_json?: string;
  duration?: number;
  run_infinitely?: boolean;
  txDepth?: number;
  qp?: number;
  bidirectional?: boolean;
  inline_size?: number;
  token?: string;
  progress: ProgressMode;
  maxSpinUs: number;
  supervise?: boolean;
  maxMsg: number;
  maxQps: number;
  maxMemory: number;
}

function parsePort(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0 || n > 65535) throw new Error(`-p: expected a port in 0..65535, got ${value}`);
  return n;
}

/**
 * The largest message these programs carry between processes: 1 GiB. Past it (up to the port's
 * max_msg_sz, 2^31 bytes) a transfer keeps a process's JavaScript thread busy longer than the
 * transport's peer timeout (each page is translated and checked there; measured here: -s 2047M
 * fails that way), and the other side then counts it lost.
 */
export const MAX_PROGRAM_MSG = 2 ** 30;

/** A message size the programs carry (see MAX_PROGRAM_MSG; the requester refuses past MAX_MSG with LOC_LEN_ERR). */
export function parseMessageSize(value: string): number {
  const n = parseSize(value);
  if (n > MAX_MSG) throw new InvalidArgumentError(`${value} is larger than the largest message, 2^31 bytes (the modelled port's max_msg_sz)`);
  if (n > MAX_PROGRAM_MSG)
    throw new InvalidArgumentError(
      `${value} is larger than these programs carry between processes, 1G: a larger transfer keeps a process busy past the transport's peer timeout (${PEER_TIMEOUT_MS} ms), and the other side counts it lost`,
    );
  return n;
}

function parseMtu(value: string): number {
  const n = Number(value);
  if (!MTUS.includes(n)) throw new InvalidArgumentError(`expected a path MTU: ${MTUS.join(', ')}`);
  return n;
}

function parseUpTo(max: number): (value: string) => number {
  return (value) => {
    const n = parsePositiveInt(value);
    if (n > max) throw new InvalidArgumentError(`at most ${max}`);
    return n;
  };
}

function parseSeconds(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n <= 0) throw new InvalidArgumentError('expected a whole number of seconds (at least 1)');
  return n;
}

function parseInline(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError('expected a size in bytes');
  // The engine reads every payload through the SMMU: that read is where a source fault is taken.
  if (n > 0)
    throw new InvalidArgumentError(`inline sends are not modelled (every payload is read from memory by the engine, through its SMMU): only 0`);
  return n;
}

function parseSpin(v: string): number {
  const n = Number(v);
  if (!/^\d+(\.\d+)?$/.test(v) || !(n <= 1_000_000)) throw new InvalidArgumentError('a number of µs in 0..1000000');
  return n;
}

/** What kind of program: its options and defaults follow perftest's (bw, lat) or ibv_rc_pingpong's. */
type Kind = 'bw' | 'lat' | 'pingpong';

function addFabricOptions(cmd: Command, kind: Kind, op: FabricOp): void {
  cmd
    .argument('[host]', 'the server to connect to (without it: run the server)')
    .option('-p, --port <port>', `listen on / connect to port (0: any free port, printed)`, parsePort, DEFAULT_PORT)
    .option('--bind <addr>', 'server: the address to listen on (0.0.0.0: every interface)', DEFAULT_BIND)
    .addOption(
      new Option('--token <secret>', 'a secret both sides are given: a peer whose hello does not carry it is refused (README, "Security")').env(
        'PFR_FABRIC_TOKEN',
      ),
    )
    .option(
      '--supervise',
      `server: run in a child process, started again on the same port (up to ${MAX_RESTARTS} times) if a libfabric provider crash on a stranger's message kills it while it waits for its client (README, "Security")`,
      false,
    )
    .option('--max-msg <bytes>', 'server: the largest message a client may ask for', parseSize, DEFAULT_SERVER_LIMITS.maxSize)
    .option('--max-qps <n>', 'server: the most QPs a client may ask for', parsePositiveInt, DEFAULT_SERVER_LIMITS.maxQps)
    .option(
      '--max-memory <bytes>',
      "server: the most buffer a client's run may need here (QPs × 2 × message size)",
      parseSize,
      DEFAULT_SERVER_LIMITS.maxMemory,
    )
    .addHelpText(
      'after',
      `\nThe server serves one client. It rejects every other connection request once that client is connected, and ` +
        `until then lets at most ${DEFAULT_TRANSPORT_LIMITS.maxWaiting} connections wait for their hello (limits.maxWaiting), each for ` +
        `${DEFAULT_TRANSPORT_LIMITS.helloTimeoutMs} ms (limits.helloTimeoutMs), TCP connections that send nothing too. A peer may send frames of ` +
        `${DEFAULT_TRANSPORT_LIMITS.maxFrameBytes >> 20} MiB at most in chunks (limits.maxFrameBytes), make it hold ${DEFAULT_TRANSPORT_LIMITS.maxHeldBytes >> 20} MiB ` +
        `(limits.maxHeldBytes) and leave ${DEFAULT_TRANSPORT_LIMITS.maxUnsentBytes >> 20} MiB unread (limits.maxUnsentBytes); past a limit its connection is cut, the limit named. ` +
        `A client asking for more than --max-msg, --max-qps or --max-memory is refused, and so is one running another program.`,
    );
  if (op !== 'atomic') cmd.option('-s, --size <bytes>', 'message size (4096, 64K, 1M; at most 1G)', parseMessageSize, 4096);
  cmd
    .option('-n, --iters <n>', 'iterations (per QP)', parsePositiveInt, kind === 'bw' ? 5000 : 1000)
    .option(kind === 'pingpong' ? '-o, --odp' : '--odp', 'register the buffers with ODP (Access.ON_DEMAND)', false)
    .option('-m, --mtu <bytes>', `path MTU set on the QPs (${MTUS.join(', ')}; the engine moves 4096-byte blocks whatever it is)`, parseMtu, 1024)
    .addOption(
      new Option('--policy <name>', 'fault library policy of the buffers').choices(POLICIES.filter((p) => p !== 'pin')).default('touch-ahead'),
    )
    .option('--evict', 'evict the buffers before every message: genuine faults at both ends', false)
    .addOption(new Option('--provider <name>', 'libfabric provider').choices([...LIBFABRIC_PROVIDERS]).default('tcp'))
    .addOption(
      new Option(
        '--progress <mode>',
        `how this side waits for an answer it expects: adaptive polls the CQ up to twice what answers took (at most ${DEFAULT_MAX_SPIN_US} µs) before sleeping, poll always that long, wait sleeps at once (README, "Progress")`,
      )
        .choices([...PROGRESS_MODES])
        .default('adaptive'),
    )
    .option('--max-spin-us <us>', 'the longest poll for an answer before sleeping, µs (0: never poll)', parseSpin, DEFAULT_MAX_SPIN_US);
  if (kind === 'pingpong') {
    cmd
      .option('-O, --iodp', 'use implicit on-demand paging: one MR of address 0, length SIZE_MAX', false)
      .option('-P, --prefetch', 'prefetch the ODP MR once registered (ibv_advise_mr PREFETCH, FLUSH)', false)
      .option('-r, --rx-depth <n>', `receives to post at a time (default ${DEFAULT_RX_DEPTH})`, parseUpTo(1 << 16), DEFAULT_RX_DEPTH)
      .option('-e, --events', 'sleep on CQ events: a completion channel, ibv_req_notify_cq and ibv_get_cq_event (both sides)', false);
    return;
  }
  if (op === 'write' || op === 'read')
    cmd.option(
      '--stall',
      `stall mode (faultModel 'stall'): libfabric RMA ${op}s ${op === 'write' ? 'straight into' : 'straight from'} the server's userfaultfd-registered buffer; its provider thread blocks in the faults`,
      false,
    );
  if (op === 'atomic')
    cmd.addOption(
      new Option('-A, --atomic_type <type>', 'the atomic operation (perftest -A)')
        .choices(['FETCH_AND_ADD', 'CMP_AND_SWAP'])
        .default('FETCH_AND_ADD'),
    );
  else cmd.option('-a, --all', 'run every size from 2 to 2^23 bytes, -n iterations each (perftest -a)', false);
  cmd
    .option('-D, --duration <seconds>', 'run each size for this many seconds instead of -n iterations', parseSeconds)
    .option('--run_infinitely', 'run until Ctrl-C, printing a line every -D seconds (default 5); exits 0 on Ctrl-C', false)
    .option('-t, --tx-depth <n>', `work requests in flight per QP (default ${kind === 'bw' ? 128 : 1})`, parseUpTo(8192))
    .option('-q, --qp <n>', 'QPs, each moving its own slot of the buffers (default 1)', parseUpTo(256))
    .option('-b, --bidirectional', 'both sides send at once', false)
    .option('-I, --inline_size <bytes>', 'max size of a message sent inline (0: none, all this model has)', parseInline, 0);
  if (op !== 'atomic') cmd.option('--report_gbits', 'report bandwidth in Gb/sec (perftest)', false);
  cmd.option('--out_json <file>', 'write the results as JSON (perftest)');
}

const hex = (n: number | bigint, w: number) => `0x${n.toString(16).padStart(w, '0')}`;

/** rc_pingpong's address line (the node id stands for the LID; no GID on this fabric). */
function describe(e: Endpoint): string {
  return `LID ${hex(e.node, 4)}, QPN ${hex(e.qpn, 6)}, PSN ${hex(e.psn, 6)}, RKey ${hex(e.rkey, 8)}, VAddr ${hex(e.addr, 12)}`;
}

const RULE = '-'.repeat(87);
const TITLES: Record<FabricOp, string> = { write: 'RDMA_Write', read: 'RDMA_Read', send: 'Send', atomic: 'Atomic' };

/** perftest's header block: the run's settings, then each QP's address lines. */
function perftestHeader(kind: 'bw' | 'lat', o: FabricOptions, local: Endpoint[], remote: Endpoint[], p: RunParams): void {
  const odp = p.odp ? `ON (${p.policy})` : 'OFF';
  const rows: Array<[string, string]> = [
    ['Number of qps', String(local.length)],
    ['Connection type', p.faultModel === 'stall' ? 'RC (libfabric RMA, stall mode)' : 'RC'],
    ['TX depth', String(p.txDepth ?? 1)],
    ['Mtu', `${p.mtu ?? 1024}[B]`],
    ['Link type', `libfabric ${o.provider}`],
    ['Max inline data', '0[B]'],
    ['On-demand paging', odp],
    ['Bidirectional', p.bidirectional ? 'ON' : 'OFF'],
    [
      'Duration',
      p.infinite ? `until Ctrl-C, a line every ${p.durationS ?? 5} s` : p.durationS !== undefined ? `${p.durationS} s` : `${p.iters} iterations`,
    ],
  ];
  print(RULE);
  print(`                    ${TITLES[p.op]} ${kind === 'bw' ? 'BW' : 'Latency'} Test`);
  for (const [k, v] of rows) print(` ${k.padEnd(16)}: ${v}`);
  print(RULE);
  const line = (e: Endpoint) => `LID ${hex(e.node, 4)} QPN ${hex(e.qpn, 4)} PSN ${hex(e.psn, 6)} RKey ${hex(e.rkey, 6)} VAddr ${hex(e.addr, 14)}`;
  local.forEach((e, k) => {
    print(` local address: ${line(e)}`);
    print(` remote address: ${line(remote[k]!)}`);
  });
  print(RULE);
}

/** --supervise, on the server side, outside the supervised child: this process only watches it (no results of its own). */
async function supervised(name: string, o: FabricOptions): Promise<RunOutcome | undefined> {
  if (!o.supervise || o.args?.[0] !== undefined || workerPort() !== undefined) return undefined;
  process.exitCode = await supervise(name);
  return { results: { supervised: true }, writes: false };
}

async function run(name: string, op: FabricOp, kind: Kind, o: FabricOptions, trace: TraceFile | undefined): Promise<PeerResult> {
  const host = o.args?.[0];
  const worker = workerPort();
  const self = `npx pagefault-rdma ${name}`;
  if (kind !== 'pingpong') checkPerftest(name, op, o);
  if (o.prefetch && !o.odp && !o.iodp) throw new InvalidArgumentError('-P: prefetch is valid only with an on-demand memory region (-o or -O)');
  // --run_infinitely: Ctrl-C stops the run (WRs in flight complete), both sides say done, exit 0.
  const txDepth = kind !== 'pingpong' ? (o.txDepth ?? (kind === 'bw' && !o.stall ? 128 : 1)) : 1;
  const stop = new AbortController();
  const onSigint = () => stop.abort();
  let table: Table | undefined;
  try {
    const r = await runPeer({
      host,
      port: worker?.port ?? o.port,
      bind: o.bind,
      program: name,
      ...(o.token !== undefined ? { token: o.token } : {}),
      progress: o.progress,
      maxSpinUs: o.maxSpinUs,
      limits: { maxSize: o.maxMsg, maxQps: o.maxQps, maxMemory: o.maxMemory },
      provider: o.provider,
      op,
      size: o.size ?? 8,
      iters: o.iters,
      evict: o.evict,
      odp: o.odp || o.evict || !!o.iodp,
      policy: o.policy,
      mtu: o.mtu ?? 1024,
      ...(o.stall ? { faultModel: 'stall' as const } : {}),
      ...(o.all ? { all: true } : {}),
      ...(o.atomic_type ? { atomicType: o.atomic_type } : {}),
      ...(o.duration !== undefined ? { durationS: o.duration } : {}),
      ...(o.run_infinitely ? { infinite: true } : {}),
      ...(kind !== 'pingpong' ? { txDepth, qps: o.qp ?? 1 } : {}),
      ...(o.bidirectional ? { bidirectional: true } : {}),
      ...(o.iodp ? { implicitOdp: true } : {}),
      ...(o.events ? { events: true } : {}),
      ...(o.prefetch ? { prefetch: true } : {}),
      ...(kind === 'pingpong' ? { rxDepth: o.rxDepth ?? DEFAULT_RX_DEPTH } : {}),
      ...(o.run_infinitely ? { signal: stop.signal } : {}),
      ...(trace ? { traceFile: trace } : {}),
      onListening: (port) => {
        tellSupervisor({ listening: port });
        print(
          `waiting for a client on ${o.bind} port ${port} (libfabric ${o.provider}); start the other side with:\n  ${self} ${o.bind === '0.0.0.0' ? hostname() : o.bind} -p ${port} [-s SIZE -n ITERS --evict]`,
        );
      },
      onConnected: (local, remote, p) => {
        tellSupervisor({ serving: true });
        // Only now: opening the libfabric provider installed its own SIGINT handler (exit 1),
        // and a listener added after it puts Node's back.
        if (o.run_infinitely) process.once('SIGINT', onSigint);
        if (kind === 'pingpong') {
          print(`  local address:  ${describe(local[0]!)}`);
          print(`  remote address: ${describe(remote[0]!)}`);
          const odp = p.implicitOdp ? 'implicit ODP' : p.odp ? 'ODP' : 'pinned';
          print(
            `  MTU ${p.mtu ?? 1024}, ${odp}${p.prefetch ? ', prefetched' : ''}, rx depth ${p.rxDepth ?? DEFAULT_RX_DEPTH}${p.events ? ', sleeping on CQ events' : ''}`,
          );
          return;
        }
        perftestHeader(kind, o, local, remote, p);
        if (p.infinite) table = perftestTable(kind, o);
      },
      onPeriod: (period) => {
        if (table && kind !== 'pingpong') printRow(kind, op, table, period, o, undefined, txDepth * (o.qp ?? 1));
      },
    });
    if (r.error) console.error(`${name}: a work request failed: ${r.error}`);
    if (r.peerError) console.error(`${name}: the ${r.role === 'server' ? 'client' : 'server'}'s work request failed: ${r.peerError}`);
    if (r.lost) console.error(`${name}: ${r.lost}`);
    const mismatches = r.mismatches + (r.peer?.mismatches ?? 0);
    if (mismatches) console.error(`${name}: ${mismatches} bytes differ from what the other side wrote`);
    if (r.error || r.peerError || r.lost || mismatches) process.exitCode = 1;
    return r;
  } finally {
    process.removeListener('SIGINT', onSigint);
  }
}

/** Options perftest takes that this program cannot honour are refused before connecting, with the reason. */
function checkPerftest(name: string, op: FabricOp, o: FabricOptions): void {
  const refuse = (why: string) => {
    throw new InvalidArgumentError(`${name}: ${why}`);
  };
  if (o.all && (o.duration !== undefined || o.run_infinitely)) refuse('-a runs -n iterations of each size: not with -D or --run_infinitely');
  if (o.stall && (o.qp ?? 1) + (o.txDepth ?? 1) > 2) refuse('--stall runs one RMA write or read at a time on one connection: -t 1 -q 1');
  if (o.stall && (o.duration !== undefined || o.run_infinitely || o.bidirectional))
    refuse('--stall runs -n writes one way: no -D, --run_infinitely or -b');
  if (op === 'send' && ((o.txDepth ?? 1) > 1 || (o.qp ?? 1) > 1 || o.bidirectional))
    refuse('a ping-pong has one message each way at a time on one QP (both directions already): -t 1 -q 1, no -b');
  // Each atomic's old value is checked in its 8-byte sink, which the next one would overwrite.
  if (op === 'atomic' && ((o.txDepth ?? 1) > 1 || (o.qp ?? 1) > 1 || o.bidirectional))
    refuse("atomics run one at a time on one QP from the client (each one's old value is checked): -t 1 -q 1, no -b");
}

function perftestTable(kind: 'bw' | 'lat', o: FabricOptions): Table {
  const unit = o.report_gbits ? 'Gb/sec' : 'MB/sec';
  const t =
    kind === 'bw'
      ? new Table([
          { header: '#bytes', width: 8 },
          { header: '#iterations', width: 11 },
          { header: `BW peak[${unit}]`, width: 16 },
          { header: `BW average[${unit}]`, width: 19 },
          { header: 'MsgRate[Mpps]', width: 13 },
        ])
      : new Table([{ header: '#bytes', width: 8 }, { header: '#iterations', width: 11 }, ...LATENCY_COLUMNS]);
  t.header();
  return t;
}

/**
 * perftest's bandwidth columns for one size. Peak: one WR alone, its size over its post-to-completion
 * time; with `window` WRs in flight (-t × -q), the best `window` completions in a row.
 */
function bwRow(run: SizeRun, window: number, gbits: boolean): Record<string, number> {
  const n = run.iterations;
  const scale = (bytesPerUs: number) => (gbits ? (bytesPerUs * 8) / 1e3 : bytesPerUs);
  const bwAverage = n && run.seconds ? scale((run.size * n) / (run.seconds * 1e6)) : 0;
  const done = run.doneUs;
  let best = 0;
  if (window <= 1 || done.length <= window) for (const us of run.realUs) best = Math.max(best, run.size / us);
  else for (let i = window; i < done.length; i++) best = Math.max(best, (run.size * window) / (done[i]! - done[i - window]!));
  return {
    bytes: run.size,
    iterations: n,
    bwPeak: scale(Number.isFinite(best) ? best : 0),
    bwAverage,
    msgRateMpps: run.seconds ? n / run.seconds / 1e6 : 0,
  };
}

/** One table row for `run` (-b: the sum of both directions); returns what --json gets. */
function printRow(kind: 'bw' | 'lat', op: FabricOp, t: Table, run: SizeRun, o: FabricOptions, peerRun?: SizeRun, window = 1): Record<string, number> {
  if (kind === 'bw') {
    const row = bwRow(run, window, o.report_gbits ?? false);
    if (peerRun) {
      const theirs = bwRow(peerRun, window, o.report_gbits ?? false);
      for (const k of ['bwPeak', 'bwAverage', 'msgRateMpps']) row[k]! += theirs[k]!;
    }
    t.row([String(run.size), String(run.iterations), row.bwPeak!.toFixed(2), row.bwAverage!.toFixed(2), row.msgRateMpps!.toFixed(6)]);
    return row;
  }
  // Measured per WR: send-lat halves each round trip, as ib_send_lat; the others post to completion.
  const l = latencyStats(op === 'send' ? run.realUs.map((x) => x / 2) : run.realUs);
  t.row([String(run.size), String(run.iterations), ...latencyCells(l)]);
  return { bytes: run.size, iterations: run.iterations, ...l };
}

function odpLine(r: PeerResult): void {
  const st = r.stall ?? r.peer?.stall;
  if (st)
    print(
      `stall mode: ${st.smmuStalls} stalls of the server's provider thread (tid ${st.progressTid}; JS thread ${st.jsTid}) resolved by its fault library ` +
        `(${st.libraryFaults} faults, ${st.pagesTouched} pages touched); faulting threads ${st.faultTids.join(', ') || 'none'}`,
    );
  print(
    `faults: source ${r.faults.source}, destination ${r.faults.destination}; NACKs received ${r.nacks}; retransmitted blocks ${r.retransmitted}; ` +
      `bytes verified ${r.bytesVerified + (r.peer?.bytesVerified ?? 0)}, mismatches ${r.mismatches + (r.peer?.mismatches ?? 0)}`,
  );
  const sides: Array<[string, FaultTime | undefined]> = [
    ['here', r.faultTime],
    [r.role === 'client' ? 'the server' : 'the client', r.peer?.faultTime],
  ];
  const told = sides.filter((x): x is [string, FaultTime] => (x[1]?.faults ?? 0) > 0);
  if (told.length)
    print(
      `fault time (measured, each fault's detect + notify + resolve + retransmit): ` +
        told
          .map(([who, f]) => {
            const p = f.phasesUs;
            return `${who} ${f.faults} faults, ${(f.totalUs / f.faults).toFixed(1)} us each (${p.detect.toFixed(1)} + ${p.notify.toFixed(1)} + ${p.resolve.toFixed(1)} + ${p.retransmit.toFixed(1)})`;
          })
          .join('; '),
    );
  if (r.evictUs > 0 || (r.peer?.evictUs ?? 0) > 0)
    print(
      `evicting the buffers (--evict): ${(r.evictUs / 1000).toFixed(1)} ms here, ${((r.peer?.evictUs ?? 0) / 1000).toFixed(1)} ms on the other side`,
    );
}

/** `rc-pingpong`: ibv_rc_pingpong's exchange and closing lines. */
export const rcPingpong: Program<FabricOptions> = defineProgram<FabricOptions>({
  name: 'rc-pingpong',
  summary: 'RC ping-pong between two processes or hosts over libfabric, like ibv_rc_pingpong (server: no HOST; client: HOST)',
  options: (cmd) => addFabricOptions(cmd, 'pingpong', 'send'),
  async run(o, io) {
    const watching = await supervised('rc-pingpong', o);
    if (watching) return watching;
    const r = await run('rc-pingpong', 'send', 'pingpong', o, io.trace);
    const run0 = r.runs[0];
    if (run0 && run0.seconds > 0 && run0.iterations) {
      const n = run0.iterations;
      const total = 2 * run0.size * n;
      print(`${total} bytes in ${run0.seconds.toFixed(2)} seconds = ${((total * 8) / run0.seconds / 1e6).toFixed(2)} Mbit/sec`);
      print(`${n} iters in ${run0.seconds.toFixed(2)} seconds = ${((run0.seconds * 1e6) / n).toFixed(2)} usec/iter`);
    }
    odpLine(r);
    return { results: r };
  },
});

/** perftest's bandwidth (kind 'bw') or latency (kind 'lat') program for `op`; -a: one row per size. */
export function perftestProgram(name: string, op: FabricOp, kind: 'bw' | 'lat', what: string): Program<FabricOptions> {
  return defineProgram<FabricOptions>({
    name,
    summary: `${what} between two processes or hosts over libfabric, like perftest's ib_${name.replace('-', '_')} (server: no HOST; client: HOST)`,
    options: (cmd) => addFabricOptions(cmd, kind, op),
    async run(o, io) {
      const watching = await supervised(name, o);
      if (watching) return watching;
      const r = await run(name, op, kind, o, io.trace);
      const rows: Array<Record<string, number>> = [];
      // --run_infinitely printed its rows as each period ended.
      if (r.runs.length && !r.params.infinite) {
        const t = perftestTable(kind, o);
        const window = (r.params.txDepth ?? 1) * (r.params.qps ?? 1);
        r.runs.forEach((run, i) => rows.push(printRow(kind, op, t, run, o, r.peerRuns?.[i], window)));
      }
      odpLine(r);
      const results = {
        ...r,
        runs: r.runs.map(({ realUs: _r, doneUs: _d, ...rest }) => rest),
        peerRuns: undefined,
        rows,
        row: rows[rows.length - 1] ?? {},
      };
      if (o.out_json) {
        const { writeFileSync } = await import('node:fs');
        writeFileSync(o.out_json, JSON.stringify(results, (_k, v: unknown) => (typeof v === 'bigint' ? `0x${v.toString(16)}` : v), 2) + '\n');
      }
      return { results };
    },
  });
}
