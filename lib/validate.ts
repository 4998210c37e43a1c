// Argument checks done in TypeScript before any syscall. Errors carry Node's codes.

function typeError(message: string): TypeError {
  const e = new TypeError(message) as TypeError & { code: string };
  e.code = 'ERR_INVALID_ARG_TYPE';
  return e;
}

export function rangeError(message: string): RangeError {
  const e = new RangeError(message) as RangeError & { code: string };
  e.code = 'ERR_OUT_OF_RANGE';
  return e;
}

export function invalidArg(message: string): TypeError {
  const e = new TypeError(message) as TypeError & { code: string };
  e.code = 'ERR_INVALID_ARG_VALUE';
  return e;
}

function isIntIn(value: unknown, min: number, max: number): value is number {
  return typeof value === 'number' && Number.isInteger(value) && value >= min && value <= max;
}

/** An integer in [min, max]. */
export function checkInt(name: string, value: unknown, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof value !== 'number') throw typeError(`${name} must be a number, got ${typeof value}`);
  if (!Number.isInteger(value)) throw rangeError(`${name} must be an integer, got ${value}`);
  if (value < min || value > max) throw rangeError(`${name} must be between ${min} and ${max}, got ${value}`);
  return value;
}

export function checkBool(name: string, value: unknown, fallback: boolean): boolean {
  if (value === undefined) return fallback;
  if (typeof value !== 'boolean') throw typeError(`${name} must be a boolean, got ${typeof value}`);
  return value;
}

/**
 * An options object (undefined: none). With `keys`, a key it does not know is refused, naming
 * it and the known ones: a typo (`{ node: 4 }` for `nodes`) must not be silently ignored.
 */
export function checkObject(name: string, value: unknown, keys?: readonly string[]): Record<string, unknown> {
  if (value === undefined) return {};
  if (value === null || typeof value !== 'object') throw typeError(`${name} must be an object`);
  if (keys) checkKeys(name, value, keys);
  return value as Record<string, unknown>;
}

/** Refuse a key of `value` not in `keys` (undefined values count: `{ nodes: undefined }` is fine, `{ node: 4 }` is not). */
export function checkKeys(name: string, value: object, keys: readonly string[]): void {
  for (const k of Object.keys(value)) if (!keys.includes(k)) throw invalidArg(`${name}: unknown option '${k}' (the options are ${keys.join(', ')})`);
}

/** The keys of an options type, listed once: the compiler checks the list is complete and has no stranger. */
export function known<T>(keys: { [K in keyof Required<T>]: true }): readonly string[] {
  return Object.freeze(Object.keys(keys));
}

export function checkFunction(name: string, value: unknown): void {
  if (typeof value !== 'function') throw typeError(`${name} must be a function`);
}

export interface Span {
  offset: number;
  length: number;
}

/**
 * A range [offset, offset+length) inside a region of `size` bytes. `align` requires the
 * offset (and, with `alignLength`, the length) to be multiples of it.
 */
export function checkSpan(what: string, size: number, offset: unknown, length: unknown, align: number, alignLength: boolean): Span {
  // Every resolution of every fault comes through here: the labels are built only for an error.
  const off = offset === undefined ? 0 : isIntIn(offset, 0, size) ? offset : checkInt(`${what}: offset`, offset, 0, size);
  const len = length === undefined ? size - off : isIntIn(length, 0, Number.MAX_SAFE_INTEGER) ? length : checkInt(`${what}: length`, length, 0);
  if (len <= 0) throw rangeError(`${what}: length must be positive, got ${len}`);
  if (off + len > size) throw rangeError(`${what}: range ${off}..${off + len} is outside the region (size ${size})`);
  if (off % align !== 0) throw rangeError(`${what}: offset ${off} is not a multiple of ${align} (page size); align it down`);
  if (alignLength && len % align !== 0) throw rangeError(`${what}: length ${len} is not a multiple of ${align} (page size); round it up`);
  return { offset: off, length: len };
}
