// The two-process programs over libfabric (rc-pingpong like rdma-core's ibv_rc_pingpong;
// write-bw, write-lat, read-bw, send-lat, atomic-lat like perftest's): a server without HOST,
// a client with it, one file per command in commands/ built from here. The work is
// cli/programs/fabric-peer.ts. The client decides the run's parameters; the server adopts them.
import { writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { InvalidArgumentError, Option, type Command } from 'commander';
import { addPerftestRest } from './perftest-rest.js';
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
  QP_TIMEOUT,
  runPeer,
  type AtomicType,
  type Endpoint,
  type FaultTime,
  type FabricOp,
  type PeerResult,
  type RunParams,
  type SizeRun,
} from './programs/fabric-peer.js';
import { columns, latencyCells, parsePositiveInt, parseSize, print, printErr, Table, wrapped } from './programs/support/format.js';
import type { TraceFile } from './programs/support/trace-file.js';
import { hostGids } from '../kernel-sim/device/attributes.js';
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
  gidIdx?: number;
  report_gbits?: boolean;
  out_json?: boolean;
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
  ibDev: string;
  ibPort: number;
  gidIndex?: number;
  warm_up?: number;
  CPUFreq?: boolean;
  connection?: string;
  post_list?: number;
  cqMod?: number;
  qpTimeout?: number;
  sl?: number;
  tos?: number;
  noPeak?: boolean;
  reportUnsorted?: boolean;
  reportHistogram?: boolean;
  reportCycles?: boolean;
  latency_gap?: number;
  reportBoth?: boolean;
  output?: 'bandwidth' | 'latency' | 'message_rate';
  cpu_util?: boolean;
  use_hugepages?: boolean;
  out_json_file: string;
  perform_warm_up?: boolean;
  ts?: boolean;
  chk?: boolean;
  dm?: boolean;
  new_send?: boolean;
}

/** The device these programs open: each process hosts one node, its modelled fault-aware device (the name the device process gives it too). */
export const DEVICE_NAME = 'pfr0';

/**
 * The default warm-up: untimed iterations before the measured ones (perftest's bandwidth tests
 * warm up; so do this project's benchmarks), 3 × -n, at most MAX_DEFAULT_WARM_UP. Measured here
 * (rc-pingpong, defaults): 1265 µs/iter cold, 227 after 2000 warm-up round trips, 113 after 5000.
 */
export const MAX_DEFAULT_WARM_UP = 3000;

export function defaultWarmUp(iters: number): number {
  return Math.min(3 * iters, MAX_DEFAULT_WARM_UP);
}

/** perftest's report file when --out_json is given without --out_json_file. */
export const DEFAULT_JSON_FILE = 'perftest_out.json';

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

function parseIntIn(min: number, max: number, what: string): (value: string) => number {
  return (value) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min || n > max) throw new InvalidArgumentError(`expected ${what} in ${min}..${max}`);
    return n;
  };
}

function parseDevice(value: string): string {
  if (value !== DEVICE_NAME)
    throw new InvalidArgumentError(`no device ${value}: the device here is ${DEVICE_NAME} (this node's modelled fault-aware RDMA device)`);
  return value;
}

function parsePortNum(value: string): number {
  if (value !== '1') throw new InvalidArgumentError(`the device ${DEVICE_NAME} has one port, 1`);
  return 1;
}

/** The host's GID table (RoCEv2 GIDs of its interfaces' addresses, as rxe builds it): -x / -g pick from it. */
export function gidTable(): string[] {
  return hostGids().map((g) => g.text);
}

function parseGidIndex(value: string): number {
  const n = Number(value);
  const table = gidTable();
  if (!Number.isInteger(n) || n < 0 || n >= table.length)
    throw new InvalidArgumentError(
      `expected a GID index in 0..${table.length - 1}: the port's GID table holds ${table.map((g, i) => `${i} ${g}`).join(', ') || 'nothing'}`,
    );
  return n;
}

/** -c: RC is what these programs run, and UD the SEND programs; every other transport is refused, the reason named. */
const CONNECTIONS: Record<string, string | undefined> = {
  RC: undefined,
  UC: 'UC (unreliable connected) QPs are not modelled: the engine has RC, UD and XRC QPs',
  UD: undefined, // SEND only: parseConnection(op) says why for the others
  XRC: 'XRC: the engine has XRC QPs (lib/verbs, in one process), but these two-process programs connect RC QPs only',
  DC: 'DC (dynamically connected, an mlx5 extension) is not modelled',
  SRD: 'SRD (EFA scalable reliable datagram) is not modelled',
  RawEth: 'raw Ethernet QPs are not modelled',
};

