// What the two sides of a fabric program (fabric-peer.ts) swap, checked as the wire is: the
// transport's exchange carries any small value, so every body the other side sends is held to
// its shape here, field by field, before anything is made of it. A body that breaks its shape
// ends the run with an error naming the field (never a TypeError, a NaN size or an op nobody
// offers); unknown fields are refused like unknown flags on the wire.

/** The other side sent what the run cannot take: malformed, past this side's limits, or another program. */
export class PeerRefusal extends Error {
  readonly code = 'ERR_PFR_PEER_REFUSED';
}

/** A check of one value: returns it typed, or throws a PeerRefusal naming `path`. */
export type Check<T> = (v: unknown, path: string) => T;

function refuse(path: string, want: string, v: unknown): never {
  const got = typeof v === 'string' ? JSON.stringify(v.slice(0, 40)) : typeof v === 'bigint' ? `${v}n` : typeof v === 'object' ? typeof v : String(v);
  throw new PeerRefusal(`${path} must be ${want}, got ${got}`);
}

export const int =
  (min: number, max: number): Check<number> =>
  (v, path) =>
    typeof v === 'number' && Number.isInteger(v) && v >= min && v <= max ? v : refuse(path, `an integer in ${min}..${max}`, v);

/** A finite number of at least `min` (a measurement). */
export const finite =
  (min = 0): Check<number> =>
  (v, path) =>
    typeof v === 'number' && Number.isFinite(v) && v >= min ? v : refuse(path, `a finite number of at least ${min}`, v);

export const bool: Check<boolean> = (v, path) => (typeof v === 'boolean' ? v : refuse(path, 'true or false', v));

export const text =
  (max: number): Check<string> =>
  (v, path) =>
    typeof v === 'string' && v.length <= max ? v : refuse(path, `a string of at most ${max} characters`, v);

/** A GID as text (IPv6 notation, e.g. ::ffff:127.0.0.1): hex digits, colons and dots only, so printing it is safe. */
export const gidText: Check<string> = (v, path) =>
  typeof v === 'string' && v.length <= 45 && /^[0-9a-fA-F:.]+$/.test(v) && v.includes(':') ? v : refuse(path, 'a GID in IPv6 notation', v);

export const big =
  (max: bigint): Check<bigint> =>
  (v, path) =>
    typeof v === 'bigint' && v >= 0n && v <= max ? v : refuse(path, `an integer (bigint) in 0..${max}`, v);

export const oneOf =
  <T extends string | number | boolean | null>(values: readonly T[]): Check<T> =>
  (v, path) =>
    values.includes(v as T) ? (v as T) : refuse(path, `one of ${values.map((x) => JSON.stringify(x)).join(', ')}`, v);

export const list =
  <T>(item: Check<T>, min: number, max: number): Check<T[]> =>
  (v, path) => {
    if (!Array.isArray(v) || v.length < min || v.length > max) refuse(path, `a list of ${min === max ? min : `${min}..${max}`} items`, v);
    return v.map((x, i) => item(x, `${path}[${i}]`));
  };

type Shape<T> = { [K in keyof T]-?: Check<Exclude<T[K], undefined>> };

/** A plain object of `shape`'s fields, those in `optional` may be absent; any other field is refused. */
export function record<T extends object>(shape: Shape<T>, optional: ReadonlyArray<keyof T> = []): Check<T> {
  return (v, path) => {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) refuse(path, 'an object', v);
    const o = v as Record<string, unknown>;
    for (const k of Object.keys(o)) if (!(k in shape)) throw new PeerRefusal(`${path}.${k} is not a field it has`);
    const out: Record<string, unknown> = {};
    for (const [k, check] of Object.entries(shape) as Array<[string, Check<unknown>]>) {
      if (o[k] === undefined) {
        if (!optional.includes(k as keyof T)) throw new PeerRefusal(`${path}.${k} is missing`);
        continue;
      }
      out[k] = check(o[k], `${path}.${k}`);
    }
    return out as T;
  };
}

/** `check(v)` for the body the other side (`who`) sent as `what`; a PeerRefusal names both. */
export function checkBody<T>(check: Check<T>, v: unknown, who: string, what: string): T {
  try {
    return check(v, what);
  } catch (e) {
    if (e instanceof PeerRefusal) throw new PeerRefusal(`${who} sent a malformed ${what}: ${e.message}`);
    throw e;
  }
}
