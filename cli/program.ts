// What every subcommand of `pagefault-rdma` shares: its own options plus --json FILE (the
// results, like perftest's --out_json), --trace FILE.json (Chrome trace-event JSON of every
// fault) and, where the program draws one, --plot FILE.svg. A program is one file in
// cli/commands/ that default-exports defineProgram({...}); main.ts finds it there.
import { accessSync, constants, statSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import type { Command } from 'commander';
import { writePlot, type PlotSpec } from './programs/support/plot.js';
import { TraceFile } from './programs/support/trace-file.js';
import { parsePositiveInt, printErr } from './programs/support/format.js';
import { DEFAULT_TRACE_EVENTS, HARDWARE_NAMES, defaultHardware, setDefaultHardware } from '../lib/index.js';

/** The options every program takes. */
export interface CommonOptions {
  json?: string;
  trace?: string;
  /** --hardware NAME: the hardware preset every cluster of the run models (pagefault-rdma hardware lists them). */
  hardware?: string;
  traceEvents?: number;
  plot?: string;
  /** The positional arguments (a program that declares some with cmd.argument, e.g. rc-pingpong's HOST). */
  args?: string[];
  /** The options given on the command line (attribute names), not left at their defaults. */
  given?: string[];
}

/** What a program's run gets besides its options: where its clusters' traces go. */
export interface RunIo {
  /** Set when --trace was given: hand every cluster's contexts to it. */
  trace: TraceFile | undefined;
}

export interface RunOutcome {
  /** What --json writes under "results" (bigints become hex strings). */
  results: unknown;
  /** What --plot draws, for programs that draw. */
  plot?: PlotSpec;
  /** False: this process writes no --json (a job's rank other than 0: rank 0 writes the whole job's). */
  writes?: boolean;
  /** Where this process writes its --trace, when not the file given (a job's rank: one named by rank). */
  traceFile?: string | undefined;
}

export interface Program<O extends object = Record<string, unknown>> {
  /** The subcommand's name. */
  name: string;
  /** One line for the list of commands. */
  summary: string;
  /** The --help text (default: the summary). */
  description?: string;
  /** What --plot draws; programs without it take no --plot. */
  plot?: string;
  /** Why --trace is refused, for a program whose faults no fault library traces. */
  noTrace?: string;
  /** False for a program that runs no engine (it takes no --hardware). */
  engine?: false;
  /** Add the program's own options (and checks) to its command. */
  options?(cmd: Command): void;
  /** Run with the parsed options; print rows as they finish; return what --json and --plot take. */
  run(options: O & CommonOptions, io: RunIo): Promise<RunOutcome>;
}

/** Why a benchmark refuses --trace. */
export const BENCH_NO_TRACE =
  'a benchmark runs its transfers at full speed, and tracing every event would slow what it measures; ' +
  'trace the same transfers with odp-vs-pinned, pingpong or destination-fault --trace';

/** `spec` with its title naming the hardware preset its modelled figures are of. */
export function namePreset(spec: PlotSpec, hardware: string): PlotSpec {
  const note = `hardware preset: ${hardware}`;
  const t = (spec as { title?: unknown }).title;
  if (typeof t === 'object' && t !== null && !Array.isArray(t)) {
    const o = t as { text?: unknown; subtitle?: unknown };
    const subtitle =
      o.subtitle === undefined ? note : Array.isArray(o.subtitle) ? [...(o.subtitle as string[]), note] : [String(o.subtitle as string), note];
    return { ...spec, title: { ...o, subtitle } } as PlotSpec;
  }
  return { ...spec, title: { text: (t as string | string[] | undefined) ?? '', subtitle: note } } as PlotSpec;
}

/** Declare a program: `export default defineProgram({ name, summary, options, run })`. */
export function defineProgram<O extends object>(program: Program<O>): Program<O> {
  return program;
}

/** Add `program` to the CLI as a subcommand with the shared options. */
export function addProgram(cli: Command, program: Program<never>): void {
  const cmd = cli
    .command(program.name)
    .summary(program.summary)
    .description(program.description ?? program.summary);
  cmd.showHelpAfterError(`(pagefault-rdma ${program.name} --help lists its options)`);
  program.options?.(cmd);
  cmd.option('--json <file>', "write every figure and count of the run as JSON to FILE (this project's layout)");
  cmd.option('--trace <file>', 'write a Chrome trace-event JSON of every fault to FILE (open in Perfetto)');
  cmd.option('--trace-events <n>', 'with --trace: events each process keeps (the newest)', parsePositiveInt, DEFAULT_TRACE_EVENTS);
  if (program.engine !== false)
    cmd.option('--hardware <name>', `the hardware preset the engine models: ${HARDWARE_NAMES.join(', ')} (pagefault-rdma hardware lists them)`);
  if (program.plot) cmd.option('--plot <file>', `draw ${program.plot} to FILE as SVG`);
  // Output files are written at the end: a folder that cannot take them is refused up front.
  cmd.hook('preAction', (c) => {
    const opts = c.opts<CommonOptions>();
    if (opts.hardware !== undefined) {
      try {
        setDefaultHardware(opts.hardware);
      } catch (e) {
        c.error(`error: --hardware: ${(e as Error).message}`, { code: 'ERR_INVALID_ARG_VALUE' });
      }
    }
    if (opts.trace !== undefined && program.noTrace) c.error(`error: --trace: ${program.noTrace}`, { code: 'ERR_PFR_OUTPUT' });
    for (const flag of ['json', 'trace', 'plot'] as const) {
      const file = opts[flag];
      if (file === undefined) continue;
      const dir = dirname(resolve(file));
      try {
        if (!statSync(dir).isDirectory()) throw new Error('not a folder');
        accessSync(dir, constants.W_OK);
      } catch {
        c.error(`error: --${flag} ${file}: the folder ${dir} does not exist or cannot be written`, { code: 'ERR_PFR_OUTPUT' });
      }
    }
  });
  // Commander passes the positional arguments first, then the options and the command.
  cmd.action(async (...params: unknown[]) => {
    const command = params[params.length - 1] as Command;
    const given = command.options.map((o) => o.attributeName()).filter((k) => command.getOptionValueSource(k) === 'cli');
    const opts: CommonOptions = { ...command.opts<CommonOptions>(), args: command.args, given };
    const io: RunIo = { trace: opts.trace ? new TraceFile(opts.traceEvents) : undefined };
    const outcome = await (program as Program<object>).run(opts, io);
    if (opts.json && outcome.writes !== false) {
      const options = Object.fromEntries(
        Object.entries(opts).filter(([k]) => !['json', 'trace', 'traceEvents', 'plot', 'args', 'given'].includes(k)),
      );
      if (program.engine !== false && options.hardware === undefined) options.hardware = defaultHardware();
      const doc = { program: `pagefault-rdma ${command.name()}`, date: new Date().toISOString(), options, results: outcome.results };
      writeFileSync(opts.json, JSON.stringify(doc, (_k, v: unknown) => (typeof v === 'bigint' ? `0x${v.toString(16)}` : v), 2) + '\n');
      printErr(`results: ${opts.json}`);
    }
    if (io.trace && opts.trace) {
      const file = outcome.traceFile ?? opts.trace;
      io.trace.write(file);
      printErr(`trace: ${file} (${io.trace.events.length} events; open it in https://ui.perfetto.dev)`);
      const dropped = io.trace.droppedNote;
      if (dropped) printErr(`trace: ${dropped}`);
    }
    if (opts.plot && outcome.plot) {
      await writePlot(opts.plot, program.engine === false ? outcome.plot : namePreset(outcome.plot, defaultHardware()));
      printErr(`plot: ${opts.plot}`);
    }
  });
}
