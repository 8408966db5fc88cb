/**
 * SFT datasets laid out as on the Hugging Face Hub (a snapshot of `datasets--Org--Name` in the
 * local cache, or any such folder): parquet (parquet.ts) and JSON lines files. A split's files are
 * found by name as the `datasets` library finds them when a repository has no explicit
 * data_files: `data/<split>-00000-of-00001.*` (what push_to_hub writes), else a folder named by
 * the split (`train/`, `training/`, ...), else a file named by it (`train.jsonl`,
 * `my-train-0.parquet`), else every data file is `train`. Rows are prompt/completion (strings or
 * message lists) or messages, as in JSONL files (jsonl.ts).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { SftConversation } from './conversation';
import { sftRowConversation } from './jsonl';
import { readParquetRows } from './parquet';

const DATA_EXTENSIONS = ['.parquet', '.jsonl', '.json'];
/** The `datasets` library's split names and the keywords that name them in paths. */
const SPLIT_KEYWORDS: Record<string, string[]> = {
  train: ['train', 'training'],
  validation: ['validation', 'valid', 'dev', 'val'],
  test: ['test', 'testing', 'eval', 'evaluation'],
};
/** Characters that separate a keyword from the rest of a name (`datasets`' NON_WORDS_CHARS). */
const SEP = '[-._ 0-9]';

/** Every data file under `dir` (relative paths, sorted), hidden and `__` folders left out. */
function dataFiles(dir: string): string[] {
  const out: string[] = [];
  const walk = (rel: string) => {
    for (const entry of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
      if (entry.name.startsWith('.') || entry.name.startsWith('__')) continue;
      const p = rel ? `${rel}/${entry.name}` : entry.name;
      // Snapshot entries are links into the cache's blobs: follow them.
      const stat = fs.statSync(path.join(dir, p));
      if (stat.isDirectory()) walk(p);
      else if (DATA_EXTENSIONS.some((e) => entry.name.endsWith(e))) out.push(p);
    }
  };
  walk('');
  return out.sort();
}

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** The files of `split` in a dataset folder, by the `datasets` library's default patterns. */
export function splitFiles(dir: string, split: string): { files: string[]; splits: string[] } {
  const files = dataFiles(dir);
  const sharded = /^data\/([\w]+)-\d{5}-of-\d{5}[^/]*$/;
  const shardSplits = [...new Set(files.map((f) => sharded.exec(f)?.[1]).filter((s): s is string => !!s))];
  if (shardSplits.length > 0)
    return { files: files.filter((f) => sharded.exec(f)?.[1] === split), splits: shardSplits };
  const keywordRules: [string, (kw: string) => RegExp][] = [
    ['folder', (kw) => new RegExp(`(^|/)(${kw}|${kw}${SEP}[^/]*|[^/]*${SEP}${kw}|[^/]*${SEP}${kw}${SEP}[^/]*)/`)],
    ['file', (kw) => new RegExp(`(^|/)(${kw}${SEP}[^/]*|[^/]*${SEP}${kw}${SEP}[^/]*)$`)],
  ];
  for (const [, rule] of keywordRules) {
    const bySplit = Object.fromEntries(
      Object.entries(SPLIT_KEYWORDS).map(([name, keywords]) => [
        name,
        files.filter((f) => keywords.some((kw) => rule(escape(kw)).test(f))),
      ]),
    );
    const splits = Object.keys(bySplit).filter((s) => bySplit[s].length > 0);
    if (splits.length > 0) return { files: bySplit[split] ?? [], splits };
  }
  return { files: split === 'train' ? files : [], splits: files.length > 0 ? ['train'] : [] };
}

function jsonRows(file: string): unknown[] {
  const text = fs.readFileSync(file, 'utf8');
  // A .json file may hold one array of rows; otherwise (and for .jsonl) one row per line.
  if (file.endsWith('.json') && text.trimStart().startsWith('['))
    try {
      return JSON.parse(text) as unknown[];
    } catch (e) {
      throw new Error(`${file}: not valid JSON (${(e as Error).message})`);
    }
  return text
    .split('\n')
    .map((line, i) => ({ line, i }))
    .filter(({ line }) => line.trim() !== '')
    .map(({ line, i }) => {
      try {
        return JSON.parse(line) as unknown;
      } catch (e) {
        throw new Error(`${file}:${i + 1}: not valid JSON (${(e as Error).message})`);
      }
    });
}

/** Parquet structs hold every field of the column, null where a message has none: drop those (content stays). */
function withoutNullFields(row: unknown): unknown {
  if (typeof row !== 'object' || row === null) return row;
  const clean = (m: unknown) =>
    typeof m === 'object' && m !== null && !Array.isArray(m)
      ? Object.fromEntries(Object.entries(m).filter(([k, v]) => v !== null || k === 'content'))
      : m;
  return Object.fromEntries(
    Object.entries(row).map(([k, v]) => [
      k,
      Array.isArray(v) && ['prompt', 'completion', 'messages'].includes(k) ? v.map(clean) : v,
    ]),
  );
}

/**
 * The conversations of `split` of the dataset folder `dir` (`name`: how errors name it), the first
 * `limit` when set.
 */
export async function readHubDataset(
  dir: string,
  name: string,
  split: string,
  limit?: number,
): Promise<SftConversation[]> {
  const { files, splits } = splitFiles(dir, split);
  if (files.length === 0)
    throw new Error(
      splits.length === 0
        ? `dataset ${name} (${dir}) has no parquet or JSON lines files`
        : `dataset ${name} has no split '${split}' (its splits: ${splits.join(', ')})`,
    );
  const out: SftConversation[] = [];
  for (const rel of files) {
    if (limit !== undefined && out.length >= limit) break;
    const file = path.join(dir, rel);
    const rows = rel.endsWith('.parquet') ? await readParquetRows(file) : jsonRows(file);
    for (let i = 0; i < rows.length && (limit === undefined || out.length < limit); i++)
      out.push(sftRowConversation(withoutNullFields(rows[i]), `${name} ${split} ${rel} row ${i}`));
  }
  if (out.length === 0) throw new Error(`dataset ${name} split '${split}' has no rows`);
  if (limit !== undefined && out.length < limit)
    throw new Error(`dataset ${name} split '${split}' has ${out.length} rows, fewer than the ${limit} asked for`);
  return out;
}
