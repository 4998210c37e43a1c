// The walk (issue 38): which source files a work request passes through, in order, from
// qp.postSend to its work completion, as a newcomer stepping through it in a debugger would.
//
// A worker thread attaches the inspector to the main thread (Session.connectToMainThread). At a
// `debugger` statement just before the post it steps the main thread statement by statement
// (Debugger.stepInto; node's modules blackboxed), and a breakpoint at the start of every project
// function the untraced run of the same path ran (Profiler precise coverage) picks the walk up
// when a later task resumes it (the responder, a fault resolved, the ACK), until a `debugger`
// statement just after the CQE is taken: project statements (lib/, kernel-sim/, native/) run in
// between, in the order they ran. Each pause's script is mapped to its source file
// (dist/lib/verbs/qp.js -> lib/verbs/qp.ts) and consecutive pauses in one file are one stop.
//
// For each path it reports: the stops (the files in the order visited), the distinct files, the
// back-and-forths (a stop whose next-but-one is the same file: A→B→A) and the crossings between
// lib/ and kernel-sim/. Each path runs once untraced first, so lazy set-up is not in the walk.
import { Worker } from 'node:worker_threads';
import { Access, Cluster, SendFlags, WrOpcode, connectQps, mapRegion, type CompletionQueue, type QueuePair } from '../lib/index.js';

export const WALK_PATHS = ['write', 'send', 'fault'] as const;
export type WalkPath = (typeof WALK_PATHS)[number];

export const WALK_LABELS: Record<WalkPath, string> = {
  write: 'resident RDMA WRITE',
  send: 'SEND',
  fault: 'WRITE into an evicted page',
};

export interface WalkResult {
  path: WalkPath;
  label: string;
  /** The files in the order visited (consecutive pauses in one file are one stop). */
  stops: string[];
  /** Distinct files, in the order first entered. */
  files: string[];
  /** Stops whose next-but-one is the same file (A→B→A). */
  backAndForth: number;
  /** Consecutive stops of which one is in lib/ and the other in kernel-sim/. */
  crossings: number;
  /** Debugger pauses (statements stepped) in project files. */
  pauses: number;
  /** The work completion's status string. */
  status: string;
}

/** The counts of a sequence of stops (exported for the test of the counting itself). */
export function walkCounts(stops: readonly string[]): { files: string[]; backAndForth: number; crossings: number } {
  const layer = (f: string): string => f.split('/')[0]!;
  let backAndForth = 0;
  let crossings = 0;
  for (let i = 0; i + 2 < stops.length; i++) if (stops[i] === stops[i + 2]) backAndForth++;
  for (let i = 0; i + 1 < stops.length; i++) {
    const pair = [layer(stops[i]!), layer(stops[i + 1]!)].sort().join();
    if (pair === 'kernel-sim,lib') crossings++;
  }
  return { files: [...new Set(stops)], backAndForth, crossings };
}

// The tracer, in a worker: CommonJS (an eval worker), so it needs no file of its own.
const TRACER = String.raw`
const { Session } = require('node:inspector');
const { parentPort } = require('node:worker_threads');
const s = new Session();
s.connectToMainThread();
const project = /\/(?:dist\/)?(lib|kernel-sim|native)\/(.*)\.(?:js|ts)$/;
const urls = new Map();
s.on('Debugger.scriptParsed', (m) => urls.set(m.params.scriptId, m.params.url));
let recording = false;
let pauses = [];
const set = new Set();
const ids = [];
const source = (url) => {
  const m = project.exec(url);
  return m ? m[1] + '/' + m[2] + '.ts' : null;
};
const post = (method, params) => new Promise((res, rej) => s.post(method, params, (e, r) => (e ? rej(e) : res(r))));
// Stepping (Debugger.stepInto) follows the synchronous code; a task run later (the responder,
// a fault resolved, an ACK) starts in a function the untraced run of the same path ran, so a
// breakpoint at the start of each of those picks the walk up again wherever it resumes.
async function arm() {
  const { result } = await post('Profiler.takePreciseCoverage');
  for (const script of result) {
    if (!project.test(script.url)) continue;
    let text;
    for (const fn of script.functions) {
      const r = fn.ranges[0];
      if (r.startOffset === 0 || r.count === 0) continue;
      const key = script.scriptId + ':' + r.startOffset;
      if (set.has(key)) continue;
      set.add(key);
      text ??= (await post('Debugger.getScriptSource', { scriptId: script.scriptId })).scriptSource;
      const before = text.slice(0, r.startOffset);
      const lineNumber = before.split('\n').length - 1;
      const columnNumber = r.startOffset - (before.lastIndexOf('\n') + 1);
      const bp = await post('Debugger.setBreakpoint', { location: { scriptId: script.scriptId, lineNumber, columnNumber } }).catch(() => null);
      if (bp) ids.push(bp.breakpointId);
    }
  }
}
// (Debugger.setBreakpointsActive(false) would skip the debugger statements too: remove them.)
function disarm() {
  for (const breakpointId of ids.splice(0)) s.post('Debugger.removeBreakpoint', { breakpointId });
  set.clear();
}
s.on('Debugger.paused', (m) => {
  const frame = m.params.callFrames[0];
  const name = frame.functionName;
  if (name === 'walkBegin') {
    pauses = [];
    arm().then(
      () => {
        recording = true;
        s.post('Debugger.stepInto');
      },
      (e) => parentPort.postMessage({ error: String(e) }),
    );
    return;
  }
  if (name === 'walkEnd') {
    recording = false;
    s.post('Debugger.resume');
    disarm();
    parentPort.postMessage({ pauses });
    return;
  }
  if (!recording) return void s.post('Debugger.resume');
  const file = source(urls.get(frame.location.scriptId) || frame.url || '');
  if (file) pauses.push(file);
  s.post('Debugger.stepInto');
});
s.post('Debugger.enable', () =>
  s.post('Debugger.setBlackboxPatterns', { patterns: ['^node:', '/node_modules/'] }, () =>
    s.post('Profiler.enable', () => s.post('Profiler.startPreciseCoverage', { callCount: true, detailed: false }, () => parentPort.postMessage('ready'))),
  ),
);
parentPort.on('message', (m) => { if (m === 'stop') { s.disconnect(); process.exit(0); } });
`;

