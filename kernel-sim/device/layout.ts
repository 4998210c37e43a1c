// C struct layout, computed as a C compiler for x86-64 / aarch64 Linux lays a struct out:
// each field at the next multiple of its alignment, a struct's size rounded up to its largest
// alignment, a union as large as its largest member. The device ABI (abi.ts) is written with
// these, and its test checks every offset against what C's offsetof says of native/device/abi.h.

/** A scalar of the ABI: little-endian, naturally aligned. */
export type ScalarKind = 'u8' | 'u16' | 'u32' | 'i32' | 'u64' | 'f64';

const SCALAR_SIZE: Record<ScalarKind, number> = { u8: 1, u16: 2, u32: 4, i32: 4, u64: 8, f64: 8 };

/** What a field holds: a scalar, an array, a nested struct or union. */
export type FieldType = ScalarKind | Layout | ArrayType;

interface ArrayType {
  readonly element: ScalarKind | Layout;
  readonly length: number;
}

/** A fixed-length array (char name[64], uint32_t pad[30], struct rxe_sge sge[n]). */
export function array(element: ScalarKind | Layout, length: number): ArrayType {
  return { element, length };
}

/** Where a field lies in its outermost struct, by dotted path ('wr.rdma.remote_addr'). */
export interface FieldInfo {
  readonly offset: number;
  readonly size: number;
  /** The scalar of a leaf field; undefined for an array, struct or union. */
  readonly kind: ScalarKind | undefined;
}

function sizeOf(t: FieldType): number {
  if (typeof t === 'string') return SCALAR_SIZE[t];
  if (t instanceof Layout) return t.size;
  return sizeOf(t.element) * t.length;
}

function alignOf(t: FieldType): number {
  if (typeof t === 'string') return SCALAR_SIZE[t];
  if (t instanceof Layout) return t.align;
  return alignOf(t.element);
}

/** A struct's or union's layout: its size, alignment and every field by dotted path. */
export class Layout {
  readonly name: string;
  readonly size: number;
  readonly align: number;
  readonly fields: ReadonlyMap<string, FieldInfo>;

  constructor(name: string, members: readonly (readonly [string, FieldType])[], union: boolean) {
    this.name = name;
    const fields = new Map<string, FieldInfo>();
    let end = 0;
    let align = 1;
    for (const [field, type] of members) {
      const a = alignOf(type);
      const offset = union ? 0 : Math.ceil(end / a) * a;
      const size = sizeOf(type);
      fields.set(field, { offset, size, kind: typeof type === 'string' ? type : undefined });
      if (type instanceof Layout) for (const [path, f] of type.fields) fields.set(`${field}.${path}`, { ...f, offset: offset + f.offset });
      end = union ? Math.max(end, size) : offset + size;
      align = Math.max(align, a);
    }
    this.align = align;
    this.size = Math.ceil(end / align) * align;
    this.fields = fields;
  }

  /** The offset of `path`; throws for a field this layout does not have (a typo in the mirror). */
  offset(path: string): number {
    const f = this.fields.get(path);
    if (!f) throw new Error(`${this.name} has no field ${path}`);
    return f.offset;
  }

  /** The offsets of `paths`, as an object keyed by path: the hot paths read these constants. */
  offsets<const K extends readonly string[]>(paths: K): { readonly [P in K[number]]: number } {
    return Object.fromEntries(paths.map((p) => [p, this.offset(p)])) as { readonly [P in K[number]]: number };
  }
}

/** A struct of `members`, in order. */
export function struct(name: string, members: readonly (readonly [string, FieldType])[]): Layout {
  return new Layout(name, members, false);
}

/** A union of `members`, all at offset 0. */
export function union(name: string, members: readonly (readonly [string, FieldType])[]): Layout {
  return new Layout(name, members, true);
}
