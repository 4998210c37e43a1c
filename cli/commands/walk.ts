// `pagefault-rdma walk`: which source files a work request passes through, from qp.postSend to
// its work completion, for a resident RDMA WRITE, a SEND and a WRITE into an evicted page
// (issue 38's walk), recorded with the inspector (bench/walk.ts).
import { InvalidArgumentError, Option } from 'commander';
import { WALK_PATHS, walk, type WalkPath } from '../../bench/walk.js';
import { heading, print, Table } from '../programs/support/format.js';
import { defineProgram } from '../program.js';

interface Options {
  paths: WalkPath[];
  stops: boolean;
}

function paths(value: string): WalkPath[] {
  return value.split(',').map((v) => {
    const p = v.trim();
    if (!(WALK_PATHS as readonly string[]).includes(p)) throw new InvalidArgumentError(`"${p}" is not one of ${WALK_PATHS.join(',')}`);
    return p as WalkPath;
  });
}

export default defineProgram<Options>({
  name: 'walk',
  summary: 'count the source files a write, a SEND and a faulting write pass through, post to CQE',
  description:
    'Walks a work request from qp.postSend to its work completion as a debugger would: the inspector steps the ' +
    'program statement by statement and picks it up again in later tasks (the responder, the fault, the ACK). ' +
    'For a resident RDMA WRITE, a SEND and a WRITE into an evicted page it prints the stops (the files in the order ' +
    'visited; consecutive statements in one file are one stop), the distinct files, the back-and-forths (A→B→A) and ' +
    'the crossings between lib/ and kernel-sim/. Each path runs once untraced first.',
  noTrace: 'the walk records source files, not faults',
  options(cmd) {
    cmd
      .addOption(new Option('--paths <list>', `which of ${WALK_PATHS.join(',')} to walk`).argParser(paths).default([...WALK_PATHS], 'all'))
      .option('--stops', 'also print each walk stop by stop', false);
  },
  async run(o) {
    heading('The walk: post to CQE, file by file');
    const results = await walk(o.paths);
    const table = new Table([
      { header: 'path', left: true, width: 28 },
      { header: 'stops', width: 6 },
      { header: 'files', width: 6 },
      { header: 'A→B→A', width: 6 },
      { header: 'lib↔kernel-sim', width: 14 },
      { header: 'status', left: true, width: 8 },
    ]);
    table.header();
    for (const r of results)
      table.row([r.label, String(r.stops.length), String(r.files.length), String(r.backAndForth), String(r.crossings), r.status]);
    for (const r of results) {
      print();
      print(`${r.label}: ${r.files.length} files: ${r.files.join(', ')}`, 2);
      if (o.stops) print(r.stops.map((f, i) => `${i + 1}. ${f}`).join('\n'), 4);
    }
    return { results: { walks: results } };
  },
});
