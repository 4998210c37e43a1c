// The main JS thread and remote paging: it reads back its own bytes (dm-handler.test.ts);
// and when a page cannot be had (the server is gone), its access fails visibly: the process
// ends by SIGBUS within the store's timeout, instead of reading zeros or hanging. With
// 'wp-async' and more pages than one eviction batch (32), a later batch's dirty scan leaves
// uffd-wp markers on the pages already evicted, and UFFDIO_POISON refuses a marked page: the
// page must end poisoned all the same, not fault again forever.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { beforeAll, expect, it } from 'vitest';
import { requireDist, ROOT } from '../child.js';
import { startRedis } from '../../cli/programs/support/redis-server.js';

beforeAll(requireDist);

it.each([
  { pages: 4, tracking: 'auto' },
  { pages: 64, tracking: 'wp-async' },
])(
  'the main thread reading a page its dead server held dies by SIGBUS, promptly, with an error event first ($pages pages, $tracking)',
  async ({ pages, tracking }) => {
    const redis = await startRedis();
    try {
      const child = spawn(process.execPath, [join(ROOT, 'test/fixtures/remote-main-fails.mjs'), redis.socket, String(pages), tracking], {
        stdio: ['pipe', 'pipe', 'pipe'],
      });
      let out = '',
        err = '';
      child.stdout.on('data', (d: Buffer) => (out += d));
      child.stderr.on('data', (d: Buffer) => (err += d));
      const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
        child.on('close', (code, signal) => r({ code, signal })),
      );
      const end = Date.now() + 15_000;
      while (!out.includes('evicted') && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
      expect(out).toContain('evicted');
      await redis.stop();
      const t0 = Date.now();
      child.stdin.write('go\n');
      const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
      const { signal } = await exited;
      clearTimeout(timer);
      expect(signal).toBe('SIGBUS');
      expect(Date.now() - t0).toBeLessThan(10_000);
      expect(out).not.toContain('read ');
      // No event can reach a thread that dies on waking: the DM-Handler says why on stderr first.
      expect(err).toMatch(/main thread's page at 0x[0-9a-f]+ could not be had .*Redis server.*SIGBUS/);
    } finally {
      await redis.dispose();
    }
  },
);
