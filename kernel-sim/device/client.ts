// A short connection to a device, as a provider makes one for ibv_get_device_list: whether a
// device answers in a runtime folder, what it calls itself, what it counted. For the command
// (exec starts a device when none answers; device --stats) and the tests.
import * as abi from './abi.js';
import { Op, Refusal } from './abi.js';
import { encodeRequest } from './messages.js';
import { socketPath } from './runtime-dir.js';
import { SeqpacketConnection } from './seqpacket.js';
import type { DeviceStats } from './device.js';

/** What QUERY_INFO says. */
export interface DeviceInfo {
  name: string;
  nodeGuid: bigint;
  pid: number;
  flags: number;
}

/** One request on a connection of its own, its reply's body; rejects on a refusal, a timeout or no device. */
export function request(dir: string, op: Op, body?: Uint8Array, timeoutMs = 2000): Promise<DataView> {
  return new Promise((resolve, reject) => {
    let conn: SeqpacketConnection;
    try {
      conn = SeqpacketConnection.connect(socketPath(dir));
    } catch (err) {
      reject(err as Error);
      return;
    }
    const timer = setTimeout(() => done(new Error(`the device in ${dir} did not answer within ${timeoutMs} ms`)), timeoutMs);
    const done = (err: Error | undefined, v?: DataView): void => {
      clearTimeout(timer);
      conn.close();
      if (err) reject(err);
      else resolve(v!);
    };
    conn.listen({
      message: (d) => {
        const v = new DataView(d.bytes.buffer, d.bytes.byteOffset, d.bytes.byteLength);
        const status = d.bytes.byteLength >= abi.ctlHdr.size ? v.getInt32(16, true) : -1;
        if (status !== 0) done(Object.assign(new Error(`the device refused ${Op[op]} (status ${status})`), { status }));
        else done(undefined, new DataView(d.bytes.buffer, d.bytes.byteOffset + abi.ctlHdr.size, d.bytes.byteLength - abi.ctlHdr.size));
      },
      close: () => done(new Error(`the device in ${dir} closed the connection`)),
    });
    conn.send(encodeRequest(op, 1, body));
  });
}

/** The device of `dir`, or undefined when none answers there. */
export async function queryInfo(dir: string, timeoutMs = 2000): Promise<DeviceInfo | undefined> {
  let v: DataView;
  try {
    v = await request(dir, Op.QUERY_INFO, undefined, timeoutMs);
  } catch {
    return undefined;
  }
  const name = new TextDecoder().decode(new Uint8Array(v.buffer, v.byteOffset, abi.DEVICE_NAME_MAX)).replace(/\0.*$/s, '');
  const o = abi.deviceInfo.offsets(['node_guid', 'device_pid', 'flags'] as const);
  return { name, nodeGuid: v.getBigUint64(o.node_guid, false), pid: v.getUint32(o.device_pid, true), flags: v.getUint32(o.flags, true) };
}

/** What the device of `dir` counted (QUERY_STATS). */
export async function queryStats(dir: string, timeoutMs = 2000): Promise<DeviceStats> {
  const v = await request(dir, Op.QUERY_STATS, undefined, timeoutMs);
  const at = (f: string): number => Number(v.getBigUint64(abi.deviceStats.offset(f), true));
  const refused = Object.fromEntries(
    Object.entries(Refusal)
      .filter(([, n]) => typeof n === 'number')
      .map(([k, n]) => [k, Number(v.getBigUint64(abi.deviceStats.offset('refused') + 8 * (n as number), true))]),
  ) as DeviceStats['refused'];
  return {
    connections: at('connections'),
    openContexts: at('open_contexts'),
    messages: at('messages'),
    refused,
    faultsRaised: at('faults_raised'),
    faultsResolved: at('faults_resolved'),
    faultsFailed: at('faults_failed'),
    faultAnswersRefused: at('fault_answers_refused'),
    releasedObjects: at('released_objects'),
    dataPath: {
      sendWqes: at('send_wqes'),
      recvWqes: at('recv_wqes'),
      cqes: at('cqes'),
      refusedWqes: at('refused_wqes'),
      corruptRings: at('corrupt_rings'),
      doorbells: at('doorbells'),
    },
  };
}
