#!/usr/bin/env node
// pagefault-rdma: the command-line programs. Every file in commands/ is a subcommand (it
// default-exports defineProgram({...})), so adding a program is adding one file.
import { readdirSync, readFileSync } from 'node:fs';
import { Command } from 'commander';
import { printErr, wrapped } from './programs/support/format.js';
import { addProgram, type Program } from './program.js';

// A reader that goes away early (`| head`) ends the program quietly, as cat or ls do.
for (const stream of [process.stdout, process.stderr]) {
  stream.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(0);
    throw err;
  });
}

const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string; description: string };
const cli = new Command('pagefault-rdma')
  .description('RDMA-style programs on unpinned memory: genuine page faults, detected, resolved and retransmitted')
  .version(pkg.version)
  // Errors and notes on stderr are wrapped to the terminal as stdout's lines are (every subcommand copies this).
  .configureOutput({ writeErr: (text) => printErr(text) })
  .showHelpAfterError("(pagefault-rdma --help lists the commands; pagefault-rdma COMMAND --help, a command's options)")
  .configureHelp({
    // Defaults as they are typed (64K, touch-ahead), not as JSON; none for a flag that is off; none
    // where the description says it already.
    optionDescription(option) {
      const extra: string[] = [];
      if (option.argChoices) extra.push(`choices: ${option.argChoices.join(', ')}`);
      const d: unknown = option.defaultValue;
      if (d !== undefined && d !== false && !/\(default/.test(option.description))
        extra.push(`default: ${option.defaultValueDescription ?? (Array.isArray(d) ? d.join(', ') : String(d))}`);
      if (option.envVar !== undefined) extra.push(`env: ${option.envVar}`);
      return extra.length ? `${option.description} (${extra.join('; ')})` : option.description;
    },
  })
  .addHelpText('after', () => wrapped('\nSizes are written as perftest takes them: 4096, 64K, 16M. Each command has --help.'));

const dir = new URL('./commands/', import.meta.url);
const all = readdirSync(dir)
  .filter((f) => f.endsWith('.js'))
  .sort();
// A program's file bears its name: running one loads that file only (the list and --help load
// them all). Every module loaded stays in the process for its life: the memory server measured
// ~20 µs more CPU per request with all of them loaded than with its own.
const named = process.argv[2] !== undefined && all.includes(`${process.argv[2]}.js`) ? [`${process.argv[2]}.js`] : undefined;
const files = named ?? all;
for (const f of files) {
  const mod = (await import(new URL(f, dir).href)) as { default?: Program<never> };
  if (mod.default) addProgram(cli, mod.default);
}

try {
  await cli.parseAsync();
} catch (err) {
  printErr(`pagefault-rdma: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
}
