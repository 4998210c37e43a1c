// A destination fault, step by step: node 0 RDMA-writes into node 1's buffer, which node 1
// evicted with MADV_DONTNEED. Node 1's SMMU finds the page missing (really: mincore says so),
// records F_TRANSLATION, the destination NACKs the block, node 1's SMMU driver takes the IRQ
// and notifies the owner process over netlink, its fault library makes the page resident and
// answers, node 1's NACK goes to node 0 carrying that answer (the model times the NACK at
// detection, as the thesis's; the packet waits for the answer, so one packet carries both),
// node 0 retransmits the block, and the write completes.
//
// Every step prints its modelled time (the calibrated hardware cost model) and its measured
// time (this process, real memory), both counted from the post.
import {
  AckResp,
  EvtClass,
  EvtId,
  IOMMU_FAULT_PAGE_REQUEST_LAST_PAGE,
  IOMMU_FAULT_PAGE_REQUEST_PASID_VALID,
  IOMMU_FAULT_PAGE_RESPONSE_NEEDS_PASID,
  IOMMU_FAULT_PERM_EXEC,
  IOMMU_FAULT_PERM_PRIV,
  IOMMU_FAULT_PERM_READ,
  IOMMU_FAULT_PERM_WRITE,
  IommuPageResponseCode,
  NlAttr,
  NlCmd,
  encodeEvent,
  type DriverFault,
  type TraceEvent,
} from '../../kernel-sim/index.js';
import { Access, mapRegion, PAGE_SIZE, SendFlags, WrOpcode, type ChromeTraceEvent, type PolicyName, type ResolvedFault } from '../../lib/index.js';
import { MEASURED_LABEL, MODEL_LABEL, print, us } from './support/format.js';
import type { TraceFile } from './support/trace-file.js';
import { connectedPair } from './support/pair.js';

export interface DestinationFaultOptions {
  /** Pages written (default 1: the calibrated ≈38 µs case). */
  pages?: number;
  /** Fault library policy of both MRs (default 'touch'). */
  policy?: PolicyName;
  /** Evict the source buffer too, so the source side faults first (default false). */
  evictSource?: boolean;
  /** Where to put the trace of both processes (--trace). */
  trace?: TraceFile;
}

export interface DestinationFaultResult {
  modelUs: number;
  realUs: number;
  faults: { source: number; destination: number };
  /** Faulted blocks sent again (wc.odp.retransmittedBlocks). */
  retransmittedBlocks: number;
  /** Blocks sent again without a fault of their own: the destination returned them unwritten behind another block's NACK. */
  resentBlocks: number;
  dataOk: boolean;
  /** Each phase of each fault (the trace's slices), modelled µs from the post. */
  timeline: TimelineSlice[];
}

/** One phase of one fault on one node's thread, modelled µs. */
export interface TimelineSlice {
  node: number;
  thread: string;
  phase: string;
  startUs: number;
  endUs: number;
  block: number;
}

interface Step {
  modelUs: number;
  /** Undefined: no measured time of its own here (the NACK: measured, it leaves with the answer). */
  realMs: number | undefined;
  order: number;
  text: string[];
}

const hex = (v: bigint | number) => `0x${v.toString(16)}`;
const bit = (b: boolean) => (b ? 1 : 0);