function parseConnection(op: FabricOp): (value: string) => string {
  return (value) => {
    const c = value.toUpperCase() === 'RAWETH' ? 'RawEth' : value.toUpperCase();
    if (!(c in CONNECTIONS)) throw new InvalidArgumentError(`expected a connection type: ${Object.keys(CONNECTIONS).join(', ')}`);
    // perftest: "UD connection only possible in SEND verb".
    const why =
      c === 'UD' && op !== 'send'
        ? `UD has SEND only, as in perftest ("UD connection only possible in SEND verb"): RDMA ${op === 'atomic' ? 'atomics' : op === 'read' ? 'READ' : 'WRITE'} needs a connected QP (RC); send-lat -c UD runs UD`
        : CONNECTIONS[c];
    if (why) throw new InvalidArgumentError(`-c ${c} is refused: ${why}`);
    return c;
  };
}

/** An option perftest or ibv_rc_pingpong has and this program cannot honour: listed, and refused by name with `why` when given. */
function refuseOption(cmd: Command, flags: string, description: string, why: string): void {
  const opt = new Option(flags, `refused: ${description}`);
  cmd.addOption(opt);
  cmd.hook('preAction', (c) => {
    if (c.opts()[opt.attributeName()] !== undefined) c.error(`error: ${opt.long ?? opt.short} is refused: ${why}`, { code: 'ERR_PFR_REFUSED' });
  });
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
    .addHelpText('after', () =>
      wrapped(
        `\nThe server serves one client. It rejects every other connection request once that client is connected, and ` +
          `until then lets at most ${DEFAULT_TRANSPORT_LIMITS.maxWaiting} connections wait for their hello (limits.maxWaiting), each for ` +
          `${DEFAULT_TRANSPORT_LIMITS.helloTimeoutMs} ms (limits.helloTimeoutMs), TCP connections that send nothing too. A peer may send frames of ` +
          `${DEFAULT_TRANSPORT_LIMITS.maxFrameBytes >> 20} MiB at most in chunks (limits.maxFrameBytes), make it hold ${DEFAULT_TRANSPORT_LIMITS.maxHeldBytes >> 20} MiB ` +
          `(limits.maxHeldBytes) and leave ${DEFAULT_TRANSPORT_LIMITS.maxUnsentBytes >> 20} MiB unread (limits.maxUnsentBytes); past a limit its connection is cut, the limit named. ` +
          `A client asking for more than --max-msg, --max-qps or --max-memory is refused, and so is one running another program.`,
      ),
    );
  // perftest's defaults: 65536 bytes for the bandwidth programs, 2 for the latency ones; ibv_rc_pingpong's 4096.
  const size = kind === 'bw' ? 65536 : kind === 'lat' ? 2 : 4096;
  if (op !== 'atomic') cmd.option('-s, --size <bytes>', 'message size (4096, 64K, 1M; at most 1G)', parseMessageSize, size);
  cmd
    .option('-n, --iters <n>', 'iterations (per QP), after the warm-up', parsePositiveInt, kind === 'bw' ? 5000 : 1000)
    .option(
      '--warm_up <n>',
      `untimed iterations (per QP) before the measured ones, so that the figures are the steady state, not the JIT compiling (default 3 × -n, at most ${MAX_DEFAULT_WARM_UP}; 0: none)`,
      parseIntIn(0, 1 << 24, 'a count'),
    )
    .option('-d, --ib-dev <dev>', `the RDMA device (each process hosts one node: ${DEVICE_NAME})`, parseDevice, DEVICE_NAME)
    .option('-i, --ib-port <port>', 'the port of the device (it has one: 1)', parsePortNum, 1)
    .option(kind === 'pingpong' ? '-o, --odp' : '--odp', 'register the buffers with ODP (Access.ON_DEMAND)', false)
    .option('-m, --mtu <bytes>', `path MTU set on the QPs (${MTUS.join(', ')}; the engine moves 4096-byte blocks whatever it is)`, parseMtu, 1024)
    .addOption(
      new Option('--policy <name>', 'fault library policy of the buffers').choices(POLICIES.filter((p) => p !== 'pin')).default('touch-ahead'),
    )
    .option('--evict', 'evict the buffers before every message: genuine faults at both ends', false)
    .addOption(new Option('--provider <name>', 'libfabric provider').choices([...LIBFABRIC_PROVIDERS]).default('tcp'))
    .option('-e, --events', 'sleep on CQ events: a completion channel, ibv_req_notify_cq and ibv_get_cq_event', false)
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
      .option('-g, --gid-idx <index>', "the port's GID to send with the QP (index in its table of this host's interface addresses)", parseGidIndex)
      .option('-l, --sl <sl>', 'service level (0: the engine models one virtual lane)', parseIntIn(0, 0, 'a service level'))
      .option('-O, --iodp', 'use implicit on-demand paging: one MR of address 0, length SIZE_MAX', false)
      .option('-P, --prefetch', 'prefetch the ODP MR once registered (ibv_advise_mr PREFETCH, FLUSH)', false)
      .option('-r, --rx-depth <n>', `receives to post at a time (default ${DEFAULT_RX_DEPTH})`, parseUpTo(1 << 16), DEFAULT_RX_DEPTH)
      .option('-c, --chk', 'validate the received buffer (always done here: every message is checked byte for byte)', false)
      .option('-N, --new_send', "post with the new send API (ibv_qp_ex's ibv_wr_start, ibv_wr_send, ibv_wr_complete)", false);
    refuseOption(
      cmd,
      '-t, --ts',
      'get CQEs with timestamps',
      'completion timestamps (ibv_create_cq_ex with IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) are not modelled',
    );
    refuseOption(
      cmd,
      '-j, --dm',
      'use device memory',
      'device memory (ibv_alloc_dm) is not modelled: the buffers are host memory, which is what faults',
    );
    return;
  }
  cmd
    .option('-x, --gid-index <index>', "the port's GID to send with each QP (index in its table of this host's interface addresses)", parseGidIndex)
    .option(
      '-F, --CPU-freq',
      'accepted: no CPU frequency warning is printed here (times come from the monotonic clock, not the cycle counter)',
      false,
    )
    .option(
      '-c, --connection <type>',
      op === 'send'
        ? 'connection type: RC or UD (UD SENDs of at most the MTU, -m; UC, XRC, DC, SRD are refused, each saying why)'
        : 'connection type: RC (UD, UC, XRC, DC, SRD are refused, each saying why)',
      parseConnection(op),
      'RC',
    )
    .option(
      '-u, --qp-timeout <timeout>',
      `QP local ACK timeout, 4.096 µs × 2^timeout (default ${QP_TIMEOUT} here: 14 is lost to scheduling pauses between processes)`,
      parseIntIn(1, 31, 'a timeout'),
    )
    .option('-S, --sl <sl>', 'service level (0: the engine models one virtual lane)', parseIntIn(0, 0, 'a service level'))
    .option('--cpu_util', "show this process's CPU use (user + system, % of one CPU) in the report; with -D, as perftest", false)
    .addOption(
      new Option('--output <units>', 'print only this figure: bandwidth or message_rate (bw programs), latency (lat programs: t_avg)').choices(
        kind === 'bw' ? ['bandwidth', 'message_rate'] : ['latency'],
      ),
    );
  refuseOption(
    cmd,
    '-T, --tos <tos>',
    'type of service',
    'a type of service is set on rdma_cm QPs (perftest -R); these programs connect over their own libfabric exchange',
  );
  refuseOption(
    cmd,
    '--use_hugepages',
    'huge pages for the buffers',
    'the buffers are 4 KiB pages faulted one at a time through userfaultfd; huge pages are not modelled',
  );
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
    .option('--run_infinitely', 'run until Ctrl-C, a line every -D seconds (default 5); Ctrl-C: exit 0, as perftest (with -b: 130)', false)
    .option('-t, --tx-depth <n>', `work requests in flight per QP (default ${kind === 'bw' ? 128 : 1})`, parseUpTo(8192))
    .option('-q, --qp <n>', 'QPs, each moving its own slot of the buffers (default 1)', parseUpTo(256))
    .option('-b, --bidirectional', 'both sides send at once', false)
    .option('-I, --inline_size <bytes>', 'max size of a message sent inline (0: none, all this model has)', parseInline, 0);
  if (kind === 'bw') {
    cmd
      .option('-l, --post_list <n>', 'post WRs in lists of this many (one ibv_post_send each; at most -t)', parseUpTo(8192))
      .option(
        '-Q, --cq-mod <n>',
        'a completion every N WRs of a QP, the others unsignaled (at most -t; default 1 here, perftest 100)',
        parseUpTo(8192),
      )
      .option('-N, --noPeak', 'do not compute the peak bandwidth (printed as 0)', false)
      .option('--report-both', 'with -b: report each direction on its own row (TX: this side, RX: the other)', false)
      .option('--perform_warm_up', 'accepted: a warm-up always runs (--warm_up sets its length)', false);
  } else {
    cmd
      .option('-H, --report-histogram', "print every iteration's latency, sorted (after the summary)", false)
      .option('-U, --report-unsorted', "print every iteration's latency in the order measured (implies -H)", false)
      .option('--latency_gap <usec>', 'wait this many µs before posting each message', parseIntIn(0, 10_000_000, 'a gap in µs'));
    refuseOption(
      cmd,
      '-C, --report-cycles',
      'times in CPU cycles',
      'times are measured with the monotonic clock (performance.now), not the CPU cycle counter: µs only',
    );
  }
  if (op !== 'atomic') cmd.option('--report_gbits', 'report bandwidth in Gb/sec (perftest)', false);
  cmd
    .option('--out_json', `write perftest's JSON report (test_info, results, units) to --out_json_file`, false)
    .option('--out_json_file <file>', "with --out_json: the report's file", DEFAULT_JSON_FILE);
  addPerftestRest(cmd, kind, op === 'atomic');
}

