// Verbs errors: like libibverbs, a failed verb reports an errno; here it is a Node-style
// error with `code` (errno name), `errno`, `syscall` (the verb) and a message with the fix.
import { constants } from 'node:os';

export function verbsError(verb: string, code: keyof typeof constants.errno, message: string): Error {
  const e = new Error(`${verb}: ${message}`) as Error & { code: string; errno: number; syscall: string };
  e.code = code;
  e.errno = -constants.errno[code];
  e.syscall = verb;
  return e;
}