export async function destinationFault(options: DestinationFaultOptions = {}): Promise<DestinationFaultResult> {
  const pages = options.pages ?? 1;
  const policy = options.policy ?? 'touch';
  const size = pages * PAGE_SIZE;
  // Its timeline is drawn from the processes' traces.
  const { cluster, ctx, pd, cq, qp } = connectedPair({ trace: options.trace?.option ?? true });
  const costs = cluster.system.costs;
  try {
    const src = mapRegion(size);
    const dst = mapRegion(size);
    const access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.ON_DEMAND;
    const srcMr = ctx[0].regMr(pd[0], src, 0, size, access, { policy });
    const dstMr = ctx[1].regMr(pd[1], dst, 0, size, access, { policy });
    const write = () => {
      qp[0].postSend({
        wrId: 1,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [{ addr: srcMr.addr, length: size, lkey: srcMr.lkey }],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: dstMr.addr, rkey: dstMr.rkey },
      });
      return cq[0].next();
    };

    // One unobserved (and untraced) warm-up write (JIT, the copy engine's threads), then the one we watch.
    for (const c of ctx) c.faultLibrary.trace.paused = true;
    new Uint8Array(src.buffer).fill(0x11);
    await write();
    for (const c of ctx) c.faultLibrary.trace.paused = false;
    new Uint8Array(src.buffer).fill(0xa5);
    dst.evict();
    if (options.evictSource) src.evict();

    print(
      `node 0 RDMA-writes ${size} B (${pages} page${pages > 1 ? 's' : ''}) into node 1's ODP buffer at ${hex(dstMr.addr)} (rkey ${hex(dstMr.rkey)}), policy '${policy}'.`,
    );
    print(
      `node 1 evicted it with MADV_DONTNEED: ${dst.residentPages()} of ${pages} pages resident (mincore).` +
        (options.evictSource ? ` The source was evicted too: ${src.residentPages()} of ${pages} resident.` : ' The source is resident.'),
    );
    print(`model µs: ${MODEL_LABEL}; real µs: ${MEASURED_LABEL}. Both count from the post.\n`);

    const traces: TraceEvent[] = [];
    const driverFaults: Array<{ node: number; f: DriverFault; realMs: number }> = [];
    const resolutions: ResolvedFault[] = [];
    const nacksBefore = cluster.system.nodes.map((n) => n.pldma.counters().nacksReceived);
    const off = [
      cluster.system.tracer.on((e) => traces.push(e)),
      ...cluster.system.nodes.map((n) => n.driver.onFault((f) => driverFaults.push({ node: n.id, f, realMs: performance.now() }))),
      ...ctx.map((c) => c.faultLibrary.onResolve((f) => resolutions.push(f))),
    ];
    const wc = await write();
    for (const u of off) u();

    const post = traces.find((e) => e.kind === 'post');
    if (!post) throw new Error('destination-fault: the engine traced no post event');
    const base = post.modelUs - costs.doorbellUs;
    const steps: Step[] = [];
    const add = (modelUs: number, realMs: number | undefined, ...text: string[]) => steps.push({ modelUs, realMs, order: steps.length, text });

    add(
      post.modelUs,
      post.realMs,
      `post: RDMA_WRITE ${size} B, local ${hex(srcMr.addr)} lkey ${hex(srcMr.lkey)} -> node 1 ${hex(dstMr.addr)} rkey ${hex(dstMr.rkey)} (doorbell; transfer ${post.tid}, channel ${post.channel})`,
    );
    let detailed = false;
    let attributesShown = false;
    const resolvedByNode = new Map<number, number>();
    // Blocks issued (first attempt), and those issued twice: returned unwritten behind another block's NACK.
    const issued = new Set<unknown>();
    const returned = new Set<unknown>();
    let lastNack: unknown;
    for (const e of traces) {
      const seq = e.detail?.['seq'];
      switch (e.kind) {
        case 'block': {
          if (e.detail?.['attempt'] !== 1) break; // a faulted block's resend: its 'retransmit' step says it
          const again = issued.has(seq);
          issued.add(seq);
          if (again) returned.add(seq);
          add(
            e.modelUs,
            e.realMs,
            again && returned.size === 1
              ? `node ${e.node}'s PLDMA issues block ${seq} again: the destination returned it unwritten (it drops the transfer's ` +
                  `blocks behind block ${String(lastNack)}'s NACK, as RC drops what follows a NAK): re-sent, not a retransmission after a fault`
              : again
                ? `node ${e.node}'s PLDMA issues block ${seq} again (returned unwritten behind block ${String(lastNack)}'s NACK)`
                : `node ${e.node}'s PLDMA issues block ${seq} (${Math.min(PAGE_SIZE, size)} B); its SMMU translates the source (a read)`,
          );
          break;
        }
        case 'fault': {
          const side = e.side!;
          const d = driverFaults.find((x) => x.node === e.node && x.f.record.addr === e.detail?.['va'] && x.f.info?.side === side);
          const where =
            side === 'destination'
              ? `the write arrives; node ${e.node}'s SMMU translates the destination (a write)`
              : `node ${e.node}'s SMMU translates the source (a read)`;
          const lines = [
            `${where}: page ${hex(e.detail?.['va'] as bigint)} not resident -> event record ${d?.f.name ?? 'F_TRANSLATION'} (terminate: the access is aborted)`,
          ];
          if (d && !detailed) {
            detailed = true;
            lines.push(...recordLines(d.f));
          }
          add(e.modelUs, e.realMs, ...lines);
          if (d) {
            // The handler runs in a microtask after the record is written and sends the
            // notification from inside: its measured time is that of the notify event.
            const irqAt = e.modelUs + costs.eventRecordUs + costs.irqUs;
            const notify = traces.find((n) => n.kind === 'notify' && n.node === d.node && n.side === side && n.detail?.['seq'] === seq);
            add(
              irqAt,
              notify?.realMs ?? d.realMs,
              `IRQ on node ${d.node}: the SMMU driver drains the event queue, decodes the record, StreamID ${d.f.record.sid} -> pid ${d.f.pid} (handler ${us(costs.driverUs)} µs)`,
            );
          }
          break;
        }
        case 'nack':
          lastNack = seq;
          // The model times the NACK at detection; measured, the packet leaves with the answer
          // (below), so it has no measured time of its own here: the column never runs backwards.
          add(
            e.modelUs,
            undefined,
            `NACK: node 1 -> node ${e.node}, ACK resp FAULT (${AckResp.FAULT}) for transfer ${e.tid} block ${seq}; node ${e.node} parks the block and serves other channels (the packet itself goes once the answer below is in: measured there, real µs —)`,
          );
          break;
        case 'notify': {
          const d = driverFaults.find((x) => x.node === e.node && x.f.info?.seq === seq && x.f.info?.side === e.side);
          const lines = [
            `netlink: PFR_CMD_FAULT (${NlCmd.FAULT}) unicast to pid ${e.detail?.['pid']} on node ${e.node}` + (d ? `, nlmsg seq ${d.f.seq}` : ''),
          ];
          if (d && !attributesShown) {
            attributesShown = true;
            lines.push(...attributeLines(d.node, d.f));
          }
          add(e.modelUs, e.realMs, ...lines);
          break;
        }
        case 'resolved': {
          const i = resolvedByNode.get(e.node) ?? 0;
          resolvedByNode.set(e.node, i + 1);
          const f = resolutions.filter((x) => x.node === e.node)[i];
          if (f) {
            // Measured: when the library started resolving (its answer is sent from inside).
            add(
              e.modelUs - costs.requestUs,
              e.realMs - f.realUs / 1000,
              `fault library (pid ${ctx[e.node]!.pid}, node ${e.node}): policy '${f.policy}' makes ${f.bytes} B resident from ${hex(f.va)} ` +
                `(MADV_POPULATE_WRITE): ${f.pagesMadeResident} page${f.pagesMadeResident === 1 ? '' : 's'} became resident, measured ${us(f.realUs)} µs;`,
              `answers PFR_CMD_RESOLVED (${NlCmd.RESOLVED}) status ${IommuPageResponseCode[f.status]} (${f.status}), the iommu_page_response code meaning "retry"`,
            );
          }
          add(
            e.modelUs,
            e.realMs,
            e.side === 'destination'
              ? `node ${e.node}'s driver hands the answer to its engine, which lets the held fault NACK (resp FAULT, ${AckResp.FAULT}) for block ${seq} go to node ${e.detail?.['srcNode']}, carrying it`
              : `node ${e.node}'s driver asks its engine to retransmit block ${seq}`,
          );
          break;
        }
        case 'retransmit':
          add(e.modelUs, e.realMs, `retransmission: node ${e.node} re-issues block ${seq} (attempt ${e.detail?.['attempt']})`);
          break;
        case 'complete':
          add(
            e.modelUs,
            e.realMs,
            `completion: every block acknowledged, transfer ${e.tid} ${e.detail?.['status']}; a work completion goes to node 0's CQ`,
          );
          break;
        default:
          break;
      }
    }
    steps.sort((a, b) => a.modelUs - b.modelUs || a.order - b.order);
    print('   model µs    real µs  step');
    steps.forEach((s, i) => {
      const num = `${i + 1}.`.padEnd(4).replace(/\.$/, '. ');
      const real = s.realMs === undefined ? '—' : us((s.realMs - post.realMs) * 1000);
      print(`${us(s.modelUs - base).padStart(11)} ${real.padStart(10)}  ${num}${s.text[0]}`, 28);
      for (const t of s.text.slice(1)) print(`${' '.repeat(28)}${t}`, 30);
    });

    const odp = wc.odp ?? { faults: { source: 0, destination: 0 }, retransmittedBlocks: 0, modelUs: 0, realUs: 0 };
    const nacks = cluster.system.nodes.reduce((a, n, i) => a + n.pldma.counters().nacksReceived - nacksBefore[i]!, 0);
    const dataOk = Buffer.from(dst.buffer).equals(Buffer.from(src.buffer));
    print('\nWhat happened');
    print(
      `  work completion: ${wc.statusStr}, ${wc.byteLen} B; wc.odp: faults source ${odp.faults.source}, destination ${odp.faults.destination}; retransmitted blocks ${odp.retransmittedBlocks}; NACKs ${nacks}`,
    );
    if (returned.size)
      print(
        `  retransmitted blocks counts the blocks that faulted and were sent again; ${returned.size} more block${returned.size === 1 ? ' was' : 's were'} ` +
          `sent twice (${ranges([...returned] as number[])}): the destination returned ${returned.size === 1 ? 'it' : 'them'} unwritten behind a NACK, ` +
          `so ${odp.retransmittedBlocks + returned.size} blocks went on the wire twice`,
      );
    print(`  pages resident now: destination ${dst.residentPages()} of ${pages}, source ${src.residentPages()} of ${pages} (mincore)`);
    print(
      `  modelled end to end: ${us(odp.modelUs)} µs${pages === 1 && !options.evictSource ? ' (the cost model is calibrated to the published ≈38 µs)' : ''}`,
    );
    print(`  measured end to end: ${us(odp.realUs)} µs (JavaScript model of the engine, native copy threads, real page faults)`);
    print(`  node 1's buffer holds node 0's bytes: ${dataOk}`);
    options.trace?.addContexts(ctx);
    const trace = ctx[0].faultLibrary.exportChromeTrace({ with: [ctx[1].faultLibrary] });
    // The export's modelled time starts at its first event; the timeline counts from the post.
    const timeline = timelineOf(trace.traceEvents, base - Number(trace.otherData['modelOriginUs'] ?? 0));
    return {
      modelUs: odp.modelUs,
      realUs: odp.realUs,
      faults: odp.faults,
      retransmittedBlocks: odp.retransmittedBlocks,
      resentBlocks: returned.size,
      dataOk,
      timeline,
    };
  } finally {
    cluster.close();
  }
}