const hex = (n: number | bigint, w: number) => `0x${n.toString(16).padStart(w, '0')}`;

/** rc_pingpong's address line (the node id stands for the LID; the GID as ibv_rc_pingpong prints it, :: for none). */
function describe(e: Endpoint): string {
  return `LID ${hex(e.node, 4)}, QPN ${hex(e.qpn, 6)}, PSN ${hex(e.psn, 6)}, GID ${e.gid ?? '::'}`;
}

/** An rc_pingpong address line; one that does not fit (a long IPv6 GID) has its GID on the next line, aligned. */
function addressLine(label: string, e: Endpoint): void {
  const text = `${label}${describe(e)}`;
  if (text.length <= columns()) return print(text);
  const cut = text.lastIndexOf(', GID ');
  print(text.slice(0, cut + 1));
  print(`${' '.repeat(label.length)}${text.slice(cut + 2)}`);
}

/**
 * The run parameters a server's own command line set: perftest and rc_pingpong are started
 * with the same options on both sides, so a client asking for another value of one is refused,
 * the option named (the server otherwise adopts the client's run).
 */
function expected(o: FabricOptions, kind: Kind): NonNullable<Parameters<typeof runPeer>[0]['expect']> {
  const given = new Set(o.given ?? []);
  const out: NonNullable<Parameters<typeof runPeer>[0]['expect']> = [];
  const add = (attr: keyof FabricOptions, key: keyof RunParams, flag: string, value: RunParams[keyof RunParams]) => {
    if (given.has(attr)) out.push({ key, value, flag });
  };
  add('size', 'size', '-s', o.size);
  add('iters', 'iters', '-n', o.iters);
  add('warm_up', 'warmUp', '--warm_up', o.warm_up);
  add('evict', 'evict', '--evict', o.evict);
  add('policy', 'policy', '--policy', o.policy);
  add('mtu', 'mtu', '-m', o.mtu);
  add('events', 'events', '-e', o.events ?? false);
  add('all', 'all', '-a', o.all ?? false);
  add('atomic_type', 'atomicType', '-A', o.atomic_type);
  add('duration', 'durationS', '-D', o.duration);
  add('run_infinitely', 'infinite', '--run_infinitely', o.run_infinitely ?? false);
  add('txDepth', 'txDepth', '-t', o.txDepth);
  add('qp', 'qps', '-q', o.qp);
  add('bidirectional', 'bidirectional', '-b', o.bidirectional ?? false);
  add('post_list', 'postList', '-l', o.post_list);
  add('cqMod', 'cqMod', '-Q', o.cqMod);
  add('stall', 'faultModel', '--stall', o.stall ? 'stall' : undefined);
  add('connection', 'connection', '-c', o.connection === 'UD' ? 'UD' : undefined);
  if (kind === 'pingpong') {
    add('odp', 'odp', '-o', o.odp);
    add('iodp', 'implicitOdp', '-O', o.iodp ?? false);
    add('prefetch', 'prefetch', '-P', o.prefetch ?? false);
    add('rxDepth', 'rxDepth', '-r', o.rxDepth);
  } else add('odp', 'odp', '--odp', o.odp);
  return out;
}

