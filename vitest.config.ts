import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // A native crash must fail one file, not the whole run.
    pool: 'forks',
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Every in-process packet checked against the wire layout (kernel-sim/fabric/fabric.ts).
    env: { PAGEFAULT_RDMA_CHECK_PACKETS: '1' },
  },
});
