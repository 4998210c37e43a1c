// The rest of perftest's options (its usage() of ib_write_bw, ib_read_bw, ib_send_lat, …): a
// perftest script that gives one runs, or stops at once with the option named and the reason,
// never at "unknown option". Each program declares the options it honours itself; what is
// left is here, hidden from --help (one line there says so), each accepted where this program
// already does what it asks, refused with the missing feature named otherwise.
import { Option, type Command } from 'commander';
import { wrapped } from './programs/support/format.js';

const GPU = 'accelerator and device memory are not modelled: the buffers are host memory, faulted through userfaultfd';
const RDMA_CM = 'rdma_cm is not offered: the two sides connect over libfabric (HOST, -p), and swap their QPs there';
const ROUTING = "GRH and LID routing fields are not modelled: a node's number is its address on the fabric";
const PLACEMENT = 'CPU and NUMA placement: run the program under taskset or numactl (it does not place itself)';
const RATE = 'rate limiting (packet pacing, bandwidth and message-rate limits) is not modelled';
const CRYPTO = 'mlx5 crypto (AES-XTS) and signature offload are not modelled';
const DC = 'DC (dynamically connected, an mlx5 extension) is not modelled';
const ONE_PORT = 'the device has one port';
const LATENCY = "a latency test's option (write-lat, send-lat, atomic-lat)";
const BANDWIDTH = "a bandwidth test's option (write-bw, read-bw)";

/** [option, takes a value, why it is refused (undefined: accepted, with what it means here)]. */
const REST: ReadonlyArray<readonly [string, boolean, string | undefined, string?]> = [
  // Accepted: already what this program does.
  ['use_old_post_send', false, undefined, 'the WRs are posted with ibv_post_send'],
  ['disable_pcie_relaxed', false, undefined, 'no relaxed ordering is modelled to disable'],
  ['dont_xchg_versions', false, undefined, 'the sides swap no perftest versions (they swap the program and its run)'],
  ['data_validation', false, undefined, 'every message is checked byte for byte at the other side, always'],
  ['data_validation_debug', false, undefined, 'every message is checked byte for byte; a mismatch is counted and printed'],
  // Refused, each with its reason.
  ...(
    [
      'use_cuda',
      'use_cuda_bus_id',
      'cuda_mem_type',
      'gpu_touch',
      'use_rocm',
      'use_neuron',
      'use_hl',
      'use_mlu',
      'use_musa',
      'use_musa_bus_id',
      'use_opencl',
      'opencl_platform_id',
      'use_ib_dm_dmabuf',
      'tph_mem',
      'mmap',
      'mmap-offset',
    ] as const
  ).map(
    (n) =>
      [n, true, n.startsWith('mmap') ? 'buffers mapped from a file or device are not offered: they are memfd pages this program maps' : GPU] as const,
  ),
  ...(
    [
      'use_cuda_dmabuf',
      'use_cuda_pcie_mapping',
      'use_rocm_dmabuf',
      'use_neuron_dmabuf',
      'use_mlu_dmabuf',
      'use_musa_dmabuf',
      'use_musa_pcie_mapping',
      'use_data_direct',
    ] as const
  ).map((n) => [n, false, GPU] as const),
  ['rdma_cm', false, RDMA_CM],
  ['comm_rdma_cm', false, RDMA_CM],
  ['bind_source_ip', true, RDMA_CM],
  ['ipv6', false, 'IPv6 GIDs are not offered: the GIDs are this host interface addresses of the port table (-x)'],
  ['ipv6-addr', false, 'the out-of-band exchange is libfabric on HOST as given'],
  ['dlid', true, ROUTING],
  ['flow_label', true, ROUTING],
  ['hop_limit', true, ROUTING],
  ['tclass', true, ROUTING],
  ['pkey_index', true, "the port's P_Key table holds one key, index 0"],
  ['force-link', true, "the link is libfabric's (tcp, or --provider)"],
  ['congest_type', true, 'congestion control is not modelled'],
  ['dualport', false, ONE_PORT],
  ['report-per-port', false, ONE_PORT],
  ['mcg', false, 'multicast is not modelled'],
  ['connectionless', false, "UD's connectionless server is not offered: send-lat -c UD runs a ping-pong of UD SENDs"],
  ['log_dci_streams', true, DC],
  ['log_active_dci_streams', true, DC],
  ['cpu_id', true, PLACEMENT],
  ['numa_node', true, PLACEMENT],
  ['disable_numa', false, PLACEMENT],
  ['pin_cores', true, PLACEMENT],
  ['rate_limit', true, RATE],
  ['rate_limit_type', true, RATE],
  ['rate_units', true, RATE],
  ['burst_size', true, RATE],
  ['typical_pkt_size', true, RATE],
  ['limit_bw', true, RATE],
  ['limit_msgrate', true, RATE],
  ['aes_xts', false, CRYPTO],
  ['aes_block_size', true, CRYPTO],
  ['encrypt_on_tx', false, CRYPTO],
  ['sig_before', false, CRYPTO],
  ['sig_offload', false, CRYPTO],
  ['data_enc_key_app_path', true, CRYPTO],
  ['data_enc_keys_number', true, CRYPTO],
  ['kek_path', true, CRYPTO],
  ['credentials_path', true, CRYPTO],
  ['cqe_poll', true, 'how completions are waited for is the progress mode here: --progress poll, wait or adaptive'],
  ['disable_dynamic_polling', false, 'how completions are waited for is the progress mode here: --progress poll, wait or adaptive'],
  ['margin', true, "-D's margin is not offered: the warm-up (--warm_up) runs untimed before -D's clock starts"],
  ['mr_per_qp', false, "one MR covers every QP's slots of the buffer here"],
  ['no_enhanced_reorder', false, 'out-of-order data placement is not modelled'],
  ['use_ooo', false, 'out-of-order data placement is not modelled'],
  ['no_lock', false, 'not modelled'],
  ['outs', true, 'outstanding READs are not bounded apart from -t here: -t is the WRs in flight per QP'],
  ['payload_file_path', true, "the payload is the program's own pattern, so that the other side can check every byte"],
  ['ph', true, 'PCIe TLP processing hints are not modelled'],
  ['recv_post_list', true, 'receive lists are not offered: receives are posted one at a time'],
  ['report-counters', true, 'hardware counters are not modelled: the programs print their fault, NACK and retransmission counts'],
  ['retry_count', true, "the QPs' retry_cnt is fixed (7); -u sets their timeout"],
  ['reversed', false, 'the direction is fixed (the client posts); -b runs both directions'],
  ['send_with_imm', false, 'SEND with immediate is not offered by these programs'],
  ['write_with_imm', false, 'RDMA WRITE with immediate is not offered by these programs'],
  ['unsolicited_write', false, 'unsolicited writes are not modelled'],
  ['use-null-mr', false, 'the null MR is not modelled'],
  ['use-srq', false, 'these programs post receives on the QP: an SRQ (lib/verbs has them) is not used'],
  ['vector', true, 'the device has one completion vector'],
  ['wait_destroy', true, 'the sides end as soon as both have reported: no wait before destroying'],
  ['rx-depth', true, 'the receive queue is fixed: send-lat posts 500 receives ahead, the others post none'],
  ['atomic_type', true, "atomic-lat's option"],
];

