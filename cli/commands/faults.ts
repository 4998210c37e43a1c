// `pagefault-rdma faults`: genuine userfaultfd faults handled in TypeScript.
import { PAGE_SIZE } from '../../lib/index.js';
import { firstFaults } from '../programs/first-faults.js';
import { heading, parsePositiveInt, parseSize } from '../programs/support/format.js';
import { defineProgram } from '../program.js';

export default defineProgram<{ size: number; pages?: number }>({
  name: 'faults',
  summary: "genuine userfaultfd faults of a native thread, handled in TypeScript; the JS thread's own resolved natively",
  options(cmd) {
    cmd.option('-s, --size <bytes>', 'fresh memory the native thread reads (a multiple of 4K)', parseSize, 64 * PAGE_SIZE);
    cmd.option('--pages <n>', 'pages of fresh memory (instead of -s)', parsePositiveInt);
    cmd.hook('preAction', (c) => {
      if ((c.opts() as { size: number }).size % PAGE_SIZE) c.error(`error: --size must be a multiple of ${PAGE_SIZE}`);
    });
  },
  async run(o, io) {
    heading('First faults: genuine userfaultfd page faults handled in TypeScript');
    return { results: await firstFaults({ pages: o.pages ?? o.size / PAGE_SIZE, trace: io.trace }) };
  },
});
