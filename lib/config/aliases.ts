/**
 * Keys of another spelling mapped onto ours by tables: the Python prime-rl's documented config
 * (`model = "path"`, `learning_rate`, `[lora] r`, `[sampling]`, ...; RL_ALIASES below) and the
 * config classes prime-rl uses today (`[orchestrator] group_size`, `[[orchestrator.train.source]]`,
 * `[inference.vllm]`, ...; prime-rl.ts). The loader applies a command's table to every top-level
 * config file and to CLI flags before checking keys, so such a config loads unchanged;
 * `--dry-run` lists what each key became, and `--help` prints the table. A key with no
 * equivalent here is an error naming it and why (`refuse`), never ignored.
 *
 * Two spellings of one key in the same source (`learning_rate` and `[trainer.optim] lr` in one
 * file, or both flags on one command line) are an error naming both, unless they agree. Across
 * sources the usual precedence holds (CLI > later file > earlier file > env).
 */
import { ConfigError } from '../failures';

type Raw = Record<string, unknown>;

export interface Alias {
  /** The key of the other spelling, dotted. With `table`, a table whose keys map one by one. */
  from: string;
  /** Our key (or table), dotted; null: accepted, but nothing of ours to set (see `note`). */
  to: string | null;
  /** A table: `from.k` maps to `to.k`, or to `to.<renames[k]>`. An empty table makes an empty `to`. */
  table?: boolean;
  renames?: Record<string, string>;
  /** Only when the value is a string (`model = "path"`; our `[model]` table is left alone). */
  onlyString?: boolean;
  /** Only for values it holds for (`trainer.loss.type = "default"`; our own types are ours). */
  when?(value: unknown): boolean;
  /** Why, for keys whose mapping needs a word (shown in --help and --dry-run). */
  note?: string;
  /** A value we cannot honour: the error message, or undefined when fine. `source`: the whole file. */
  check?(value: unknown, source: Raw): string | undefined;
  /** No equivalent here: the key (each key of a table) is an error giving this reason. */
  refuse?: string;
  /** A table whose presence turns a feature on (`[slurm]`): refused even empty. */
  presence?: boolean;
  /** Our keys the value becomes, when it is not simply `to` (a list of sources into [[env]] entries). */
  convert?(value: unknown, at: ConvertAt): Converted[];
}

/** `model = "name"`: a string is the model (a folder or a Hugging Face name); our `[model]` table is ours. */
export const MODEL_STRING: Alias = {
  from: 'model',
  to: 'model.name',
  onlyString: true,
  note: 'a string is the model folder or name',
};

