// `pagefault-rdma libdir`: the folder of the project's libibverbs.so.1, for those who run verbs
// programs on the device themselves: LD_LIBRARY_PATH=$(pagefault-rdma libdir) ibv_devinfo.
import { verbsLibDir } from '../../native/index.js';
import { defineProgram } from '../program.js';

export default defineProgram({
  name: 'libdir',
  summary: "print the folder of the project's libibverbs.so.1 (for LD_LIBRARY_PATH)",
  engine: false,
  noTrace: 'it prints a folder',
  async run() {
    const dir = verbsLibDir();
    process.stdout.write(`${dir}\n`);
    return { results: { libdir: dir } };
  },
});