const RULE = '-'.repeat(79);
const TITLES: Record<FabricOp, string> = { write: 'RDMA_Write', read: 'RDMA_Read', send: 'Send', atomic: 'Atomic' };

/** perftest's header block: the run's settings, then each QP's address lines. */
function perftestHeader(kind: 'bw' | 'lat', o: FabricOptions, local: Endpoint[], remote: Endpoint[], p: RunParams): void {
  const odp = p.odp ? `ON (${p.policy})` : 'OFF';
  const rows: Array<[string, string]> = [
    ['Device', o.ibDev],
    ['Number of qps', String(local.length)],
    ['Connection type', p.faultModel === 'stall' ? 'RC (libfabric RMA, stall mode)' : (p.connection ?? 'RC')],
    ['TX depth', String(p.txDepth ?? 1)],
    ...(kind === 'bw' ? ([['CQ Moderation', String(p.cqMod ?? 1)]] as Array<[string, string]>) : []),
    ...((p.postList ?? 1) > 1 ? ([['Post List', String(p.postList)]] as Array<[string, string]>) : []),
    ['Mtu', `${p.mtu ?? 1024}[B]`],
    ['Link type', `libfabric ${o.provider}`],
    ...(local[0]?.gid !== undefined ? ([['GID index', String(o.gidIndex)]] as Array<[string, string]>) : []),
    ['Max inline data', '0[B]'],
    ['On-demand paging', odp],
    ['Bidirectional', p.bidirectional ? 'ON' : 'OFF'],
    ['Warm-up', `${p.warmUp ?? 0} iterations per QP, untimed`],
    [
      'Duration',
      p.infinite ? `until Ctrl-C, a line every ${p.durationS ?? 5} s` : p.durationS !== undefined ? `${p.durationS} s` : `${p.iters} iterations`,
    ],
  ];
  print(RULE);
  print(`                    ${TITLES[p.op]} ${kind === 'bw' ? 'BW' : 'Latency'} Test`);
  for (const [k, v] of rows) print(` ${k.padEnd(16)}: ${v}`);
  print(RULE);
  const line = (e: Endpoint) => `LID ${hex(e.node, 4)} QPN ${hex(e.qpn, 4)} PSN ${hex(e.psn, 6)} RKey ${hex(e.rkey, 6)} VAddr ${hex(e.addr, 12)}`;
  // perftest's line is 86 columns: one that does not fit goes on with RKey on the next line, aligned.
  const address = (label: string, e: Endpoint) => {
    const text = `${label}${line(e)}`;
    const cut = text.indexOf(' RKey ');
    if (text.length <= columns() || cut < 0) return print(text);
    print(text.slice(0, cut));
    print(`${' '.repeat(label.length)}${text.slice(cut + 1)}`);
  };
  local.forEach((e, k) => {
    address(' local address: ', e);
    if (e.gid !== undefined) print(` GID: ${e.gid}`);
    address(' remote address: ', remote[k]!);
    if (remote[k]!.gid !== undefined) print(` GID: ${remote[k]!.gid}`);
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
  const gidIndex = kind === 'pingpong' ? o.gidIdx : o.gidIndex;
  if (o.prefetch && !o.odp && !o.iodp) throw new InvalidArgumentError('-P: prefetch is valid only with an on-demand memory region (-o or -O)');
  // --run_infinitely: Ctrl-C stops the run (WRs in flight complete) and both sides say done.
  // As perftest's: the client says " User stopped traffic" and exits 0, the server " Client
  // closed connection"; with -b perftest catches no SIGINT (its duplex run dies of it: 130), and
  // neither does this program's exit status, though both sides still end cleanly.
  const txDepth = kind !== 'pingpong' ? (o.txDepth ?? (kind === 'bw' && !o.stall ? 128 : 1)) : 1;
  const stop = new AbortController();
  const onSigint = () => {
    // The terminal echoed ^C where the cursor was: clear that line, so what follows starts clean.
    if (process.stdout.isTTY === true) process.stdout.write('\r\x1b[K');
    if (o.bidirectional) process.exitCode = 130;
    else print(' User stopped traffic');
    stop.abort();
  };
  let table: Table | undefined;
  // -c UD: a datagram is one packet, at most the path MTU; perftest runs a larger -s at the MTU.
  const ud = o.connection === 'UD';
  let size = o.size ?? 8;
  if (ud && host !== undefined && !o.all && size > (o.mtu ?? 1024)) {
    printErr(`${name}: -c UD: a UD message is at most the MTU (-m ${o.mtu ?? 1024}): -s ${size} runs as ${o.mtu ?? 1024}, as perftest does`);
    size = o.mtu ?? 1024;
  }
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
      size,
      ...(ud ? { connection: 'UD' as const } : {}),
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
      warmUp: o.warm_up ?? defaultWarmUp(o.iters),
      ...(o.post_list !== undefined ? { postList: o.post_list } : {}),
      ...(o.cqMod !== undefined ? { cqMod: o.cqMod } : {}),
      ...(gidIndex !== undefined ? { gid: gidTable()[gidIndex]! } : {}),
      ...(o.qpTimeout !== undefined ? { qpTimeout: o.qpTimeout } : {}),
      ...(o.latency_gap !== undefined ? { latencyGapUs: o.latency_gap } : {}),
      ...(o.new_send ? { newSend: true } : {}),
      ...(host === undefined ? { expect: expected(o, kind) } : {}),
      onListening: (port) => {
        tellSupervisor({ listening: port });
        // The hint names only options this program takes (atomic-lat has no -s).
        const hint = op === 'atomic' ? '[-n ITERS --evict]' : '[-s SIZE -n ITERS --evict]';
        print(
          `waiting for a client on ${o.bind} port ${port} (libfabric ${o.provider});\nstart the other side with:\n  ${self} ${o.bind === '0.0.0.0' ? hostname() : o.bind} -p ${port} ${hint}`,
        );
      },
      onConnected: (local, remote, p) => {
        tellSupervisor({ serving: true });
        // Only now: opening the libfabric provider installed its own SIGINT handler (exit 1),
        // and a listener added after it puts Node's back.
        if (o.run_infinitely) process.once('SIGINT', onSigint);
        if (kind === 'pingpong') {
          addressLine('  local address:  ', local[0]!);
          addressLine('  remote address: ', remote[0]!);
          const odp = p.implicitOdp ? 'implicit ODP' : p.odp ? 'ODP' : 'pinned';
          print(
            `  MTU ${p.mtu ?? 1024}, ${odp}${p.prefetch ? ', prefetched' : ''}, rx depth ${p.rxDepth ?? DEFAULT_RX_DEPTH}${p.events ? ', sleeping on CQ events' : ''}`,
          );
          return;
        }
        perftestHeader(kind, o, local, remote, p);
        // The periods are reported where WRs are posted: the client's, and with -b the server's too.
        if (p.infinite && (host !== undefined || p.bidirectional)) table = perftestTable(kind, o);
      },
      onPeriod: (period) => {
        if (table && kind !== 'pingpong') printRow(kind, op, table, period, o, undefined, txDepth * (o.qp ?? 1));
      },
    });
    if (r.error) printErr(`${name}: a work request failed: ${r.error}`);
    if (r.peerError) printErr(`${name}: the ${r.role === 'server' ? 'client' : 'server'}'s work request failed: ${r.peerError}`);
    if (r.lost) printErr(`${name}: ${r.lost}`);
    const mismatches = r.mismatches + (r.peer?.mismatches ?? 0);
    if (mismatches) printErr(`${name}: ${mismatches} bytes differ from what the other side wrote`);
    if (r.error || r.peerError || r.lost || mismatches) process.exitCode = 1;
    else if (r.params.infinite && r.stopped && host === undefined && !r.params.bidirectional) print(' Client closed connection');
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
  const depth = o.txDepth ?? (op === 'send' || op === 'atomic' || o.stall ? 1 : 128);
  if ((o.post_list ?? 1) > depth) refuse(`-l ${o.post_list}: a list is posted into the send queue at once, so it is at most -t (${depth})`);
  if ((o.cqMod ?? 1) > depth) refuse(`-Q ${o.cqMod}: a completion every ${o.cqMod} WRs needs that many in flight: at most -t (${depth})`);
  if (o.stall && ((o.post_list ?? 1) > 1 || (o.cqMod ?? 1) > 1)) refuse('--stall runs one RMA write or read at a time: no -l or -Q');
  if (o.reportBoth && !o.bidirectional) refuse('--report-both reports each direction of a bidirectional run: give -b too');
  if (o.cpu_util && o.all) refuse('--cpu_util reports one run: not with -a');
  if (op === 'atomic' && ((o.txDepth ?? 1) > 1 || (o.qp ?? 1) > 1 || o.bidirectional))
    refuse("atomics run one at a time on one QP from the client (each one's old value is checked): -t 1 -q 1, no -b");
}

