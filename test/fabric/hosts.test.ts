// Two hosts, as far as the network stack knows: two Linux network namespaces joined by a veth
// pair, each end with its own 10.x address. write-bw's server runs in one (bound to its
// address), the client in the other, so the transport crosses a real network interface
// between two stacks, not loopback; the veth's own counters show the bytes went through it.
// Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN); skipped with the reason where namespaces cannot
// be made. The namespaces and the link are removed after the tests, whatever happened.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { built, ci, MAIN, start, waitFor } from './spawn.js';

const tag = `pfr${process.pid % 100_000}`;
const NS = [`${tag}-a`, `${tag}-b`] as const;
const VETH = [`${tag}a`, `${tag}b`] as const; // interface names: at most 15 characters
const NET = `10.${200 + (process.pid % 50)}.${(process.pid >> 6) % 250}`;
const ADDR = [`${NET}.1`, `${NET}.2`] as const;

function ip(...args: string[]): { ok: boolean; err: string; out: string } {
  const r = spawnSync('ip', args, { encoding: 'utf8', timeout: 10_000 });
  return { ok: r.status === 0, err: (r.stderr || r.error?.message || '').trim(), out: r.stdout };
}

/** Make the two namespaces and the veth pair between them; the reason if they cannot be made. */
function makeHosts(): string | undefined {
  if (process.getuid?.() !== 0) return 'not root: making network namespaces needs CAP_SYS_ADMIN and CAP_NET_ADMIN';
  for (const ns of NS) {
    const r = ip('netns', 'add', ns);
    if (!r.ok) return `ip netns add ${ns} failed: ${r.err}`;
  }
  const steps = [
    ['link', 'add', VETH[0], 'netns', NS[0], 'type', 'veth', 'peer', 'name', VETH[1], 'netns', NS[1]],
    ...[0, 1].flatMap((i) => [
      ['-n', NS[i]!, 'addr', 'add', `${ADDR[i]!}/24`, 'dev', VETH[i]!],
      ['-n', NS[i]!, 'link', 'set', VETH[i]!, 'up'],
      // libfabric's tcp provider works without it; other tools in the namespace expect it.
      ['-n', NS[i]!, 'link', 'set', 'lo', 'up'],
    ]),
  ];
  for (const s of steps) {
    const r = ip(...s);
    if (!r.ok) return `ip ${s.join(' ')} failed: ${r.err}`;
  }
  return undefined;
}

const cannot = built ? makeHosts() : 'the addon was built without libfabric';
const dir = mkdtempSync(join(tmpdir(), 'pfr-hosts-'));

afterAll(() => {
  // Deleting a namespace deletes the veth end in it, and with it its peer.
  for (const ns of NS) ip('netns', 'delete', ns);
  rmSync(dir, { recursive: true, force: true });
});

/** Bytes the veth end in namespace `i` sent and received. */
function vethBytes(i: 0 | 1): { tx: number; rx: number } {
  const [link] = JSON.parse(ip('-n', NS[i], '-s', '-j', 'link', 'show', 'dev', VETH[i]).out) as Array<{
    stats64: { rx: { bytes: number }; tx: { bytes: number } };
  }>;
  return { tx: link!.stats64.tx.bytes, rx: link!.stats64.rx.bytes };
}

describe('two hosts: network namespaces joined by a veth pair', () => {
  it('write-bw between the namespaces over libfabric tcp: faults at both ends, every byte verified, carried by the veth', async (ctx) => {
    // Under CI an addon without libfabric fails here; namespaces that cannot be made skip anywhere.
    if (cannot && !(ci && !built)) ctx.skip(cannot);
    expect(cannot).toBeUndefined();
    // No address of the other namespace is reachable from here: only the veth joins them.
    expect(ip('-n', NS[1], 'addr', 'show').out).not.toContain(ADDR[0]);
    const before = vethBytes(1);
    const size = 64 * 1024;
    const iters = 5;
    const sj = join(dir, 'server.json');
    const cj = join(dir, 'client.json');
    const inNs = (i: 0 | 1) => ({ command: ['ip', 'netns', 'exec', NS[i], process.execPath, MAIN] });
    const server = start(['write-bw', '--bind', ADDR[0], '-p', '0', '--json', sj], inNs(0));
    const port = (await waitFor(server.output, /port (\d+)/))[1]!;
    const client = start(['write-bw', ADDR[0], '-p', port, '-s', String(size), '-n', String(iters), '-t', '1', '--evict', '--json', cj], inNs(1));
    const [s, c] = await Promise.all([server.exit, client.exit]);
    expect([c.code, s.code], c.stderr + s.stderr).toEqual([0, 0]);
    type R = { bytesVerified: number; mismatches: number; error?: string; faults: { source: number; destination: number } };
    const read = (f: string) => (JSON.parse(readFileSync(f, 'utf8')) as { results: R }).results;
    const [server_, client_] = [read(sj), read(cj)];
    expect(client_.error).toBeUndefined();
    expect(client_.faults.source).toBeGreaterThanOrEqual(iters);
    expect(client_.faults.destination).toBeGreaterThanOrEqual(1);
    expect(server_.bytesVerified).toBe(size);
    expect(server_.mismatches).toBe(0);
    // Every write's payload left the client's namespace through its veth end.
    const after = vethBytes(1);
    expect(after.tx - before.tx).toBeGreaterThan(size * iters);
    expect(after.rx - before.rx).toBeGreaterThan(0);
  }, 60_000);
});
