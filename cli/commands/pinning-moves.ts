// `pagefault-rdma pinning-moves`: a pinned buffer's frames move under MADV_COLLAPSE (and khugepaged).
import { InvalidArgumentError } from 'commander';
import { pinningMoves } from '../programs/pinning-moves.js';
import { heading, parseSize } from '../programs/support/format.js';
import { defineProgram } from '../program.js';

interface Options {
  size: number;
  khugepagedWait: number;
}

export default defineProgram<Options>({
  name: 'pinning-moves',
  summary: 'pinning does not prevent faults: a pinned buffer collapsed into huge pages changes every frame',
  description:
    'Pin a buffer (regMr without ON_DEMAND: mlock), read its physical frames, MADV_COLLAPSE it, read them again: ' +
    'how many moved, still resident and mlocked; what the SMMU had cached for the pinned MR and what the ' +
    'MMU-notifier role did; RDMA writes into the collapsed buffer, bytes checked; then the same left to khugepaged.',
  options(cmd) {
    cmd
      .option('-s, --size <bytes>', 'buffer size, a multiple of 2M', parseSize, 4 * 2 ** 20)
      .option('--khugepaged-wait <seconds>', 'how long to leave khugepaged to collapse a pinned buffer (0: skip)', parseSeconds, 15);
    cmd.hook('preAction', (c) => {
      const o = c.opts() as Options;
      if (o.size % (2 * 2 ** 20)) c.error('error: --size must be a multiple of 2M (whole huge pages)');
    });
  },
  async run(o, io) {
    heading('Pinning does not prevent faults: MADV_COLLAPSE moves a pinned buffer');
    return { results: await pinningMoves({ size: o.size, khugepagedWaitS: o.khugepagedWait, trace: io.trace }) };
  },
});

function parseSeconds(value: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0 || n > 3600) throw new InvalidArgumentError('expected seconds between 0 and 3600');
  return n;
}
