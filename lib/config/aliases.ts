/**
 * The keys of the Python prime-rl's documented config (`model = "path"`, `learning_rate`,
 * `[lora] r`, `[sampling]`, ...), mapped onto ours by one table. The loader applies it to every
 * top-level config file and to CLI flags before checking keys, so such a config loads unchanged;
 * `--dry-run` lists what each documented key became, and `--help` prints the table.
 *
 * Two spellings of one key in the same source (`learning_rate` and `[trainer.optim] lr` in one
 * file, or both flags on one command line) are an error naming both, unless they agree. Across
 * sources the usual precedence holds (CLI > later file > earlier file > env).
 */
import { ConfigError } from './errors';

type Raw = Record<string, unknown>;

export interface Alias {
  /** The documented key, dotted. With `table`, a table whose keys map one by one. */
  from: string;
  /** Our key (or table), dotted; null: accepted, but nothing of ours to set (see `note`). */
  to: string | null;
  /** A table: `from.k` maps to `to.k`, or to `to.<renames[k]>`. */
  table?: boolean;
  renames?: Record<string, string>;
  /** Only when the value is a string (`model = "path"`; our `[model]` table is left alone). */
  onlyString?: boolean;
  /** Why, for keys whose mapping needs a word (shown in --help and --dry-run). */
  note?: string;
  /** A value we cannot honour: the error message, or undefined when fine. */
  check?(value: unknown): string | undefined;
}

/** prime-rl's documented keys -> our keys, for `prime-rl rl`. */
export const RL_ALIASES: readonly Alias[] = [
  { from: 'model', to: 'model.name', onlyString: true, note: 'a string is the model folder' },
  { from: 'batch_size', to: 'orchestrator.batch_size' },
  { from: 'rollouts_per_example', to: 'orchestrator.rollouts_per_example' },
  { from: 'learning_rate', to: 'trainer.optim.lr' },
  { from: 'warmup_steps', to: 'trainer.scheduler.warmup_steps' },
  {
    from: 'gradient_accumulation_steps',
    to: null,
    note: "our trainer already accumulates the gradients of a step's packed rows (one forward/backward each, seq_len tokens) into one optimizer step; the value does not change the update",
    check: (v) =>
      Number.isInteger(v) && (v as number) >= 1 ? undefined : `must be a positive integer, got ${JSON.stringify(v)}`,
  },
  { from: 'sampling', to: 'orchestrator.sampling', table: true },
  { from: 'lora', to: 'trainer.lora', table: true, renames: { r: 'rank' } },
  { from: 'difficulty_filter', to: 'orchestrator.difficulty_filter', table: true },
  { from: 'kl_penalty', to: 'trainer.kl_penalty', table: true },
];

/** One documented key as it was applied: `learning_rate = 1e-05 -> trainer.optim.lr`. */
export interface Mapped {
  from: string;
  to: string | null;
  value: unknown;
  where: string;
}

const isTable = (v: unknown): v is Raw => typeof v === 'object' && v !== null && !Array.isArray(v);
const split = (k: string) => k.split('.');

function get(tree: Raw, keys: string[]): unknown {
  let node: unknown = tree;
  for (const k of keys) {
    if (!isTable(node) || !(k in node)) return undefined;
    node = node[k];
  }
  return node;
}

function set(tree: Raw, keys: string[], value: unknown): void {
  let node = tree;
  for (const k of keys.slice(0, -1)) {
    if (!isTable(node[k])) node[k] = {};
    node = node[k] as Raw;
  }
  node[keys[keys.length - 1]] = value;
}

function remove(tree: Raw, keys: string[]): void {
  const parent = get(tree, keys.slice(0, -1));
  if (isTable(parent)) delete parent[keys[keys.length - 1]];
}

/** The alias a documented key (dotted, as given) falls under, with the documented key it is. */
export function findAlias(aliases: readonly Alias[], key: string): { alias: Alias; to: string | null } | undefined {
  for (const alias of aliases) {
    if (key === alias.from && !alias.table) return { alias, to: alias.to };
    if (alias.table && key.startsWith(`${alias.from}.`)) {
      const rest = key.slice(alias.from.length + 1);
      const [first, ...deeper] = split(rest);
      return { alias, to: [alias.to, alias.renames?.[first] ?? first, ...deeper].join('.') };
    }
  }
  return undefined;
}

/**
 * Rewrites the documented keys of one source's tree (a top-level config file, or the CLI's
 * assignments merged) into ours, in place. `where` names the source in errors.
 */
export function applyAliases(tree: Raw, aliases: readonly Alias[], where: string): Mapped[] {
  const mapped: Mapped[] = [];
  // Our key -> the documented key that set it in this source, to name both in a conflict.
  const setBy = new Map<string, string>();
  const assign = (from: string, to: string | null, value: unknown, alias: Alias) => {
    const problem = alias.check?.(value);
    if (problem) throw new ConfigError(`${from} (${where}): ${problem}`);
    mapped.push({ from, to, value, where });
    if (to === null) return;
    const keys = split(to);
    const existing = get(tree, keys);
    if (existing !== undefined && JSON.stringify(existing) !== JSON.stringify(value)) {
      const other = setBy.get(to) ?? to;
      throw new ConfigError(
        `conflicting keys ${where}: ${from} = ${JSON.stringify(value)} and ${other} = ${JSON.stringify(existing)} both set ${to}; keep one of them`,
      );
    }
    set(tree, keys, value);
    setBy.set(to, from);
  };
  for (const alias of aliases) {
    const keys = split(alias.from);
    const value = get(tree, keys);
    if (value === undefined) continue;
    if (alias.onlyString && typeof value !== 'string') continue;
    if (alias.table) {
      if (!isTable(value)) continue; // not a table: left for the key check to report
      remove(tree, keys);
      for (const [k, v] of Object.entries(value))
        assign(`${alias.from}.${k}`, findAlias([alias], `${alias.from}.${k}`)!.to, v, alias);
    } else {
      remove(tree, keys);
      assign(alias.from, alias.to, value, alias);
    }
  }
  return mapped;
}

/** `--help` text: the documented keys and ours. */
export function aliasesHelp(aliases: readonly Alias[]): string {
  const rows = aliases.map((a) => {
    const from = a.table ? `[${a.from}] k` : a.from;
    const renames = a.renames
      ? ` (${Object.entries(a.renames)
          .map(([k, v]) => `${k} -> ${v}`)
          .join(', ')})`
      : '';
    const to = a.to === null ? '(nothing to set)' : a.table ? `${a.to}.k${renames}` : a.to;
    return { from, to, note: a.note ?? '' };
  });
  const w = Math.max(...rows.map((r) => r.from.length));
  return rows.map((r) => `  ${r.from.padEnd(w)}  -> ${r.to}${r.note ? `: ${r.note}` : ''}`).join('\n');
}

/** `--dry-run` text (stderr): what each documented key became. */
export function describeMapped(mapped: readonly Mapped[]): string {
  return mapped
    .map((m) => `  ${m.from} = ${JSON.stringify(m.value)} -> ${m.to ?? '(nothing to set)'} (${m.where})`)
    .join('\n');
}
