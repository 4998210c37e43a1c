// perftest's and ibv_rc_pingpong's options on the two-process programs (issue 37): each is
// honoured with its meaning or refused by name, the reason said; perftest's JSON report; the
// warm-up; both sides held to the same program and options. The programs run for real.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { built, ci, start, waitFor } from './spawn.js';

const dir = mkdtempSync(join(tmpdir(), 'pfr-i37-perftest-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Side {
  bytesVerified: number;
  mismatches: number;
  error?: string;
  params: { warmUp?: number; size: number; iters: number; postList?: number; cqMod?: number };
  runs: Array<{ iterations: number }>;
}

/** A server (port 0, its own args) and a client against it; both write --json; their exits. */
async function pair(program: string, clientArgs: string[], serverArgs: string[] = []) {
  const tag = `${program}-${Date.now()}-${Math.random().toString(36).slice(2)}`;
  const sj = join(dir, `${tag}-server.json`);
  const cj = join(dir, `${tag}-client.json`);
  const server = start([program, '-p', '0', ...serverArgs, '--json', sj]);
  const port = (await waitFor(server.output, /port (\d+)/))[1]!;
  const client = start([program, '127.0.0.1', '-p', port, ...clientArgs, '--json', cj]);
  const [s, c] = await Promise.all([server.exit, client.exit]);
  const read = (f: string) => {
    try {
      return (JSON.parse(readFileSync(f, 'utf8')) as { results: Side }).results;
    } catch {
      return undefined;
    }
  };
  return { s, c, client: read(cj), server: read(sj), serverOutput: server.output() };
}

describe.skipIf(!built && !ci)("perftest's options on the programs over libfabric", () => {
  it("a perftest script line (-F -d -i -x -c -l -Q -u -S -N -e) runs; --out_json writes perftest's report with units", async () => {
    const out = join(dir, 'report.json');
    const r = await pair(
      'write-bw',
      [
        ...['-F', '-d', 'pfr0', '-i', '1', '-x', '0', '-c', 'RC', '-t', '16', '-l', '4', '-Q', '8', '-u', '16', '-S', '0', '-N', '-e'],
        ...['-s', '4096', '-n', '200', '--warm_up', '40', '--out_json', `--out_json_file=${out}`],
      ],
      ['-x', '0'],
    );
    expect([r.c.code, r.s.code]).toEqual([0, 0]);
    expect(r.c.stderr + r.s.stderr).not.toMatch(/failed|differ/);
    // The server checks the last write: the warm-up's 40 and the measured 200 are one sequence.
    expect(r.server!.mismatches).toBe(0);
    expect(r.server!.bytesVerified).toBe(4096);
    expect(r.client!.runs[0]!.iterations).toBe(200);
    expect(r.client!.params).toMatchObject({ warmUp: 40, postList: 4, cqMod: 8 });
    expect(r.c.stdout).toMatch(/ Device\s+: pfr0\n/);
    expect(r.c.stdout).toMatch(/ CQ Moderation\s+: 8\n/);
    expect(r.c.stdout).toMatch(/ Post List\s+: 4\n/);
    expect(r.c.stdout).toMatch(/ Warm-up\s+: 40 iterations per QP, untimed\n/);
    // -x 0: each side's GID swapped with its QP, printed under its address.
    expect([...r.c.stdout.matchAll(/^ GID: [0-9a-f:.]+$/gm)]).toHaveLength(2);
    const report = JSON.parse(readFileSync(out, 'utf8')) as {
      test_info: Record<string, unknown>;
      results: Record<string, number>;
      units: Record<string, string>;
    };
    expect(report.test_info).toMatchObject({
      test: 'RDMA_Write_Post_List_BW_Test',
      Device: 'pfr0',
      Connection_type: 'RC',
      TX_depth: 16,
      CQ_Moderation: 8,
      Post_List: 4,
      GID_index: 0,
      'Test with events': 'Using_pfr0_comp0',
    });
    expect(report.results.MsgSize).toBe(4096);
    expect(report.results.n_iterations).toBe(200);
    expect(report.results.BW_peak).toBe(0); // -N
    expect(report.results.BW_average).toBeGreaterThan(0);
    expect(report.results.MsgRate).toBeGreaterThan(0);
    expect(report.units).toMatchObject({ BW_average: 'MB/sec', MsgRate: 'Mpps', MsgSize: 'bytes' });
  }, 60_000);

  it('--report_gbits changes the units the report names; --output prints the one figure', async () => {
    const out = join(dir, 'gbits.json');
    const r = await pair('write-bw', ['-s', '4K', '-n', '50', '--report_gbits', '--output', 'bandwidth', '--out_json', '--out_json_file', out]);
    expect([r.c.code, r.s.code]).toEqual([0, 0]);
    const report = JSON.parse(readFileSync(out, 'utf8')) as { results: Record<string, number>; units: Record<string, string> };
    expect(Object.keys(report.results)).toEqual(['bw_avg']);
    expect(report.units.bw_avg).toBe('Gb/sec');
    // The figure alone after the header block: no table, no counters line.
    const tail = r.c.stdout.trimEnd().split('\n').pop()!;
    expect(tail).toMatch(/^\d+\.\d\d$/);
    expect(Number(tail)).toBeCloseTo(report.results.bw_avg!, 2);
  }, 60_000);

  it("send-lat: perftest's 2-byte default, the header on one line, -H prints every iteration, --latency_gap spaces them", async () => {
    const r = await pair('send-lat', ['-n', '50', '--warm_up', '10', '-H', '--latency_gap', '3000']);
    expect([r.c.code, r.s.code]).toEqual([0, 0]);
    expect(r.c.stdout).toMatch(/^ {2}#bytes #iterations {3}t_min {3}t_max t_typical {3}t_avg t_stdev {5}99% {3}99\.9%$/m);
    const row = /^ +2 +50((?: +[\d.]+){7})$/m.exec(r.c.stdout);
    expect(row).not.toBeNull();
    const lines = [...r.c.stdout.matchAll(/^(\d+), ([\d.]+)$/gm)].map((m) => Number(m[2]));
    expect(lines).toHaveLength(50);
    expect([...lines].sort((a, b) => a - b)).toEqual(lines);
    // Sorted, the first is t_min.
    expect(Math.abs(lines[0]! - Number(row![1]!.trim().split(/ +/)[0]))).toBeLessThanOrEqual(0.011);
    // 50 gaps of 3 ms on the client: the run takes at least 150 ms.
    expect(r.client!.runs[0]!.iterations).toBe(50);
    expect((r.client as unknown as { runs: Array<{ seconds: number }> }).runs[0]!.seconds).toBeGreaterThan(0.15);
    expect(r.client!.bytesVerified).toBe(60 * 2);
  }, 60_000);

  it('options it cannot honour are refused by name with the reason, before connecting; the help is not dumped', async () => {
    const cases: Array<[string, string[], RegExp]> = [
      [
        'write-bw',
        ['-c', 'UD'],
        /-c UD is refused: UD has SEND only, as in perftest .*RDMA WRITE needs a connected QP \(RC\); send-lat -c UD runs UD/,
      ],
      ['read-bw', ['-c', 'UD'], /-c UD is refused: UD has SEND only.*RDMA READ needs a connected QP/],
      ['atomic-lat', ['-c', 'UD'], /-c UD is refused: UD has SEND only.*RDMA atomics needs a connected QP/],
      ['send-lat', ['-c', 'XRC'], /-c XRC is refused: XRC: /],
      ['write-bw', ['-c', 'UC'], /-c UC is refused: UC .*not modelled/],
      ['write-bw', ['-d', 'mlx5_0'], /no device mlx5_0: the device here is pfr0/],
      ['write-bw', ['-i', '2'], /has one port, 1/],
      ['write-bw', ['-x', '999'], /expected a GID index in 0\.\.\d+: the port's GID table holds 0 /],
      ['write-bw', ['-S', '3'], /expected a service level in 0\.\.0/],
      ['write-bw', ['-T', '4'], /--tos is refused: .*rdma_cm/],
      ['write-bw', ['--use_hugepages'], /--use_hugepages is refused: .*huge pages are not modelled/],
      ['write-bw', ['-t', '4', '-Q', '8'], /-Q 8: .*at most -t \(4\)/],
      ['write-bw', ['-t', '4', '-l', '8'], /-l 8: .*at most -t \(4\)/],
      ['write-bw', ['--report-both'], /--report-both .*give -b too/],
      ['send-lat', ['-C'], /--report-cycles is refused: .*monotonic clock/],
      ['rc-pingpong', ['-t'], /--ts is refused: completion timestamps/],
      ['rc-pingpong', ['-j'], /--dm is refused: device memory/],
      ['rc-pingpong', ['-l', '2'], /expected a service level in 0\.\.0/],
    ];
    for (const [program, args, re] of cases) {
      const e = await start([program, '127.0.0.1', '-p', '1', ...args]).exit;
      expect(e.code, `${program} ${args.join(' ')}`).toBe(1);
      expect(e.stderr).toMatch(re);
      // The error and a one-line pointer to --help, never the whole help.
      expect(e.stderr).not.toContain('Usage:');
      expect(e.stderr.trim().split('\n').length).toBeLessThanOrEqual(3);
      expect(e.stdout).toBe('');
    }
    const bad = await start(['write-bw', '--bogus']).exit;
    expect(bad.stderr.trim().split('\n')).toEqual(["error: unknown option '--bogus'", '(pagefault-rdma write-bw --help lists its options)']);
  }, 120_000);

  it('send-lat -c UD: a ping-pong of UD SENDs (an address handle, the GRH before each message), evicted at both ends, every byte verified', async () => {
    const r = await pair('send-lat', ['-c', 'UD', '-n', '50', '-s', '1024', '--evict', '--warm_up', '10'], ['-c', 'UD']);
    expect([r.c.code, r.s.code], r.c.stderr + r.s.stderr).toEqual([0, 0]);
    for (const side of [r.client!, r.server!]) {
      expect(side.error).toBeUndefined();
      expect(side.mismatches).toBe(0);
      // Warm-up and measured round trips, each message checked where it landed (after the GRH).
      expect(side.bytesVerified).toBe(60 * 1024);
    }
    expect(r.c.stdout).toMatch(/Connection type : UD/);
    expect(r.c.stdout).toMatch(/^ +1024 +50 /m);
    // The receives were evicted too: destination faults on UD receives, resolved and sent again.
    expect(r.c.stdout).toMatch(/faults: source [1-9]\d*, destination [1-9]\d*/);
  }, 90_000);

  it('send-lat -c UD: -s over the MTU runs at the MTU, as perftest does, saying so; -a stops at the MTU; RC against UD is refused by name', async () => {
    const big = await pair('send-lat', ['-c', 'UD', '-n', '5', '-s', '8K', '-m', '2048']);
    expect([big.c.code, big.s.code], big.c.stderr + big.s.stderr).toEqual([0, 0]);
    expect(big.c.stderr.replace(/\n +/g, ' ')).toContain('-c UD: a UD message is at most the MTU (-m 2048): -s 8192 runs as 2048, as perftest does');
    expect(big.client!.params.size).toBe(2048);
    expect(big.client!.mismatches).toBe(0);
    const all = await pair('send-lat', ['-c', 'UD', '-a', '-n', '3', '--warm_up', '0']);
    expect([all.c.code, all.s.code], all.c.stderr + all.s.stderr).toEqual([0, 0]);
    const sizes = [...all.c.stdout.matchAll(/^ +(\d+) +3 /gm)].map((m) => Number(m[1]));
    expect(sizes).toEqual([2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]); // -m 1024, the default
    const mixed = await pair('send-lat', ['-n', '5'], ['-c', 'UD']);
    expect([mixed.c.code, mixed.s.code]).toEqual([1, 1]);
    expect(mixed.c.stderr.replace(/\n +/g, ' ')).toContain('the client runs -c (not given), this server was started with -c UD');
  }, 120_000);

  // The options perftest's usage() prints for its programs (perftest_parameters.c, 2026-07), as
  // a script gives them: each is taken with its meaning, or refused by name with the reason.
  const PERFTEST_USAGE = [
    'aes_block_size=1',
    'all',
    'atomic_type=1',
    'bidirectional',
    'bind_source_ip=1',
    'burst_size=1',
    'comm_rdma_cm',
    'congest_type=1',
    'connection=1',
    'connectionless',
    'cpu_id=1',
    'cpu_util',
    'cq-mod=1',
    'cqe_poll=1',
    'cuda_mem_type=1',
    'data_validation',
    'data_validation_debug',
    'disable_dynamic_polling',
    'disable_numa',
    'disable_pcie_relaxed',
    'dlid=1',
    'dont_xchg_versions',
    'dualport',
    'duration=1',
    'events',
    'flow_label=1',
    'force-link=1',
    'gid-index=1',
    'gpu_touch=1',
    'hop_limit=1',
    'ib-dev=1',
    'ib-port=1',
    'inline_size=1',
    'ipv6',
    'ipv6-addr',
    'iters=1',
    'latency_gap=1',
    'limit_bw=1',
    'limit_msgrate=1',
    'log_active_dci_streams=1',
    'log_dci_streams=1',
    'margin=1',
    'mcg',
    'mmap=1',
    'mmap-offset=1',
    'mr_per_qp',
    'mtu=1',
    'noPeak',
    'no_enhanced_reorder',
    'no_lock',
    'numa_node=1',
    'odp',
    'opencl_platform_id=1',
    'out_json',
    'out_json_file=1',
    'output=1',
    'outs=1',
    'payload_file_path=1',
    'perform_warm_up',
    'ph=1',
    'pin_cores=1',
    'pkey_index=1',
    'port=1',
    'post_list=1',
    'qp=1',
    'qp-timeout=1',
    'rate_limit=1',
    'rate_limit_type=1',
    'rate_units=1',
    'rdma_cm',
    'recv_post_list=1',
    'report-both',
    'report-counters=1',
    'report-cycles',
    'report-histogram',
    'report-per-port',
    'report-unsorted',
    'report_gbits',
    'retry_count=1',
    'reversed',
    'run_infinitely',
    'rx-depth=1',
    'send_with_imm',
    'size=1',
    'sl=1',
    'tclass=1',
    'tos=1',
    'tph_mem=1',
    'tx-depth=1',
    'typical_pkt_size=1',
    'unsolicited_write',
    'use-null-mr',
    'use-srq',
    'use_cuda=1',
    'use_cuda_bus_id=1',
    'use_cuda_dmabuf',
    'use_cuda_pcie_mapping',
    'use_data_direct',
    'use_hl=1',
    'use_hugepages',
    'use_ib_dm_dmabuf=1',
    'use_mlu=1',
    'use_mlu_dmabuf',
    'use_musa=1',
    'use_musa_bus_id=1',
    'use_musa_dmabuf',
    'use_musa_pcie_mapping',
    'use_neuron=1',
    'use_neuron_dmabuf',
    'use_old_post_send',
    'use_ooo',
    'use_opencl=1',
    'use_rocm=1',
    'use_rocm_dmabuf',
    'vector=1',
    'wait_destroy=1',
    'write_with_imm',
  ];

  it("every option perftest's usage lists is taken or refused by name with its reason, on a bandwidth program and, those of one kind of test, a latency program", async () => {
    // All of them on write-bw; on write-lat, those that differ by the kind of test.
    const byKind = [
      'cq-mod=1',
      'noPeak',
      'perform_warm_up',
      'post_list=1',
      'report-both',
      'latency_gap=1',
      'report-cycles',
      'report-histogram',
      'report-histogrm',
      'report-unsorted',
      'run_infinitely',
    ];
    const jobs = [...PERFTEST_USAGE.map((opt) => ['write-bw', `--${opt}`] as const), ...byKind.map((opt) => ['write-lat', `--${opt}`] as const)];
    const outcomes: string[] = [];
    for (let i = 0; i < jobs.length; i += 6) {
      const batch = jobs.slice(i, i + 6);
      const exits = await Promise.all(batch.map(([program, opt]) => start([program, '127.0.0.1', '-p', '1', opt]).exit));
      exits.forEach((e, k) => {
        const [program, opt] = batch[k]!;
        const err = e.stderr.replace(/\n +/g, ' ');
        if (/unknown option/.test(err)) outcomes.push(`${program} ${opt}: unknown`);
        // Refused with a reason; or taken (it got as far as connecting, or its value was checked, or the run's rules named it).
        else if (!/is refused: \S|cannot connect to 127\.0\.0\.1:1|argument '1' is invalid|pagefault-rdma: write-(bw|lat): /.test(err))
          outcomes.push(`${program} ${opt}: ${err.slice(0, 120)}`);
      });
    }
    expect(outcomes).toEqual([]);
  }, 300_000);

  it("--help: perftest's defaults, each default once and as typed", async () => {
    const sizes: Array<[string, string]> = [
      ['write-bw', '65536'],
      ['read-bw', '65536'],
      ['send-lat', '2'],
      ['write-lat', '2'],
      ['rc-pingpong', '4096'],
    ];
    for (const [program, size] of sizes) {
      const h = await start([program, '--help']).exit;
      const text = h.stdout.replace(/\s+/g, ' ');
      expect(text).toContain(`-s, --size <bytes> message size (4096, 64K, 1M; at most 1G) (default: ${size})`);
      expect(text).not.toMatch(/\(default[^)]*\) \(default/);
      expect(text).not.toMatch(/default: "/);
      expect(text).not.toContain('default: false');
    }
    const rc = (await start(['rc-pingpong', '--help']).exit).stdout.replace(/\s+/g, ' ');
    for (const flag of ['-d, --ib-dev', '-i, --ib-port', '-g, --gid-idx', '-l, --sl', '-c, --chk', '-t, --ts', '-j, --dm', '-N, --new_send'])
      expect(rc).toContain(flag);
  }, 60_000);

  it('rc-pingpong -d -i -g -l -c -e -N: the GID printed on both address lines, SENDs posted with ibv_wr_*, bytes verified', async () => {
    const r = await pair(
      'rc-pingpong',
      ['-d', 'pfr0', '-i', '1', '-g', '0', '-l', '0', '-c', '-N', '-s', '4K', '-n', '30', '--warm_up', '5'],
      ['-N'],
    );
    expect([r.c.code, r.s.code]).toEqual([0, 0]);
    expect(r.c.stdout).toMatch(/^ {2}local address: {2}LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID [0-9a-f:.]+$/m);
    // The server was given no -g: its GID is none (::), as ibv_rc_pingpong prints it.
    expect(r.c.stdout).toMatch(/^ {2}remote address: LID 0x0001, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ::$/m);
    for (const side of [r.client!, r.server!]) {
      expect(side.error).toBeUndefined();
      expect(side.mismatches).toBe(0);
      expect(side.bytesVerified).toBe(35 * 4096);
    }
  }, 60_000);

  it('the handshake holds both sides to one program and the options the server was given: a mismatch ends both, naming it', async () => {
    // rc-pingpong's server, write-bw's client.
    const server = start(['rc-pingpong', '-p', '0']);
    const port = (await waitFor(server.output, /port (\d+)/))[1]!;
    const client = await start(['write-bw', '127.0.0.1', '-p', port]).exit;
    const s = await server.exit;
    expect([client.code, s.code]).toEqual([1, 1]);
    expect(client.stderr).toMatch(/refused the run: the client runs write-bw, this server runs rc-pingpong/);
    expect(s.stderr).toMatch(/the client runs write-bw, this server runs rc-pingpong/);
    expect(client.stdout).not.toMatch(/#bytes|MB\/sec/);
    // The same program, another size than the server was started with.
    const r = await pair('write-bw', ['-s', '8K', '-n', '10'], ['-s', '4K']);
    expect([r.c.code, r.s.code]).toEqual([1, 1]);
    expect(r.c.stderr).toContain('the client runs -s 8192, this server was started with -s 4096: start both sides with the same options');
    expect(r.serverOutput).toContain('the client runs -s 8192, this server was started with -s 4096');
    // Given the same on both sides: served.
    const same = await pair('write-bw', ['-s', '4K', '-n', '10', '--warm_up', '0'], ['-s', '4K', '--warm_up', '0']);
    expect([same.c.code, same.s.code]).toEqual([0, 0]);
  }, 90_000);

  it("the warm-up is untimed and on by default (3 × -n, at most 3000); atomic-lat's hint names no -s", async () => {
    const server = start(['atomic-lat', '-p', '0']);
    const port = (await waitFor(server.output, /port (\d+)/))[1]!;
    expect(server.output()).toMatch(/atomic-lat 127\.0\.0\.1 -p \d+ \[-n ITERS --evict\]/);
    expect(server.output()).not.toMatch(/-s SIZE/);
    const client = await start(['atomic-lat', '127.0.0.1', '-p', port, '-n', '40', '--json', join(dir, 'atomic.json')]).exit;
    const s = await server.exit;
    expect([client.code, s.code]).toEqual([0, 0]);
    const res = (JSON.parse(readFileSync(join(dir, 'atomic.json'), 'utf8')) as { results: Side }).results;
    expect(res.params.warmUp).toBe(120);
    expect(res.runs[0]!.iterations).toBe(40);
    // Every old value checked and the server's word at 160: warm-up and run are one sequence.
    expect(res.mismatches).toBe(0);
    expect(res.bytesVerified).toBe(160 * 8);
    expect(client.stdout).toMatch(/Warm-up\s+: 120 iterations per QP, untimed/);
  }, 60_000);
});
