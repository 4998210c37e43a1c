// `pagefault-rdma hardware`: the hardware presets (a cost model and a fault-handling behaviour
// each), with their sources and the headline figures their calibration tests reproduce.
import { MODEL_LABEL } from '../programs/support/format.js';
import { hardwarePresets } from '../../lib/index.js';
import { defineProgram } from '../program.js';

/** `text` wrapped to lines of at most 98 columns, each after `indent`. */
function wrap(text: string, indent: string): string {
  const lines: string[] = [];
  let line = '';
  for (const w of text.split(' ')) {
    if (line && indent.length + line.length + 1 + w.length > 98) {
      lines.push(indent + line);
      line = w;
    } else line = line ? `${line} ${w}` : w;
  }
  if (line) lines.push(indent + line);
  return lines.join('\n') + '\n';
}

export default defineProgram({
  name: 'hardware',
  summary: 'list the hardware presets (--hardware NAME): each design, its fault handling, source and headline figures',
  engine: false,
  noTrace: 'it prints a list',
  async run() {
    const all = hardwarePresets();
    for (const p of all) {
      process.stdout.write(`${p.name}${p.name === 'exanest-pldma' ? ' (default)' : ''}  [fault mode: ${p.faultMode}]\n`);
      process.stdout.write(wrap(p.title, '  '));
      for (const h of p.headlines)
        process.stdout.write(`  - ${h.what}: ${h.unit === '×' ? `${h.value}×` : `${h.value.toFixed(h.value < 10 ? 3 : 1)} µs`}\n`);
      for (const n of p.notes ?? []) process.stdout.write(wrap(`- note: ${n}`, '  '));
      process.stdout.write(wrap(`source: ${p.source}`, '  ') + '\n');
    }
    process.stdout.write(wrap(`Figures are ${MODEL_LABEL}; rxe-odp's costs were measured on this machine just now.`, ''));
    process.stdout.write(wrap('Use one: pagefault-rdma COMMAND --hardware NAME, or Cluster.create({ hardware: NAME, costs: {...} }).', ''));
    return {
      results: all.map((p) => ({
        name: p.name,
        title: p.title,
        faultMode: p.faultMode,
        source: p.source,
        headlines: p.headlines,
        measured: p.measured ?? false,
        costs: p.costs,
      })),
    };
  },
});
