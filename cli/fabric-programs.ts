// The two-process programs over libfabric (rc-pingpong like rdma-core's ibv_rc_pingpong;
// write-bw, write-lat, read-bw, send-lat like perftest's): a server without HOST, a client
// with it, one file per command in commands/ built from here. The work is examples/fabric-peer.ts.
import { hostname } from 'node:os';
import { Option, type Command } from 'commander';
import { DEFAULT_BIND, LIBFABRIC_PROVIDERS, latencyStats, POLICIES, type LibfabricProvider, type PolicyName } from '../lib/index.js';
import { runPeer, type AtomicType, type Endpoint, type FabricOp, type PeerResult, type SizeRun } from '../examples/fabric-peer.js';
import { LATENCY_COLUMNS, latencyCells, parsePositiveInt, parseSize, print, Table } from '../examples/support/format.js';
import { defineProgram, type CommonOptions, type Program } from './program.js';

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
  stall?: boolean;
  all?: boolean;
  atomic_type?: AtomicType;
  events?: boolean;
  report_gbits?: boolean;
  out_json?: string;
}

function parsePort(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0 || n > 65535) throw new Error(`-p: expected a port in 0..65535, got ${value}`);
  return n;
}

function addFabricOptions(cmd: Command, iters: number, perftest: boolean, op?: FabricOp): void {
  cmd
    .argument('[host]', 'the server to connect to (without it: run the server)')
    .option('-p, --port <port>', `listen on / connect to port (0: any free port, printed)`, parsePort, DEFAULT_PORT)
    .option('--bind <addr>', 'server: the address to listen on (0.0.0.0: every interface)', DEFAULT_BIND)
    .option('-s, --size <bytes>', 'message size (4096, 64K, 1M)', parseSize, 4096)
    .option('-n, --iters <n>', 'iterations', parsePositiveInt, iters)
    .option('--odp', 'register the buffers with ODP (Access.ON_DEMAND)', false)
    .addOption(
      new Option('--policy <name>', 'fault library policy of the buffers').choices(POLICIES.filter((p) => p !== 'pin')).default('touch-ahead'),
    )
    .option('--evict', 'evict the buffers before every message: genuine faults at both ends', false)
    .addOption(new Option('--provider <name>', 'libfabric provider').choices([...LIBFABRIC_PROVIDERS]).default('tcp'));
  if (op === 'write')
    cmd.option(
      '--stall',
      "stall mode (faultModel 'stall'): libfabric RMA writes straight into the server's userfaultfd-registered buffer; its provider thread blocks in the faults",
      false,
    );
  if (op === 'atomic')
    cmd.addOption(
      new Option('-A, --atomic_type <type>', 'the atomic operation (perftest -A)')
        .choices(['FETCH_AND_ADD', 'CMP_AND_SWAP'])
        .default('FETCH_AND_ADD'),
    );
  else if (perftest) cmd.option('-a, --all', 'run every size from 2 to 2^23 bytes, -n iterations each (perftest -a)', false);
  if (perftest)
    cmd.option('--report_gbits', 'report bandwidth in Gb/sec (perftest)', false).option('--out_json <file>', 'write the results as JSON (perftest)');
  else cmd.option('-e, --events', 'sleep on CQ events (always the case here: completions come from the CQ wait fd)', false);
}

function describe(e: Endpoint): string {
  const hex = (n: number | bigint, w: number) => `0x${n.toString(16).padStart(w, '0')}`;
  return `node ${e.node}, QPN ${hex(e.qpn, 6)}, addr ${hex(e.addr, 12)}, rkey ${hex(e.rkey, 8)}`;
}

