/** `--help` (lib/config/help.ts): every option with its type, default and description, and the fields of list-of-table entries. */
import { z } from 'zod';
import { optionsHelp } from '../../lib/config/help';
import { arrayElement, inspect, leaves, objectShape, typeName } from '../../lib/config/introspect';
import * as schemas from '../../lib/config/schemas';

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

test('a list of tables lists the fields of its entries: name, type, default, description', () => {
  const schema = z.strictObject({
    items: z
      .array(
        z.strictObject({
          id: z.string().describe('the id'),
          weight: z.number().default(1).describe('its weight'),
          inner: z.strictObject({ on: z.boolean().optional().describe('a flag') }).prefault({}),
        }),
      )
      .default([])
      .describe('the items'),
    n: z.number().default(2).describe('a number'),
  });
  const lines = optionsHelp(schema).split('\n');
  const at = lines.findIndex((l) => l.startsWith('  --items '));
  expect(lines[at]).toMatch(/^ {2}--items\s+list\[json\]\s+\[\]\s+the items$/);
  const patterns = [
    /^ {6}each entry:$/,
    /^ {8}id\s+string\s+required\s+the id$/,
    /^ {8}weight\s+number\s+1\s+its weight$/,
    /^ {8}inner\.on\s+boolean\s+unset\s+a flag$/,
    /^ {2}--n\s+number\s+2\s+a number$/,
  ];
  patterns.forEach((p, i) => expect(lines[at + 1 + i]).toMatch(p));
});

test.each([
  ['rl', schemas.rlSchema],
  ['eval', schemas.evalSchema],
])('%s: every list of tables shows each field of its entries under its option', (_, schema) => {
  const help = optionsHelp(schema);
  let lists = 0;
  for (const { path, schema: field } of leaves(schema)) {
    const element = arrayElement(field);
    if (!element || !objectShape(element)) continue;
    lists++;
    const flag = `--${path.map((p) => p.replace(/_/g, '-')).join('.')}`;
    // From the option's line to the next option or table.
    const from = help.indexOf(`\n  ${flag} `) + 1;
    const block = help.slice(from, help.slice(from + 1).search(/\n {2}(--|\S)|\n\n/) + from + 1);
    for (const entry of leaves(element)) {
      const info = inspect(entry.schema);
      expect(block).toMatch(
        new RegExp(
          `\\n {8}${escape(entry.path.join('.'))}\\s+${escape(typeName(entry.schema))}\\s+\\S+\\s+${escape(info.description ?? '')}`,
        ),
      );
    }
  }
  expect(lists).toBeGreaterThan(0);
});

test("rl --help: [[env]]'s entries, rollout_filters' import_path and kwargs, and advantage's plugin keys", () => {
  const help = optionsHelp(schemas.rlSchema);
  expect(help).toMatch(
    /--env\s+list\[json\]\s+\[\]\s+training environments.*\n {6}each entry:\n {8}id\s+string\s+required\s+environment id.*\n {8}args\s+json\s+\{\}\s+arguments passed to the environment loader\n {8}weight\s+number\s+1\s+sampling weight/,
  );
  expect(help).toMatch(
    /--orchestrator\.rollout-filters\s+list\[json\]\s+\[\]\s+plugin filters.*\n {6}each entry:\n {8}import_path\s+string\s+required\s+rollout filter module: .*\n {8}kwargs\s+json\s+\{\}\s+keyword arguments passed to the rollout filter\n/,
  );
  expect(help).toMatch(
    /\[orchestrator\.advantage\]\n(.*\n)*? {2}--orchestrator\.advantage\.import-path\s+string\s+unset\s+plugin estimator module/,
  );
  expect(help).toMatch(
    / {2}--orchestrator\.advantage\.kwargs\s+json\s+\{\}\s+keyword arguments passed to the plugin estimator/,
  );
});
