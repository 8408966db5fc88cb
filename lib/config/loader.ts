/**
 * Configuration loading, as in the Python prime-rl:
 *
 *   prime-rl rl @ a.toml @ b.toml --trainer @ t.toml --trainer.optim.lr 3e-6 --no-lora.enabled
 *
 * Sources, highest precedence first: CLI `--a.b value` (kebab or snake case), TOML files given as
 * `@ path` (later files win, tables merge deeply; `--section @ path` scopes a file to one section),
 * environment variables `PRIME_A__B=value`, then the schema defaults. Every value is checked
 * against the command's zod schema; any problem is a ConfigError (exit code 2) naming the key or file.
 */
import * as path from 'node:path';
import { parse as parseToml, TomlError } from 'smol-toml';
import { z } from 'zod';
import { FileRefused, readBoundedText } from '../files';
import { describeDeepPath, MAX_JSON_DEPTH, pathTooDeep } from '../json';
import { ConfigError } from '../failures';
import { didYouMean } from './did-you-mean';
import { findAlias, applyAliases, type Alias, type Mapped } from './aliases';
import { allPaths, arrayElement, fieldAt, inspect, objectShape, typeName } from './introspect';
import { isFrameworkVariable } from './variables';

type Raw = Record<string, unknown>;

/** Where a value came from, for error messages. */
type Origins = Map<string, string>;

export interface SharedKeys {
  /** Dotted keys at the top level that fill the same key inside each section. */
  keys: readonly string[];
  sections: readonly string[];
  /**
   * Keys a section may set higher than the shared value (`seq_len` of inference: a server may hold
   * longer sequences than the run makes, as vLLM's max_model_len); lower is an error.
   */
  atLeast?: Readonly<Record<string, readonly string[]>>;
}

export interface LoadOptions<S extends z.ZodType> {
  schema: S;
  argv: string[];
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  shared?: SharedKeys;
  /** Documented keys of another spelling, mapped onto this schema's (lib/config/aliases.ts). */
  aliases?: readonly Alias[];
  /** The other commands' schemas: a `PRIME_` variable for one of them is left to it (see fromEnv). */
  otherSchemas?: readonly z.ZodType[];
}

export interface Loaded<T> {
  config: T;
  /** The documented keys that were mapped onto ours, for --dry-run. */
  mapped: Mapped[];
  dryRun: boolean;
  /** `--dry-run FILE` also writes the resolved config there (input for `temporal workflow start`). */
  dryRunFile?: string;
}

const isPlainObject = (v: unknown): v is Raw => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Deep merge of config trees: tables merge, everything else (arrays included) is replaced. */
export function deepMerge(base: Raw, over: Raw): Raw {
  const out: Raw = { ...base };
  for (const [k, v] of Object.entries(over)) {
    out[k] = isPlainObject(v) && isPlainObject(out[k]) ? deepMerge(out[k] as Raw, v) : v;
  }
  return out;
}

function setPath(obj: Raw, keys: string[], value: unknown): void {
  let node = obj;
  for (const k of keys.slice(0, -1)) {
    if (!isPlainObject(node[k])) node[k] = {};
    node = node[k] as Raw;
  }
  node[keys[keys.length - 1]] = value;
}

function getPath(obj: Raw, keys: string[]): unknown {
  let node: unknown = obj;
  for (const k of keys) {
    if (!isPlainObject(node) || !(k in node)) return undefined;
    node = node[k];
  }
  return node;
}

/** Records, for every leaf of `tree`, the source that set it (later calls overwrite earlier ones). */
function recordOrigins(tree: Raw, origin: string, origins: Origins, prefix: string[] = []): void {
  for (const [k, v] of Object.entries(tree)) {
    const p = [...prefix, k];
    if (isPlainObject(v) && Object.keys(v).length > 0) recordOrigins(v, origin, origins, p);
    else origins.set(p.join('.'), origin);
  }
}

const normaliseKey = (k: string) => k.replace(/-/g, '_');

function unknownKeyError(key: string, schema: z.ZodType, where: string): ConfigError {
  return new ConfigError(
    `unknown config key '${key}' (${where}).${didYouMean(key, allPaths(schema))} See --help for all keys.`,
  );
}

// ---------------------------------------------------------------------------------------------
// Values from text (CLI and env): coerced by the type of the field they set.

function parseJson(text: string, key: string, where: string): unknown {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new ConfigError(`${key} (${where}): expected JSON, got '${text}': ${(e as Error).message}`);
  }
  checkDepth(value, `${key} (${where})`, key);
  return value;
}