async function run(name: string, op: FabricOp, o: FabricOptions): Promise<PeerResult> {
  const host = o.args?.[0];
  const self = `npx pagefault-rdma ${name}`;
  const r = await runPeer({
    host,
    port: o.port,
    bind: o.bind,
    provider: o.provider,
    op,
    size: o.size,
    iters: o.iters,
    evict: o.evict,
    odp: o.odp || o.evict,
    policy: o.policy,
    ...(o.stall ? { faultModel: 'stall' as const } : {}),
    ...(o.all ? { all: true } : {}),
    ...(o.atomic_type ? { atomicType: o.atomic_type } : {}),
    onListening: (port) =>
      print(
        `waiting for a client on ${o.bind} port ${port} (libfabric ${o.provider}); start the other side with:\n  ${self} ${o.bind === '0.0.0.0' ? hostname() : o.bind} -p ${port} [-s SIZE -n ITERS --evict]`,
      ),
    onConnected: (local, remote) => {
      print(`  local address:  ${describe(local)}`);
      print(`  remote address: ${describe(remote)}`);
    },
  });
  if (r.error) {
    console.error(`${name}: a work request failed: ${r.error}`);
    process.exitCode = 1;
  }
  if (r.mismatches) {
    console.error(`${name}: ${r.mismatches} bytes differ from what the other side wrote`);
    process.exitCode = 1;
  }
  return r;
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
}

/** `rc-pingpong`: ibv_rc_pingpong's exchange and closing lines. */
export const rcPingpong: Program<FabricOptions> = defineProgram<FabricOptions>({
  name: 'rc-pingpong',
  summary: 'RC ping-pong between two processes or hosts over libfabric, like ibv_rc_pingpong (server: no HOST; client: HOST)',
  options: (cmd) => addFabricOptions(cmd, 1000, false),
  async run(o) {
    const r = await run('rc-pingpong', 'send', o);
    const run0 = r.runs[0];
    if (run0 && run0.seconds > 0 && run0.realUs.length) {
      const n = run0.realUs.length;
      const total = 2 * run0.size * n;
      print(`${total} bytes in ${run0.seconds.toFixed(2)} seconds = ${((total * 8) / run0.seconds / 1e6).toFixed(2)} Mbit/sec`);
      print(`${n} iters in ${run0.seconds.toFixed(2)} seconds = ${((run0.seconds * 1e6) / n).toFixed(2)} usec/iter`);
    }
    odpLine(r);
    return { results: r };
  },
});

/** perftest's bandwidth columns for one size. */
function bwRow(run: SizeRun, gbits: boolean): Record<string, number> {
  const n = run.realUs.length;
  const scale = (bytesPerUs: number) => (gbits ? (bytesPerUs * 8) / 1e3 : bytesPerUs);
  const bwAverage = n && run.seconds ? scale((run.size * n) / (run.seconds * 1e6)) : 0;
  const bwPeak = n ? scale(run.size / Math.min(...run.realUs)) : 0;
  return { bytes: run.size, iterations: n, bwPeak, bwAverage, msgRateMpps: run.seconds ? n / run.seconds / 1e6 : 0 };
}

/** perftest's bandwidth (kind 'bw') or latency (kind 'lat') program for `op`; -a: one row per size. */
export function perftestProgram(name: string, op: FabricOp, kind: 'bw' | 'lat', what: string): Program<FabricOptions> {
  return defineProgram<FabricOptions>({
    name,
    summary: `${what} between two processes or hosts over libfabric, like perftest's ib_${name.replace('-', '_')} (server: no HOST; client: HOST)`,
    options: (cmd) => addFabricOptions(cmd, kind === 'bw' ? 5000 : 1000, true, op),
    async run(o) {
      const r = await run(name, op, o);
      const rows: Array<Record<string, number>> = [];
      if (r.runs.length) {
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
        for (const run of r.runs) {
          const n = run.realUs.length;
          if (kind === 'bw') {
            const row = bwRow(run, o.report_gbits ?? false);
            t.row([String(run.size), String(n), row.bwPeak!.toFixed(2), row.bwAverage!.toFixed(2), row.msgRateMpps!.toFixed(6)]);
            rows.push(row);
          } else {
            // send-lat: round trip / 2, as ib_send_lat; write-lat: post to completion of each write.
            const l = latencyStats(op === 'send' ? run.realUs.map((x) => x / 2) : run.realUs);
            t.row([String(run.size), String(n), ...latencyCells(l)]);
            rows.push({ bytes: run.size, iterations: n, ...l });
          }
        }
      }
      odpLine(r);
      const results = { ...r, runs: undefined, rows, row: rows[rows.length - 1] ?? {} };
      if (o.out_json) {
        const { writeFileSync } = await import('node:fs');
        writeFileSync(o.out_json, JSON.stringify(results, (_k, v: unknown) => (typeof v === 'bigint' ? `0x${v.toString(16)}` : v), 2) + '\n');
      }
      return { results };
    },
  });
}
