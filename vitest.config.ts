import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // A native crash must fail one file, not the whole run.
    pool: 'forks',
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