/** Options of one kind of test: refused on the other kind, with its name. */
const LATENCY_ONLY: ReadonlyArray<readonly [string, boolean]> = [
  ['latency_gap', true],
  ['report-cycles', false],
  ['report-unsorted', false],
  ['report-histogram', false],
  ['report-histogrm', false],
];
const BANDWIDTH_ONLY: ReadonlyArray<readonly [string, boolean]> = [
  ['cq-mod', true],
  ['noPeak', false],
  ['perform_warm_up', false],
  ['post_list', true],
  ['report-both', false],
];

/** perftest's options this program declares none for (each --name as perftest spells it), hidden, accepted or refused by name. */
export function addPerftestRest(cmd: Command, kind: 'bw' | 'lat', atomic = false): void {
  const taken = new Set(cmd.options.flatMap((o) => [o.long, o.short].filter((f): f is string => f !== undefined)));
  const accepted: Option[] = [];
  const other: Array<readonly [string, boolean, string]> =
    kind === 'bw' ? LATENCY_ONLY.map(([n, v]) => [n, v, LATENCY] as const) : BANDWIDTH_ONLY.map(([n, v]) => [n, v, BANDWIDTH] as const);
  // perftest's own spelling of -H's long name (its usage prints --report-histogram).
  if (kind === 'lat' && taken.has('--report-histogram') && !taken.has('--report-histogrm')) {
    const alias = new Option('--report-histogrm', "perftest's spelling of --report-histogram").hideHelp();
    cmd.addOption(alias);
    cmd.hook('preAction', (c) => {
      if (c.opts()[alias.attributeName()] !== undefined) c.setOptionValue('reportHistogram', true);
    });
    taken.add('--report-histogrm');
  }
  // ib_atomic_lat's usage has no -s, -a or --report_gbits: its atomics are 8 bytes.
  const EIGHT = "perftest's atomics are 8 bytes (ib_atomic_lat has no -s, -a or --report_gbits)";
  if (atomic) other.push(['size', true, EIGHT], ['all', false, EIGHT], ['report_gbits', false, EIGHT]);
  const SHORT: Record<string, string> = { size: '-s', all: '-a' };
  for (const [name, value, why, means] of [...REST, ...other]) {
    const flag = `--${name}`;
    if (taken.has(flag)) continue;
    const flags = `${SHORT[name] && atomic && !taken.has(SHORT[name]) ? `${SHORT[name]}, ` : ''}${flag}${value ? ' <value>' : ''}`;
    const opt = new Option(flags, why ? `refused: ${why}` : `accepted: ${means!}`).hideHelp();
    cmd.addOption(opt);
    if (!why) accepted.push(opt);
    else
      cmd.hook('preAction', (c) => {
        if (c.opts()[opt.attributeName()] !== undefined)
          c.error(`error: ${opt.flags.replace(/ <value>$/, '')} is refused: ${why}`, { code: 'ERR_PFR_REFUSED' });
      });
  }
  const names = accepted.map((o) => o.long).join(', ');
  cmd.addHelpText('after', () =>
    wrapped(
      `\nperftest's other options are taken too: ${names} (already so here); the rest (GPU memory, rdma_cm, ` +
        'rate limits, crypto, DC, multicast, …) stop the program at once, the option named with the reason.',
    ),
  );
}
