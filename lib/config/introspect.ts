/**
 * Reading zod schemas as data: the CLI coerces `--a.b value` by the field's type, help lists every
 * field with its type, default and description, and unknown keys get the nearest valid key. All of
 * it comes from the schemas in `schemas/`, the one source of truth for configuration.
 */
import type { z } from 'zod';

type AnySchema = z.ZodType;

interface Def {
  type: string;
  innerType?: AnySchema;
  in?: AnySchema;
  element?: AnySchema;
  shape?: Record<string, AnySchema>;
  entries?: Record<string, string | number>;
  values?: unknown[];
  options?: AnySchema[];
  defaultValue?: unknown;
}

const defOf = (s: AnySchema): Def => (s as unknown as { _zod: { def: Def } })._zod.def;

/** Wrappers that do not change what a field holds on input. */
const WRAPPERS = new Set(['optional', 'nullable', 'default', 'prefault', 'readonly', 'catch', 'nonoptional']);

export interface FieldInfo {
  /** The schema with optional/default/transform wrappers removed. */
  core: AnySchema;
  kind: string;
  description?: string;
  default?: unknown;
  hasDefault: boolean;
  optional: boolean;
}

/** Strips wrappers (and the input side of transforms), collecting description and default on the way. */
export function inspect(schema: AnySchema): FieldInfo {
  let s = schema;
  let description: string | undefined;
  let dflt: unknown;
  let hasDefault = false;
  let optional = false;
  for (;;) {
    description ??= (s as { description?: string }).description;
    const def = defOf(s);
    if (def.type === 'default' || def.type === 'prefault') {
      if (!hasDefault) {
        hasDefault = true;
        dflt = def.defaultValue;
      }
    }
    if (def.type === 'optional' || def.type === 'nullable') optional = true;
    if (WRAPPERS.has(def.type) && def.innerType) s = def.innerType;
    else if (def.type === 'pipe' && def.in) s = def.in;
    else break;
  }
  return { core: s, kind: defOf(s).type, description, default: dflt, hasDefault, optional };
}

/** The fields of an object schema (after unwrapping), or undefined if it is not an object. */
export function objectShape(schema: AnySchema): Record<string, AnySchema> | undefined {
  const info = inspect(schema);
  return info.kind === 'object' ? defOf(info.core).shape : undefined;
}

/** The schema at a dotted path inside an object schema, or undefined if no such field exists. */
export function fieldAt(schema: AnySchema, path: string[]): AnySchema | undefined {
  let s: AnySchema | undefined = schema;
  for (const key of path) {
    const shape: Record<string, AnySchema> | undefined = s && objectShape(s);
    if (!shape || !Object.prototype.hasOwnProperty.call(shape, key)) return undefined;
    s = shape[key];
  }
  return s;
}

/** Element schema of an array field. */
export function arrayElement(schema: AnySchema): AnySchema | undefined {
  const info = inspect(schema);
  return info.kind === 'array' ? defOf(info.core).element : undefined;
}

/** Allowed values of an enum or literal field. */
export function choices(schema: AnySchema): unknown[] | undefined {
  const info = inspect(schema);
  const def = defOf(info.core);
  if (info.kind === 'enum' && def.entries) return Object.values(def.entries);
  if (info.kind === 'literal' && def.values) return def.values;
  return undefined;
}

/** A short human type name: number, integer, string, boolean, a|b|c, list[number], json, ... */
export function typeName(schema: AnySchema): string {
  const info = inspect(schema);
  const opts = choices(schema);
  if (opts) return opts.join('|');
  switch (info.kind) {
    case 'number':
      return (info.core as unknown as { format?: string | null }).format === 'safeint' ? 'integer' : 'number';
    case 'int':
      return 'integer';
    case 'array': {
      const el = arrayElement(schema)!;
      return objectShape(el) ? 'list[json]' : `list[${typeName(el)}]`;
    }
    case 'record':
    case 'object':
    case 'unknown':
    case 'any':
      return 'json';
    case 'union':
      return (defOf(info.core).options ?? []).map(typeName).join('|');
    default:
      return info.kind;
  }
}

export interface Leaf {
  path: string[];
  schema: AnySchema;
}

/** Every leaf field (non-object) of an object schema, depth first in declaration order. */
export function leaves(schema: AnySchema, prefix: string[] = []): Leaf[] {
  const shape = objectShape(schema);
  if (!shape) return [{ path: prefix, schema }];
  return Object.entries(shape).flatMap(([k, v]) => leaves(v, [...prefix, k]));
}

/** Every valid dotted path (objects and leaves), for "did you mean" suggestions. */
export function allPaths(schema: AnySchema, prefix: string[] = []): string[] {
  const shape = objectShape(schema);
  if (!shape) return [];
  return Object.entries(shape).flatMap(([k, v]) => {
    const p = [...prefix, k];
    return [p.join('.'), ...allPaths(v, p)];
  });
}