/** perftest's latency columns, µs, each header one word so that the header is one line and a row fits 80 columns. */
const PERFTEST_LAT_COLUMNS = ['t_min', 't_max', 't_typical', 't_avg', 't_stdev', '99%', '99.9%'].map((header) => ({ header, width: 7 }));

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
      : new Table([{ header: '#bytes', width: 7 }, { header: '#iterations', width: 11 }, ...PERFTEST_LAT_COLUMNS], { gap: 1 });
  if (o.output) return t; // --output: the figure alone, no table
  if (kind === 'lat') print(' (every time in usec)');
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
    if (o.noPeak) row.bwPeak = 0;
    if (o.output === 'bandwidth') print(row.bwAverage!.toFixed(2));
    else if (o.output === 'message_rate') print(row.msgRateMpps!.toFixed(6));
    else t.row([String(run.size), String(run.iterations), row.bwPeak!.toFixed(2), row.bwAverage!.toFixed(2), row.msgRateMpps!.toFixed(6)]);
    return row;
  }
  // Measured per WR: send-lat halves each round trip, as ib_send_lat; the others post to completion.
  const l = latencyStats(op === 'send' ? run.realUs.map((x) => x / 2) : run.realUs);
  if (o.output === 'latency') print(l.avg.toFixed(2));
  else t.row([String(run.size), String(run.iterations), ...latencyCells(l)]);
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
      const cpu0 = process.cpuUsage();
      const wall0 = performance.now();
      const r = await run(name, op, kind, o, io.trace);
      const rows: Array<Record<string, number>> = [];
      // --run_infinitely printed its rows as each period ended.
      if (r.runs.length && !r.params.infinite) {
        const t = perftestTable(kind, o);
        const window = (r.params.txDepth ?? 1) * (r.params.qps ?? 1);
        if (o.reportBoth && r.peerRuns) {
          // Each direction on its own row: this side's WRs (TX), then the other side's (RX here).
          r.runs.forEach((run) => rows.push(printRow(kind, op, t, run, o, undefined, window)));
          r.peerRuns.forEach((run) => rows.push(printRow(kind, op, t, run, o, undefined, window)));
        } else r.runs.forEach((run, i) => rows.push(printRow(kind, op, t, run, o, r.peerRuns?.[i], window)));
        if (kind === 'lat' && (o.reportHistogram || o.reportUnsorted)) histogram(op, r.runs, o.reportUnsorted === true);
      }
      const cpu = process.cpuUsage(cpu0);
      const cpuUtil = ((cpu.user + cpu.system) / 1000 / (performance.now() - wall0)) * 100;
      if (o.cpu_util) print(` CPU util: ${cpuUtil.toFixed(2)} % of one CPU (this process, user + system)`);
      if (!o.output) odpLine(r);
      const results = {
        ...r,
        runs: r.runs.map(({ realUs: _r, doneUs: _d, ...rest }) => rest),
        peerRuns: undefined,
        rows,
        row: rows[rows.length - 1] ?? {},
      };
      if (o.out_json && rows.length > 0) {
        writeFileSync(
          o.out_json_file,
          JSON.stringify(perftestJson(name, op, kind, o, r.params, rows, o.cpu_util ? cpuUtil : undefined), null, 2) + '\n',
        );
        printErr(`perftest report: ${o.out_json_file}`);
      }
      return { results };
    },
  });
}

