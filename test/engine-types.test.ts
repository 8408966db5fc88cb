/**
 * The engine's facts declared once (native/src/facts.h: X-macro lists beside the structs and enums
 * that cross N-API) and their TS copy: native/engine-types.generated.ts must be what the addon's
 * engineTypes() renders to, so a test fails while C++ and TS disagree. `npm run gen:engine-types`
 * (UPDATE_ENGINE_TYPES=1) rewrites it.
 */
import * as fs from 'fs';
import * as path from 'path';
import { engineTypes, type EngineFieldValue, type EngineTypes } from '../native/checks';
import { GENERATOR_DEFAULTS, PREFIX_SHARINGS } from '../native/engine-types.generated';
import { inferenceSchema } from '../lib/config/schemas';

const GENERATED = path.join(__dirname, '..', 'native', 'engine-types.generated.ts');

const literal = (v: EngineFieldValue) => (typeof v === 'string' ? `'${v}'` : String(v));

/**
 * Each enum as its value list and type; each struct as an interface (fields with a default are
 * optional: the engine fills them in) and, where it has defaults, a const of them.
 */
function render(types: EngineTypes): string {
  const head =
    "// Generated from the addon's engineTypes() (the X-macro lists of native/src: facts.h says how) by\n" +
    '// `npm run gen:engine-types`: do not edit.\n';
  const enums = types.enums.map(
    (e) =>
      `export const ${e.list} = [${e.values.map(literal).join(', ')}] as const;\n` +
      `export type ${e.type} = (typeof ${e.list})[number];\n`,
  );
  const interfaces = types.interfaces.map(({ name, defaults, fields }) => {
    const lines = fields.map((f) => {
      const doc = f.default === undefined ? f.doc : `${f.doc} Default ${literal(f.default)}.`;
      return `  /** ${doc} */\n  ${f.name}${f.default === undefined ? '' : '?'}: ${f.type};\n`;
    });
    const block = `export interface ${name} {\n${lines.join('')}}\n`;
    if (!defaults) return block;
    const values = fields.filter((f) => f.default !== undefined).map((f) => `  ${f.name}: ${literal(f.default!)},\n`);
    return `${block}\nexport const ${defaults} = {\n${values.join('')}} as const;\n`;
  });
  return [head, ...enums, ...interfaces].join('\n');
}

test('engine-types.generated.ts is what the addon declares', () => {
  const text = render(engineTypes());
  if (process.env.UPDATE_ENGINE_TYPES) fs.writeFileSync(GENERATED, text);
  // On a mismatch: npm run gen:engine-types.
  expect(fs.readFileSync(GENERATED, 'utf8')).toBe(text);
});

test('the config schemas take their values and defaults from it', () => {
  const inference = inferenceSchema.parse({ model: { name: 'm' } });
  expect(inference.block_size).toBe(GENERATOR_DEFAULTS.blockSize);
  expect(inference.max_batched_tokens).toBe(GENERATOR_DEFAULTS.maxBatchedTokens);
  expect(inference.prefix_sharing).toBe(GENERATOR_DEFAULTS.prefixSharing);
  const bad = inferenceSchema.safeParse({ model: { name: 'm' }, prefix_sharing: 'nope' });
  expect(bad.error?.issues[0]?.message).toContain(PREFIX_SHARINGS.map((v) => `"${v}"`).join('|'));
});
