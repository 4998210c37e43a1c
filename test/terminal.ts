// A tiny terminal for the tests: what a program's bytes leave on the screen of a terminal of
// `cols` columns. It interprets what the programs and their progress lines write: printable
// text (autowrap on or off), \r, \n, \b, ESC[K (erase to the end of the line, or 1/2), ESC[nA/B/C/D/G,
// ESC[?25l/h (cursor hidden / shown), ESC[?7l/h (autowrap off / on), ESC 7 / ESC 8 and ESC[s /
// ESC[u (save / restore the cursor). Anything else it does not know is an error: the test then
// says which sequence to teach it, rather than passing on a screen it did not render.

export interface Screen {
  /** The screen's lines, trailing spaces removed. */
  lines: string[];
  cursorVisible: boolean;
  autowrap: boolean;
  /** Where the cursor was left. */
  row: number;
  col: number;
}

export function render(bytes: string, cols: number): Screen {
  const lines: string[][] = [[]];
  let row = 0;
  let col = 0;
  let cursorVisible = true;
  let autowrap = true;
  let saved = { row: 0, col: 0 };
  // With autowrap, a character written in the last column leaves the cursor there until the next one.
  let pendingWrap = false;
  const lineAt = (r: number): string[] => {
    while (lines.length <= r) lines.push([]);
    return lines[r]!;
  };
  const put = (ch: string): void => {
    if (pendingWrap) {
      row++;
      col = 0;
      pendingWrap = false;
    }
    const l = lineAt(row);
    while (l.length < col) l.push(' ');
    l[col] = ch;
    if (col === cols - 1) pendingWrap = autowrap;
    else col++;
  };
  const chars = [...bytes];
  for (let i = 0; i < chars.length; i++) {
    const ch = chars[i]!;
    if (ch === '\x1b') {
      const next = chars[i + 1];
      if (next === '7' || next === '8') {
        if (next === '7') saved = { row, col };
        else ({ row, col } = saved);
        pendingWrap = false;
        i++;
        continue;
      }
      if (next !== '[') throw new Error(`unknown escape ESC ${JSON.stringify(next)} at ${i}`);
      let j = i + 2;
      let params = '';
      while (j < chars.length && /[0-9;?]/.test(chars[j]!)) params += chars[j++];
      const final = chars[j];
      i = j;
      const n = Number(params.replace('?', '')) || 1;
      pendingWrap = false;
      switch (`${params.startsWith('?') ? '?' : ''}${final}`) {
        case 'K': {
          const l = lineAt(row);
          const mode = Number(params) || 0;
          if (mode === 0) l.length = Math.min(l.length, col);
          else if (mode === 1) for (let k = 0; k <= col && k < l.length; k++) l[k] = ' ';
          else l.length = 0;
          break;
        }
        case 'A':
          row = Math.max(0, row - n);
          break;
        case 'B':
          row += n;
          break;
        case 'C':
          col = Math.min(cols - 1, col + n);
          break;
        case 'D':
          col = Math.max(0, col - n);
          break;
        case 'G':
          col = Math.min(cols - 1, n - 1);
          break;
        case 's':
          saved = { row, col };
          break;
        case 'u':
          ({ row, col } = saved);
          break;
        case '?l':
        case '?h': {
          const on = final === 'h';
          if (params === '?25') cursorVisible = on;
          else if (params === '?7') autowrap = on;
          else throw new Error(`unknown mode ESC[${params}${final}`);
          break;
        }
        default:
          throw new Error(`unknown sequence ESC[${params}${final ?? ''} at ${i}`);
      }
      continue;
    }
    if (ch === '\r') {
      col = 0;
      pendingWrap = false;
    } else if (ch === '\n') {
      row++;
      pendingWrap = false;
      // A terminal's \n under script (onlcr) comes as \r\n; a bare \n keeps the column, as a terminal does.
    } else if (ch === '\b') {
      col = Math.max(0, col - 1);
      pendingWrap = false;
    } else if (ch >= ' ') put(ch);
  }
  return { lines: lines.map((l) => l.join('').trimEnd()), cursorVisible, autowrap, row, col };
}
