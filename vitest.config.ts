import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // A native crash must fail one file, not the whole run.
    pool: 'forks',
    // Two files at a time. Vitest's default is one fewer than the cores: 1 on this 2-core
    // machine, where the files then ran one by one and left a core idle while a test waited
    // on a child process, a timeout or a compile (897 s at 601 s of CPU; 486 s with two).
    maxWorkers: 2,
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