/** prime-rl's documented keys -> our keys, for `prime-rl rl`. */
export const RL_ALIASES: readonly Alias[] = [
  MODEL_STRING,
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

/** One key of another spelling as it was applied: `learning_rate = 1e-05 -> trainer.optim.lr`. */
export interface Mapped {
  from: string;
  to: string | null;
  value: unknown;
  where: string;
  /** What the value became, when not itself (`"default"` -> `"dppo"`). */
  as?: unknown;
  note?: string;
}

/** What a converting alias makes of one value: keys of ours to set (`to` null: nothing to set). */
export interface Converted {
  /** The key of the other spelling this comes from (default: the alias's key). */
  from?: string;
  to: string | null;
  value: unknown;
  note?: string;
  /** Listed by --dry-run only (the key it describes is set by another entry). */
  display?: boolean;
  /** Set, but not listed (the entries that describe it are). */
  quiet?: boolean;
}

/** What a converting alias sees besides its value: its key, and the whole source as given. */
export interface ConvertAt {
  key: string;
  source: Raw;
  where: string;
}

const isTable = (v: unknown): v is Raw => typeof v === 'object' && v !== null && !Array.isArray(v);
const split = (k: string) => k.split('.');

export function get(tree: Raw, keys: string[] | string): unknown {
  let node: unknown = tree;
  for (const k of typeof keys === 'string' ? split(keys) : keys) {
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

/** Removes a key, and the tables that removing it left empty (they were only its path). */
function remove(tree: Raw, keys: string[]): void {
  for (let depth = keys.length; depth > 0; depth--) {
    const parent = depth === 1 ? tree : get(tree, keys.slice(0, depth - 1));
    if (!isTable(parent)) return;
    const own = parent[keys[depth - 1]];
    if (depth < keys.length && !(isTable(own) && Object.keys(own).length === 0)) return;
    delete parent[keys[depth - 1]];
  }
}

/** The alias a key (dotted, as given) falls under, with the key of ours it sets. */
export function findAlias(aliases: readonly Alias[], key: string): { alias: Alias; to: string | null } | undefined {
  for (const alias of aliases) {
    if (key === alias.from && !alias.table) return { alias, to: alias.to };
    if (alias.table && key.startsWith(`${alias.from}.`)) {
      const rest = key.slice(alias.from.length + 1);
      const [first, ...deeper] = split(rest);
      return { alias, to: alias.to === null ? null : [alias.to, alias.renames?.[first] ?? first, ...deeper].join('.') };
    }
  }
  return undefined;
}

/** Refusal of a key with no equivalent here. */
export function refusal(key: string, where: string, reason: string): ConfigError {
  return new ConfigError(`${key} (${where}) has no equivalent here: ${reason}`);
}

/**
 * Rewrites the keys of another spelling in one source's tree (a top-level config file, or the
 * CLI's assignments merged) into ours, in place. `where` names the source in errors.
 */
export function applyAliases(tree: Raw, aliases: readonly Alias[], where: string): Mapped[] {
  const source = structuredClone(tree);
  const mapped: Mapped[] = [];
  // Our key -> the key of the other spelling that set it in this source, to name both in a conflict.
  const setBy = new Map<string, string>();
  const assign = (alias: Alias, from: string, value: unknown) => {
    if (alias.refuse) throw refusal(from, where, alias.refuse);
    const problem = alias.check?.(value, source);
    if (problem) throw new ConfigError(`${from} (${where}): ${problem}`);
    const results: Converted[] = alias.convert
      ? alias.convert(value, { key: from, source, where })
      : [{ to: findAlias([alias], from)?.to ?? alias.to, value }];
    for (const r of results) {
      const key = r.from ?? from;
      const original = r.from === undefined ? value : getPathValue(source, key);
      const shown: Mapped = { from: key, to: r.to, value: original, where };
      if (JSON.stringify(r.value) !== JSON.stringify(original)) shown.as = r.value;
      const note = r.note ?? alias.note;
      if (note) shown.note = note;
      // A key already ours, kept as it is (a table moved onto itself for its renames), is no news.
      const same = key === r.to && !('as' in shown) && !note;
      if (!r.quiet && !same) mapped.push(shown);
      if (r.to === null || r.display) continue;
      const keys = split(r.to);
      const existing = get(tree, keys);
      if (existing !== undefined && JSON.stringify(existing) !== JSON.stringify(r.value)) {
        const other = setBy.get(r.to) ?? r.to;
        throw new ConfigError(
          `conflicting keys ${where}: ${key} = ${JSON.stringify(r.value)} and ${other} = ${JSON.stringify(existing)} both set ${r.to}; keep one of them`,
        );
      }
      set(tree, keys, r.value);
      setBy.set(r.to, key);
    }
  };
  for (const alias of aliases) {
    const keys = split(alias.from);
    const value = get(tree, keys);
    if (value === undefined) continue;
    if (alias.onlyString && typeof value !== 'string') continue;
    if (alias.when && !alias.when(value)) continue;
    if (alias.table) {
      if (!isTable(value)) continue; // not a table: left for the key check to report
      remove(tree, keys);
      // An empty table says "on, with the defaults" ([monitors.wandb]): ours gets one too; a refused
      // feature's ([slurm]) is refused all the same.
      if (Object.keys(value).length === 0 && alias.refuse && alias.presence)
        throw refusal(alias.from, where, alias.refuse);
      if (Object.keys(value).length === 0 && alias.to !== null && !alias.refuse) {
        mapped.push({ from: alias.from, to: alias.to, value, where, ...(alias.note ? { note: alias.note } : {}) });
        if (get(tree, alias.to) === undefined) set(tree, split(alias.to), {});
      }
      for (const [k, v] of Object.entries(value)) assign(alias, `${alias.from}.${k}`, v);
    } else {
      remove(tree, keys);
      assign(alias, alias.from, value);
    }
  }
  return mapped;
}

/** A value in a tree by a key with list indexes (`a.b[0].c`). */
function getPathValue(tree: Raw, key: string): unknown {
  let node: unknown = tree;
  for (const part of key.split('.')) {
    const m = /^([^[]+)((?:\[\d+\])*)$/.exec(part);
    if (!m) return undefined;
    node = isTable(node) ? node[m[1]] : undefined;
    for (const i of m[2].match(/\d+/g) ?? []) node = Array.isArray(node) ? node[Number(i)] : undefined;
  }
  return node;
}

/** `--help` text: the keys of the other spelling and ours. */
export function aliasesHelp(aliases: readonly Alias[]): string {
  const rows = aliases.map((a) => {
    const from = a.table ? `[${a.from}] k` : a.from;
    const renames = a.renames
      ? ` (${Object.entries(a.renames)
          .map(([k, v]) => `${k} -> ${v}`)
          .join(', ')})`
      : '';
    const to = a.refuse
      ? `refused: ${a.refuse}`
      : a.to === null
        ? '(nothing to set)'
        : a.table
          ? `${a.to}.k${renames}`
          : a.to;
    return { from, to, note: a.refuse ? '' : (a.note ?? '') };
  });
  const w = Math.max(...rows.map((r) => r.from.length));
  return rows.map((r) => `  ${r.from.padEnd(w)}  -> ${r.to}${r.note ? `: ${r.note}` : ''}`).join('\n');
}

/** `--dry-run` text (stderr): what each key of the other spelling became. */
export function describeMapped(mapped: readonly Mapped[]): string {
  return mapped
    .map(
      (m) =>
        `  ${m.from} = ${JSON.stringify(m.value)} -> ${m.to ?? '(nothing to set)'}${'as' in m ? ` = ${JSON.stringify(m.as)}` : ''} (${m.where})` +
        (m.note ? `\n      ${m.note}` : ''),
    )
    .join('\n');
}