// The SMMUv3 event record, its 32-byte form, and the same fault as Linux IOPF reports it.
function recordLines(f: DriverFault): string[] {
  const r = f.record;
  const raw = [...encodeEvent(r)].map((d) => `0x${d.toString(16).padStart(16, '0')}`).join(' ');
  const pr = f.pageRequest;
  const flags = [
    [IOMMU_FAULT_PAGE_REQUEST_PASID_VALID, 'PASID_VALID'],
    [IOMMU_FAULT_PAGE_REQUEST_LAST_PAGE, 'LAST_PAGE'],
    [IOMMU_FAULT_PAGE_RESPONSE_NEEDS_PASID, 'RESPONSE_NEEDS_PASID'],
  ] as const;
  const perms = [
    [IOMMU_FAULT_PERM_READ, 'READ'],
    [IOMMU_FAULT_PERM_WRITE, 'WRITE'],
    [IOMMU_FAULT_PERM_EXEC, 'EXEC'],
    [IOMMU_FAULT_PERM_PRIV, 'PRIV'],
  ] as const;
  const names = (v: number, table: ReadonlyArray<readonly [number, string]>) =>
    table
      .filter(([b]) => v & b)
      .map(([, n]) => n)
      .join('|') || '0';
  return [
    `  record: ID ${EvtId[r.id]} (${hex(r.id)})  SID ${r.sid}  SSV ${bit(r.ssv)}  SSID ${r.ssid}  STAG ${r.stag}  STALL ${bit(r.stall)}  PnU ${bit(r.pnu)}  InD ${bit(r.ind)}` +
      `  RnW ${bit(r.rnw)} (${r.rnw ? 'read' : 'write'})  S2 ${bit(r.s2)}  CLASS ${EvtClass[r.class]}  ADDR ${hex(r.addr)}`,
    `  raw record (4 x u64): ${raw}`,
    `  as Linux IOPF: iommu_fault_page_request { flags ${names(pr.flags, flags)}, pasid ${pr.pasid}, grpid ${pr.grpid}, perm ${names(pr.perm, perms)}, addr ${hex(pr.addr)}, length ${pr.length} }`,
  ];
}

