// What /proc/self/smaps says about a range: whether the kernel still holds it mlocked (the
// "lo" VmFlag of every VMA that covers it) and the process's resident memory.
import { readFileSync } from 'node:fs';

/** Bytes of [address, address+length) covered by VMAs that carry VM_LOCKED ("lo"). */
export function lockedBytes(address: bigint, length: number): number {
  const start = address;
  const end = address + BigInt(length);
  let locked = 0n;
  let vma: { from: bigint; to: bigint } | undefined;
  for (const line of readFileSync('/proc/self/smaps', 'utf8').split('\n')) {
    const range = /^([0-9a-f]+)-([0-9a-f]+) /.exec(line);
    if (range) {
      vma = { from: BigInt('0x' + range[1]!), to: BigInt('0x' + range[2]!) };
      continue;
    }
    if (!vma || !line.startsWith('VmFlags:') || !line.split(/\s+/).includes('lo')) continue;
    const from = vma.from > start ? vma.from : start;
    const to = vma.to < end ? vma.to : end;
    if (to > from) locked += to - from;
  }
  return Number(locked);
}

/** The process's resident set (VmRSS of /proc/self/status), in bytes. */
export function residentSetBytes(): number {
  const kb = /VmRSS:\s+(\d+) kB/.exec(readFileSync('/proc/self/status', 'utf8'))?.[1];
  return kb === undefined ? 0 : Number(kb) * 1024;
}