/** -H / -U: every iteration's latency (µs; send-lat: half the round trip), sorted or in the order measured. */
function histogram(op: FabricOp, runs: SizeRun[], unsorted: boolean): void {
  for (const run of runs) {
    const us = op === 'send' ? run.realUs.map((x) => x / 2) : [...run.realUs];
    if (!unsorted) us.sort((a, b) => a - b);
    print(`#, usec (${run.size} bytes, ${unsorted ? 'unsorted' : 'sorted'})`);
    us.forEach((x, i) => print(`${i + 1}, ${x.toFixed(3)}`));
  }
}

/**
 * perftest's --out_json report: test_info (the run's settings, perftest's names), results (the
 * last size's figures under perftest's names: MsgSize, n_iterations, BW_peak, BW_average,
 * MsgRate or t_min … percentile_99.9) and, which perftest leaves to its documentation, the
 * units of each figure.
 */
function perftestJson(
  name: string,
  op: FabricOp,
  kind: 'bw' | 'lat',
  o: FabricOptions,
  p: RunParams,
  rows: Array<Record<string, number>>,
  cpuUtil?: number,
) {
  const test = `${TITLES[op]}_${op === 'atomic' ? `${p.atomicType ?? 'FETCH_AND_ADD'}_` : ''}${kind === 'bw' ? `${p.bidirectional ? 'Bidirectional_' : ''}${(p.postList ?? 1) > 1 ? 'Post_List_' : ''}BW_` : 'Latency_'}Test`;
  const testInfo = {
    test,
    ...(p.events ? { 'Test with events': `Using_${o.ibDev}_comp0` } : {}),
    Dual_port: 'OFF',
    Device: o.ibDev,
    Number_of_qps: p.qps ?? 1,
    Transport_type: 'IB',
    Connection_type: p.connection ?? 'RC',
    Using_SRQ: 'OFF',
    TX_depth: p.txDepth ?? 1,
    ...((p.postList ?? 1) > 1 ? { Post_List: p.postList } : {}),
    ...(kind === 'bw' ? { CQ_Moderation: p.cqMod ?? 1 } : {}),
    Mtu: p.mtu ?? 1024,
    Link_type: `libfabric ${o.provider}`,
    ...(o.gidIndex !== undefined ? { GID_index: o.gidIndex } : {}),
    ...(op === 'read' || op === 'atomic' ? { Outstand_reads: p.txDepth ?? 1 } : { Max_inline_data: 0 }),
    rdma_cm_QPs: 'OFF',
    Data_ex_method: 'Ethernet',
    program: `pagefault-rdma ${name}`,
    Warm_up: p.warmUp ?? 0,
    On_demand_paging: p.odp ? 'ON' : 'OFF',
  };
  const bwUnit = o.report_gbits ? 'Gb/sec' : 'MB/sec';
  const figures = (row: Record<string, number>) =>
    kind === 'bw'
      ? o.output === 'bandwidth'
        ? { bw_avg: row.bwAverage! }
        : o.output === 'message_rate'
          ? { msgRate_avg: row.msgRateMpps! }
          : { MsgSize: row.bytes!, n_iterations: row.iterations!, BW_peak: row.bwPeak!, BW_average: row.bwAverage!, MsgRate: row.msgRateMpps! }
      : o.output === 'latency'
        ? { avg_lat: row.avg! }
        : {
            MsgSize: row.bytes!,
            n_iterations: row.iterations!,
            t_min: row.min!,
            t_max: row.max!,
            t_typical: row.typical!,
            t_avg: row.avg!,
            t_stdev: row.stdev!,
            percentile_99: row.p99!,
            'percentile_99.9': row.p999!,
          };
  const last = rows[rows.length - 1];
  const units =
    kind === 'bw'
      ? { MsgSize: 'bytes', BW_peak: bwUnit, BW_average: bwUnit, bw_avg: bwUnit, MsgRate: 'Mpps', msgRate_avg: 'Mpps', CPU_util: '%' }
      : {
          MsgSize: 'bytes',
          t_min: 'usec',
          t_max: 'usec',
          t_typical: 'usec',
          t_avg: 'usec',
          t_stdev: 'usec',
          percentile_99: 'usec',
          'percentile_99.9': 'usec',
          avg_lat: 'usec',
          CPU_util: '%',
        };
  return {
    test_info: testInfo,
    results: { ...(last ? figures(last) : {}), ...(cpuUtil !== undefined ? { CPU_util: Number(cpuUtil.toFixed(2)) } : {}) },
    ...(rows.length > 1 ? { results_by_size: rows.map(figures) } : {}),
    units,
  };
}