// The attributes the driver's notification carries (PFR_ATTR_*), from what it handled.
function attributeLines(node: number, f: DriverFault): string[] {
  const i = f.info!;
  const attrs: Array<[NlAttr, string | number | bigint]> = [
    [NlAttr.PID, f.pid ?? -1],
    [NlAttr.VA, hex(f.record.addr)],
    [NlAttr.LENGTH, i.lengthHint],
    [NlAttr.WRITE, bit(!f.record.rnw)],
    [NlAttr.NODE, node],
    [NlAttr.CHANNEL, i.channel],
    [NlAttr.TRANSFER, i.tid],
    [NlAttr.SRC_NODE, i.srcNode],
    [NlAttr.BLOCK, i.seq],
    [NlAttr.SIDE, i.side],
    [NlAttr.SID, f.record.sid],
    [NlAttr.EVENT, EvtId[f.record.id] ?? f.record.id],
    [NlAttr.STALL, bit(f.record.stall)],
    [NlAttr.STAG, f.record.stag],
  ];
  return [`  attributes: ${attrs.map(([k, v]) => `${NlAttr[k]}=${String(v)}`).join(' ')}`];
}

// The modelled phase slices of every fault, from the processes' traces, as a timeline.
function timelineOf(events: ChromeTraceEvent[], baseUs: number): TimelineSlice[] {
  const threads = new Map(events.filter((e) => e.ph === 'M' && e.name === 'thread_name').map((e) => [`${e.pid}:${e.tid}`, String(e.args?.['name'])]));
  return events
    .filter((e) => e.ph === 'X' && e.pid % 2 === 0)
    .map((e) => ({
      node: e.pid / 2,
      // A copy thread's Linux thread id means nothing on the modelled axis.
      thread: (threads.get(`${e.pid}:${e.tid}`) ?? String(e.tid)).replace(/^copy engine thread \d+$/, 'copy engine'),
      phase: e.name,
      startUs: e.ts - baseUs,
      endUs: e.ts + (e.dur ?? 0) - baseUs,
      block: Number(e.args?.['block']),
    }))
    .sort((a, b) => a.startUs - b.startUs);
}

// Block numbers as runs: 1–15, 17.
function ranges(xs: number[]): string {
  const sorted = [...xs].sort((a, b) => a - b);
  const out: string[] = [];
  for (let i = 0; i < sorted.length;) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j]! + 1) j++;
    out.push(j > i ? `${sorted[i]}–${sorted[j]}` : String(sorted[i]));
    i = j + 1;
  }
  return `block${sorted.length === 1 ? '' : 's'} ${out.join(', ')}`;
}
