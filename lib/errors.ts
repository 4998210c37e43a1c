// Errors: Node-style system errors for failed syscalls (code = errno name, errno, syscall,
// a message naming the operation and the fix) and library errors with stable ERR_* codes.

/** A failed system call, shaped like Node's own (fs, net) errors. */
export interface SystemError extends Error {
  /** The errno name, e.g. 'ENOMEM' or 'EPERM'. */
  code: string;
  /** The negative errno number, as Node's own system errors carry it. */
  errno: number;
  /** The system call that failed, e.g. 'ioctl(UFFDIO_COPY)' or 'mlock'. */
  syscall: string;
}

/** Library error codes. Stable: match on `err.code`, never on the message. */
export type PfrErrorCode =
  | 'ERR_PFR_CLOSED'
  | 'ERR_PFR_NOT_REGISTERED'
  | 'ERR_PFR_HANDLER_FAILED'
  | 'ERR_PFR_HANDLER_TIMEOUT'
  | 'ERR_PFR_UNSUPPORTED'
  | 'ERR_PFR_ACCESS_FAILED'
  | 'ERR_PFR_PAGE_CORRUPT'
  | 'ERR_PFR_PAGE_LOST'
  | 'ERR_PFR_STORE_FULL'
  | 'ERR_PFR_STORE_UNAVAILABLE'
  | 'ERR_PFR_TRACE_OFF'
  | 'ERR_PFR_NO_LAUNCHER'
  | 'ERR_PFR_RENDEZVOUS'
  | 'ERR_PFR_RANK_LOST';

/** A library error: a stable `ERR_PFR_*` code and a message that says what to change. */
export class PfrError extends Error {
  /** Stable code to test against (`err.code === 'ERR_PFR_CLOSED'`); the message may change. */
  readonly code: PfrErrorCode;
  constructor(code: PfrErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'PfrError';
    this.code = code;
  }
}

/** Thrown by every method of a closed object. */
export function closedError(what: string): PfrError {
  return new PfrError('ERR_PFR_CLOSED', `${what} is closed; create a new one`);
}

function isNativeSystemError(err: unknown): err is SystemError {
  return err instanceof Error && typeof (err as SystemError).syscall === 'string' && typeof (err as SystemError).code === 'string';
}

/**
 * Turn an error thrown by the raw binding into a Node-style system error whose message
 * names the operation and the fix. `fixes` maps an errno name to advice; anything else
 * falls back to the kernel's own words.
 */
export function systemError(operation: string, err: unknown, fixes: Record<string, string> = {}): Error {
  if (!isNativeSystemError(err)) return err instanceof Error ? err : new Error(String(err));
  const detail = err.message.replace(/^.*? failed: /, '');
  const fix = fixes[err.code];
  const e = new Error(`${operation}: ${err.syscall} failed with ${detail}${fix ? `. ${fix}` : ''}`, { cause: err }) as SystemError;
  e.code = err.code;
  e.errno = err.errno;
  e.syscall = err.syscall;
  return e;
}

/** Run a raw binding call; rethrow its system error in the friendly form. */
export function sys<T>(operation: string, fixes: Record<string, string>, call: () => T): T {
  try {
    return call();
  } catch (err) {
    throw systemError(operation, err, fixes);
  }
}
