/** `--help` text, generated from the zod schemas so it can never drift from what the loader accepts. */
import type { z } from 'zod';
import { arrayElement, inspect, leaves, objectShape, typeName } from './introspect';

function formatDefault(info: ReturnType<typeof inspect>): string {
  if (info.hasDefault) return JSON.stringify(info.default);
  return info.optional ? 'unset' : 'required';
}

interface Row {
  flag: string;
  type: string;
  dflt: string;
  description: string;
}

function row(flag: string, field: z.ZodType): Row {
  const info = inspect(field);
  return { flag, type: typeName(field), dflt: formatDefault(info), description: info.description ?? '' };
}

/**
 * The fields of a list's object entries (`[[env]]`, `rollout_filters`), as TOML and JSON spell
 * them, one row each under an `each entry:` line, indented by `indent`; none for other fields.
 */
function entryRows(field: z.ZodType, indent: string): Row[] {
  const element = arrayElement(field);
  if (!element || !objectShape(element)) return [];
  return [
    { flag: `${indent}each entry:`, type: '', dflt: '', description: '' },
    ...leaves(element).flatMap(({ path, schema }) => [
      row(`${indent}  ${path.join('.')}`, schema),
      ...entryRows(schema, `${indent}    `),
    ]),
  ];
}

/**
 * One line per option, `--trainer.optim.max-norm  number  1  description`, grouped under the table
 * that holds it (`[trainer.optim]`), top-level options first. A list of tables also lists the
 * fields of its entries under it.
 */
export function optionsHelp(schema: z.ZodType): string {
  const groups = new Map<string, Row[]>([['', []]]);
  for (const { path, schema: field } of leaves(schema)) {
    const table = path.slice(0, -1).join('.');
    if (!groups.has(table)) groups.set(table, []);
    groups
      .get(table)!
      .push(row(`--${path.map((p) => p.replace(/_/g, '-')).join('.')}`, field), ...entryRows(field, '    '));
  }
  const rows = [...groups.values()].flat();
  const width = (k: 'flag' | 'type', cap: number) => Math.min(cap, Math.max(...rows.map((r) => r[k].length)));
  const [wf, wt, wd] = [width('flag', 40), width('type', 24), 10];
  const lines: string[] = [];
  for (const [table, items] of groups) {
    if (items.length === 0) continue;
    lines.push('', table ? `[${table}]` : 'general:');
    for (const r of items)
      lines.push(`  ${r.flag.padEnd(wf)}  ${r.type.padEnd(wt)}  ${r.dflt.padEnd(wd)}  ${r.description}`.trimEnd());
  }
  return lines.join('\n');
}

export const SOURCES_HELP = `Configuration sources, highest precedence first:
  --key.sub value      CLI override (kebab or snake case; --flag / --no-flag; lists as a b c, a,b,c or JSON)
  @ file.toml          TOML file (several allowed, later wins; tables merge deeply)
  --section @ f.toml   TOML file scoped to one section
  PRIME_KEY__SUB=v     environment variable
  defaults             shown below
  --dry-run [FILE]     print the resolved config as JSON (and write it to FILE) and exit`;