// The markers the tracer stops on: their names are how it recognises them.
function walkBegin(): void {
  // eslint-disable-next-line no-debugger
  debugger;
}
function walkEnd(): void {
  // eslint-disable-next-line no-debugger
  debugger;
}

interface Rig {
  cluster: Cluster;
  qpA: QueuePair;
  cqA: CompletionQueue;
  post(path: WalkPath, traced: boolean): void;
}

function rig(): Rig {
  const cluster = Cluster.create({ nodes: 2 });
  const [a, b] = [cluster.openDevice(0), cluster.openDevice(1)];
  const [pdA, pdB] = [a.allocPd(), b.allocPd()];
  const [cqA, cqB] = [a.createCq(64), b.createCq(64)];
  const qpA = a.createQp(pdA, { sendCq: cqA, recvCq: cqA });
  const qpB = b.createQp(pdB, { sendCq: cqB, recvCq: cqB });
  connectQps(qpA, qpB);
  const src = mapRegion(4096);
  const dst = mapRegion(4096);
  const rcv = mapRegion(4096);
  new Uint8Array(src.buffer).fill(7);
  const odp = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.ON_DEMAND;
  const mrA = a.regMr(pdA, src, 0, src.size, odp);
  const mrB = b.regMr(pdB, dst, 0, dst.size, odp);
  const mrR = b.regMr(pdB, rcv, 0, rcv.size, Access.LOCAL_WRITE | Access.ON_DEMAND);
  let wrId = 0n;
  const post = (path: WalkPath, traced: boolean): void => {
    if (path === 'fault') dst.evict();
    if (path === 'send') {
      qpB.postRecv({ wrId: ++wrId, sgList: [{ addr: mrR.addr, length: rcv.size, lkey: mrR.lkey }] });
      void cqB.next();
    }
    const sgList = [{ addr: mrA.addr, length: path === 'send' ? 8 : src.size, lkey: mrA.lkey }];
    const wr =
      path === 'send'
        ? { wrId: ++wrId, opcode: WrOpcode.SEND, sendFlags: SendFlags.SIGNALED, sgList }
        : { wrId: ++wrId, opcode: WrOpcode.RDMA_WRITE, sendFlags: SendFlags.SIGNALED, sgList, rdma: { remoteAddr: mrB.addr, rkey: mrB.rkey } };
    if (traced) walkBegin();
    qpA.postSend(wr);
  };
  return { cluster, qpA, cqA, post };
}

/** Walk each path in `paths` (each once untraced, then once stepped) and count its stops. */
export async function walk(paths: readonly WalkPath[] = WALK_PATHS, timeoutMs = 120_000): Promise<WalkResult[]> {
  const r = rig();
  const tracer = new Worker(TRACER, { eval: true });
  try {
    const ready = new Promise<void>((resolve, reject) => {
      tracer.once('message', () => resolve());
      tracer.once('error', reject);
    });
    await within(ready, timeoutMs, 'the inspector tracer did not attach');
    const results: WalkResult[] = [];
    for (const path of paths) {
      // Untraced: the same post with everything it loads and allocates the first time done.
      r.post(path, false);
      await within(r.cqA.next(), timeoutMs, `the untraced ${path} did not complete`);
      const traced = new Promise<string[]>((resolve) => tracer.once('message', (m: { pauses: string[] }) => resolve(m.pauses)));
      r.post(path, true);
      const wc = await within(r.cqA.next(), timeoutMs, `the walked ${path} did not complete`);
      walkEnd();
      const pauses = await within(traced, timeoutMs, 'the tracer sent no walk');
      const stops = pauses.filter((f, i) => i === 0 || pauses[i - 1] !== f);
      results.push({ path, label: WALK_LABELS[path], stops, ...walkCounts(stops), pauses: pauses.length, status: wc.statusStr });
    }
    return results;
  } finally {
    tracer.postMessage('stop');
    await tracer.terminate();
    r.cluster.close();
  }
}

async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(Object.assign(new Error(`${what} within ${ms} ms`), { code: 'ETIMEDOUT' })), ms);
  });
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