/**
 * Refuses a value nested deeper than MAX_JSON_DEPTH before any of the loader's recursive steps
 * (merging, aliases, key checks) sees it: a config nested 2,000 deep overflowed their stack.
 */
function checkDepth(value: unknown, where: string, prefix?: string): void {
  const keys = pathTooDeep(value);
  if (!keys) return;
  const key = describeDeepPath(prefix === undefined ? keys : [prefix, ...keys]);
  throw new ConfigError(
    `${where}: ${key} nests deeper than ${MAX_JSON_DEPTH} levels (tables and lists inside each other), more than any config needs`,
  );
}

/**
 * The field of a flag whose key sets nothing of ours but checks its value (`--slurm.dry-run
 * false`: only some values are accepted): the value is read as TOML would read it, a boolean, a
 * number, JSON, or else the plain string, so the check sees what the same key in a file gives.
 */
const LITERAL_FLAG: z.ZodType = z.unknown();

function literalOf(text: string, key: string, where: string): unknown {
  if (/^(true|false)$/.test(text)) return text === 'true';
  if (text.trim() !== '' && Number.isFinite(Number(text))) return Number(text);
  if (/^\s*[[{"]/.test(text)) return parseJson(text, key, where);
  return text;
}

function coerceScalar(field: z.ZodType, text: string, key: string, where: string): unknown {
  if (field === LITERAL_FLAG) return literalOf(text, key, where);
  const info = inspect(field);
  switch (info.kind) {
    case 'number':
    case 'int': {
      const n = Number(text);
      if (text.trim() === '' || Number.isNaN(n))
        throw new ConfigError(`${key} (${where}): expected a number, got '${text}'`);
      return n;
    }
    case 'boolean': {
      const t = text.toLowerCase();
      if (['true', '1', 'yes', 'on'].includes(t)) return true;
      if (['false', '0', 'no', 'off'].includes(t)) return false;
      throw new ConfigError(`${key} (${where}): expected true or false, got '${text}'`);
    }
    case 'string':
    case 'enum':
    case 'literal':
      return text;
    case 'array':
    case 'tuple':
      return coerceList(field, [text], key, where);
    default:
      // Objects, records, unions, unknown: JSON, or the plain string when it is not JSON.
      if (/^\s*[[{"]/.test(text) || ['object', 'record'].includes(info.kind)) return parseJson(text, key, where);
      return text;
  }
}

/** A list from `--xs 1 2 3`, `--xs 1,2,3` or `--xs '[1, 2, 3]'`. */
function coerceList(field: z.ZodType, texts: string[], key: string, where: string): unknown[] {
  if (texts.length === 1 && /^\s*\[/.test(texts[0])) {
    const v = parseJson(texts[0], key, where);
    if (!Array.isArray(v)) throw new ConfigError(`${key} (${where}): expected a list, got '${texts[0]}'`);
    return v;
  }
  const info = inspect(field);
  const element =
    info.kind === 'tuple'
      ? (info.core as unknown as { _zod: { def: { items: z.ZodType[] } } })._zod.def.items[0]
      : arrayElement(field)!;
  const parts =
    texts.length === 1
      ? texts[0]
          .split(',')
          .map((s) => s.trim())
          .filter((s) => s !== '')
      : texts;
  return parts.map((p) => coerceScalar(element, p, key, where));
}

// ---------------------------------------------------------------------------------------------
// Sources

/** Far above any real config; a larger file (or `@ /dev/zero`) is a wrong path, refused before it is read. */
export const MAX_CONFIG_FILE_BYTES = 16 << 20;

/** A config file: TOML, or JSON when it ends in .json. */
function readConfigFile(file: string, cwd: string): Raw {
  const tree = parseConfigFile(file, cwd);
  checkDepth(tree, `config file ${file}`);
  return tree;
}

function parseConfigFile(file: string, cwd: string): Raw {
  const full = path.resolve(cwd, file);
  let text: string;
  try {
    text = readBoundedText(full, MAX_CONFIG_FILE_BYTES);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new ConfigError(
      code === 'ENOENT'
        ? `config file not found: ${file}`
        : e instanceof FileRefused
          ? `config file ${e.message}`
          : `cannot read config file ${file}: ${(e as Error).message}`,
    );
  }
  if (file.endsWith('.json')) {
    // JSON files (e.g. a config written by --dry-run FILE) compose like TOML files.
    try {
      const parsed: unknown = JSON.parse(text);
      if (!isPlainObject(parsed)) throw new Error('the top level must be an object');
      return parsed;
    } catch (e) {
      throw new ConfigError(`JSON error in ${file}: ${(e as Error).message}`);
    }
  }
  try {
    return parseToml(text) as Raw;
  } catch (e) {
    if (e instanceof TomlError) {
      const first = e.message.split('\n')[0];
      throw new ConfigError(`TOML syntax error in ${file} at line ${e.line}, column ${e.column}: ${first}`);
    }
    throw e;
  }
}

/** Checks every key of a file's table against the schema, so a typo names its file. */
function checkKeys(tree: Raw, schema: z.ZodType, scope: string[], where: string): void {
  for (const [k, v] of Object.entries(tree)) {
    const p = [...scope, k];
    const field = fieldAt(schema, p);
    if (!field) throw unknownKeyError(p.join('.'), schema, where);
    if (isPlainObject(v) && objectShape(field)) checkKeys(v, schema, p, where);
  }
}

/**
 * `PRIME_TRAINER__OPTIM__LR=1e-5` sets trainer.optim.lr. A variable whose first segment is not a
 * key of this command is left to the command it is for (`otherSchemas`: a launcher's workers
 * inherit its environment), once one of them could take it; a `PRIME_` variable no command can
 * take (no such key, or a value that does not parse) is an error naming it, as are the framework's
 * own variables apart (variables.ts).
 */
function fromEnv(env: NodeJS.ProcessEnv, schema: z.ZodType, origins: Origins, otherSchemas: readonly z.ZodType[]): Raw {
  const out: Raw = {};
  for (const [name, value] of Object.entries(env)) {
    if (!name.startsWith('PRIME_') || value === undefined || isFrameworkVariable(name)) continue;
    const keys = name.slice('PRIME_'.length).toLowerCase().split('__').map(normaliseKey);
    const where = `environment variable ${name}`;
    const key = keys.join('.');
    /** The value for `s`, or the error that says why `s` cannot take it. */
    const take = (s: z.ZodType): unknown => {
      const field = fieldAt(s, keys);
      if (!field) throw unknownKeyError(key, s, where);
      return coerceScalar(field, value, key, where);
    };
    if (fieldAt(schema, keys.slice(0, 1))) {
      setPath(out, keys, take(schema));
      origins.set(key, where);
      continue;
    }
    const owners = otherSchemas.filter((s) => fieldAt(s, keys.slice(0, 1)));
    if (owners.length === 0)
      throw new ConfigError(
        `${where}: no command has a config key '${keys[0]}' (PRIME_<KEY>__<SUB>=value sets key.sub; PRIME_ is the config's prefix, so name other variables, such as one an api_key_var names, without it)`,
      );
    const errors: unknown[] = [];
    for (const s of owners) {
      try {
        take(s);
      } catch (e) {
        errors.push(e);
      }
    }
    // For another command, which could not take it either: it would fail there.
    if (errors.length === owners.length) throw errors[0];
  }
  return out;
}

interface ParsedArgs {
  files: { file: string; scope: string[] }[];
  assignments: { keys: string[]; value: unknown; flag: string }[];
  dryRun: boolean;
  dryRunFile?: string;
}

/** Splits argv into `@ file` references, `--key value` assignments and `--dry-run`. */
function parseArgs(argv: string[], schema: z.ZodType, aliases: readonly Alias[] = []): ParsedArgs {
  const out: ParsedArgs = { files: [], assignments: [], dryRun: false };
  const isOption = (t: string | undefined) => t !== undefined && t.startsWith('--');
  let i = 0;
  const takeFile = (scope: string[]) => {
    const t = argv[i];
    if (t === '@') {
      const file = argv[i + 1];
      if (file === undefined || isOption(file)) throw new ConfigError(`'@' must be followed by a TOML file path`);
      out.files.push({ file, scope });
      i += 2;
    } else {
      out.files.push({ file: t.slice(1), scope });
      i += 1;
    }
  };
  while (i < argv.length) {
    const tok = argv[i];
    if (tok.startsWith('@')) {
      takeFile([]);
      continue;
    }
    if (!isOption(tok))
      throw new ConfigError(`unexpected argument '${tok}': options look like --key value, files like @ path.toml`);
    let name = tok.slice(2);
    let inline: string | undefined;
    const eq = name.indexOf('=');
    if (eq >= 0) {
      inline = name.slice(eq + 1);
      name = name.slice(0, eq);
    }
    if (name === 'dry-run' || name === 'dry_run') {
      out.dryRun = true;
      i += 1;
      const next =
        inline ?? (argv[i] !== undefined && !isOption(argv[i]) && !argv[i].startsWith('@') ? argv[i++] : undefined);
      if (next !== undefined) out.dryRunFile = next;
      continue;
    }
    let keys = name.split('.').map(normaliseKey);
    let field = fieldAt(schema, keys);
    // A documented key (`--learning-rate`, `--lora.r`, `--model PATH`): the value is coerced by
    // the field it maps to; the key is kept, and mapped with the other flags in loadConfig.
    const alias = findAlias(aliases, keys.join('.'));
    const next = inline ?? argv[i + 1];
    if (alias && (!alias.alias.onlyString || (next !== undefined && !/^\s*[{@]/.test(next)))) {
      // A key with nothing of ours to set (or refused) takes JSON or a plain string.
      field = alias.alias.onlyString
        ? z.string()
        : (alias.to !== null && !alias.alias.convert && fieldAt(schema, alias.to.split('.'))) ||
          (alias.alias.refuse || alias.alias.convert ? z.unknown() : LITERAL_FLAG);
    }
    let negated = false;
    if (!field) {
      // --no-a.b and --a.no-b both negate the boolean a.b.
      const last = keys.length - 1;
      const candidates = [
        keys[0].startsWith('no_') ? [keys[0].slice(3), ...keys.slice(1)] : undefined,
        keys[last].startsWith('no_') ? [...keys.slice(0, last), keys[last].slice(3)] : undefined,
      ];
      for (const positive of candidates) {
        const f = positive && fieldAt(schema, positive);
        if (positive && f && inspect(f).kind === 'boolean') {
          keys = positive;
          field = f;
          negated = true;
          break;
        }
      }
    }
    const flag = `--${name}`;
    if (!field) throw unknownKeyError(keys.join('.'), schema, `from ${flag}`);
    const key = keys.join('.');
    const where = `from ${flag}`;
    i += 1;
    if (negated) {
      if (inline !== undefined) throw new ConfigError(`${flag} takes no value`);
      out.assignments.push({ keys, value: false, flag });
      continue;
    }
    const info = inspect(field);
    if (inline === undefined && (argv[i] === '@' || argv[i]?.startsWith('@'))) {
      if (!objectShape(field))
        throw new ConfigError(`${flag} @ file: '${key}' is not a section, so a file cannot be scoped to it`);
      takeFile(keys);
      continue;
    }
    if (info.kind === 'boolean') {
      const next = inline ?? argv[i];
      if (next !== undefined && /^(true|false|1|0|yes|no|on|off)$/i.test(next)) {
        if (inline === undefined) i += 1;
        out.assignments.push({ keys, value: coerceScalar(field, next, key, where), flag });
      } else {
        if (inline !== undefined) throw new ConfigError(`${flag}: expected true or false, got '${inline}'`);
        out.assignments.push({ keys, value: true, flag });
      }
      continue;
    }
    const values: string[] = [];
    if (inline !== undefined) values.push(inline);
    else {
      const many = info.kind === 'array' && !objectShape(arrayElement(field)!);
      while (i < argv.length && !isOption(argv[i]) && !argv[i].startsWith('@')) {
        values.push(argv[i++]);
        if (!many) break;
      }
    }
    if (values.length === 0) throw new ConfigError(`${flag} needs a value (${typeName(field)})`);
    const value =
      info.kind === 'array' || info.kind === 'tuple'
        ? coerceList(field, values, key, where)
        : coerceScalar(field, values[0], key, where);
    out.assignments.push({ keys, value, flag });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Shared keys: one value for trainer, orchestrator and inference.

function propagateShared(raw: Raw, schema: z.ZodType, shared: SharedKeys, origins: Origins): void {
  for (const key of shared.keys) {
    const keys = key.split('.');
    // An optional section that was not given stays absent (worker: no inference section for cpu).
    const sections = shared.sections.filter(
      (s) => getPath(raw, [s]) !== undefined || !inspect(fieldAt(schema, [s])!).optional,
    );
    let places = [keys, ...sections.map((s) => [s, ...keys])].filter((p) => fieldAt(schema, p));
    const wider = places.filter((p) => shared.atLeast?.[key]?.includes(p[0]) && getPath(raw, p) !== undefined);
    const others = places.filter((p) => !wider.includes(p) && getPath(raw, p) !== undefined);
    if (wider.length > 0 && others.length > 0) {
      // Checked against the others' value below; then the section keeps its own.
      const base = getPath(raw, others[0]) as number;
      for (const p of wider) {
        const v = getPath(raw, p) as number;
        if (v < base)
          throw new ConfigError(
            `${p.join('.')} = ${v} (${origins.get(p.join('.')) ?? 'default'}) is below ${key} = ${base}: the server must hold the run's sequences; raise it or leave it unset`,
          );
      }
      places = places.filter((p) => !wider.includes(p));
    }
    const explicit = places
      .map((p) => ({ key: p.join('.'), value: getPath(raw, p) }))
      .filter((e) => e.value !== undefined);
    const distinct = [...new Set(explicit.map((e) => JSON.stringify(e.value)))];
    if (distinct.length > 1) {
      const list = explicit
        .map((e) => `${e.key} = ${JSON.stringify(e.value)} (${origins.get(e.key) ?? 'default'})`)
        .join(', ');
      throw new ConfigError(`conflicting values for the shared key '${key}': ${list}. Set it once, at '${key}'.`);
    }
    if (explicit.length === 0) {
      const info = inspect(fieldAt(schema, keys)!);
      if (!info.hasDefault && !info.optional) continue;
      if (!info.hasDefault) {
        // Optional at the top but maybe required in a section (model.name): name the top-level key.
        const required = places.slice(1).some((p) => {
          const f = inspect(fieldAt(schema, p)!);
          return !f.hasDefault && !f.optional;
        });
        if (required) throw new ConfigError(`missing required key '${key}' (it fills ${shared.sections.join(', ')})`);
        continue;
      }
      for (const p of places) setPath(raw, p, info.default);
      continue;
    }
    for (const p of places) setPath(raw, p, explicit[0].value);
  }
}

// ---------------------------------------------------------------------------------------------

function formatIssues(error: z.ZodError, origins: Origins, schema: z.ZodType): string {
  const lines = error.issues.map((issue) => {
    const key = issue.path.join('.');
    if (issue.code === 'unrecognized_keys') {
      return issue.keys
        .map((k) => {
          const full = key ? `${key}.${k}` : k;
          return `unknown config key '${full}'.${didYouMean(full, allPaths(schema))}`;
        })
        .join('\n');
    }
    // A list's entries are leaves of their file: its origin is the list's (the nearest recorded key).
    let origin: string | undefined;
    for (let n = issue.path.length; n > 0 && origin === undefined; n--)
      origin = origins.get(issue.path.slice(0, n).join('.'));
    const shown = issue.path
      .map((p, i) => (typeof p === 'number' ? `[${p}]` : `${i > 0 ? '.' : ''}${String(p)}`))
      .join('');
    const message =
      issue.code === 'invalid_type' && issue.message.includes('received undefined') ? 'required' : issue.message;
    return `${shown || '(config)'}: ${message}${origin ? ` (${origin})` : ''}`;
  });
  return `invalid configuration:\n  ${lines.join('\n  ')}`;
}

/** Resolves a command's configuration from argv, files and environment. Throws ConfigError. */
export function loadConfig<S extends z.ZodType>(opts: LoadOptions<S>): Loaded<z.output<S>> {
  const { schema, argv, env = process.env, cwd = process.cwd() } = opts;
  const origins: Origins = new Map();
  const aliases = opts.aliases ?? [];
  const args = parseArgs(argv, schema, aliases);
  const mapped: Mapped[] = [];

  let raw = fromEnv(env, schema, origins, opts.otherSchemas ?? []);
  for (const { file, scope } of args.files) {
    // A file scoped to a section (`--trainer @ t.toml`) is that section's table: its keys of
    // another spelling map as the section's (prime-rl's per-process files).
    const tree: Raw = {};
    if (scope.length) setPath(tree, scope, readConfigFile(file, cwd));
    else Object.assign(tree, readConfigFile(file, cwd));
    const where = `in ${file}`;
    mapped.push(...applyAliases(tree, aliases, where));
    checkKeys(tree, schema, [], where);
    recordOrigins(tree, where, origins);
    raw = deepMerge(raw, tree);
  }
  // The command line is one source: a documented flag and ours for the same key conflict.
  const cli: Raw = {};
  for (const { keys, value, flag } of args.assignments) {
    const one: Raw = {};
    setPath(one, keys, value);
    Object.assign(cli, deepMerge(cli, one));
    origins.set(keys.join('.'), `from ${flag}`);
  }
  for (const m of applyAliases(cli, aliases, 'on the command line')) {
    mapped.push(m);
    if (m.to !== null) origins.set(m.to, origins.get(m.from) ?? m.where);
  }
  raw = deepMerge(raw, cli);
  if (opts.shared) propagateShared(raw, schema, opts.shared, origins);

  const result = schema.safeParse(raw);
  if (!result.success) throw new ConfigError(formatIssues(result.error, origins, schema));
  return { config: result.data, mapped, dryRun: args.dryRun, dryRunFile: args.dryRunFile };
}
