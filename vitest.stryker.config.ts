import { configDefaults, defineConfig, mergeConfig } from 'vitest/config';
import base from './vitest.config.js';

// The tests `npm run mutate` runs against each mutant. Left out: tests that drive the
// package through child processes or dist/ (a child never has an active mutant, so they can
// neither kill nor break one), and the long soak and end-to-end tests of other folders, which
// would be re-run for every mutant they cover. Leaving tests out can only lower a score, never
// raise it: a mutant they alone would kill counts as survived or uncovered.
export default mergeConfig(
  base,
  defineConfig({
    test: {
      // One module graph for all the files of a mutant's run: each file would otherwise import
      // lib/ and kernel-sim/ again (about 0.4 s a file). The dry run checks that the files pass
      // together in one worker, in the order they are run.
      isolate: false,
      exclude: [
        ...configDefaults.exclude,
        'test/cli.test.ts',
        'test/docs.test.ts',
        'test/package.test.ts',
        'test/readme.test.ts',
        'test/unprivileged.test.ts',
        'test/worker.test.ts',
        'test/overcommit.test.ts',
        'test/measured-table.test.ts',
        'test/pinning-moves.test.ts',
        'test/fabric/**',
        'test/remote-paging/main-thread.test.ts',
        'test/remote-paging/redis.test.ts',
        'test/remote-paging/soak.test.ts',
        'test/verbs/soak.test.ts',
        'test/uffd-unit/**',
      ],
    },
  }),
);
