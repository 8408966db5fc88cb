/**
 * The engine's fixed N-API fields (the X-macro lists of native/src/trainer.h) and their TS
 * interfaces: native/engine-types.generated.ts is what the addon's engineTypes() renders to.
 * `npm run gen:engine-types` (UPDATE_ENGINE_TYPES=1) rewrites it.
 */
import * as fs from 'fs';
import * as path from 'path';
import { engineTypes, type EngineFieldDecl } from '../native';

const GENERATED = path.join(__dirname, '..', 'native', 'engine-types.generated.ts');

/** One interface per list; fields with a default are optional (the engine fills them in). */
function render(types: Record<string, EngineFieldDecl[]>): string {
  const head =
    "// Generated from the addon's engineTypes() (the X-macro lists of native/src/trainer.h) by\n" +
    '// `npm run gen:engine-types`: do not edit.\n';
  const blocks = Object.entries(types).map(([name, fields]) => {
    const lines = fields.map((f) => {
      const doc = f.default === undefined ? f.doc : `${f.doc} Default ${f.default}.`;
      return `  /** ${doc} */\n  ${f.name}${f.default === undefined ? '' : '?'}: number;\n`;
    });
    return `export interface ${name} {\n${lines.join('')}}\n`;
  });
  return [head, ...blocks].join('\n');
}

test('engine-types.generated.ts is what the addon declares', () => {
  const text = render(engineTypes());
  if (process.env.UPDATE_ENGINE_TYPES) fs.writeFileSync(GENERATED, text);
  // On a mismatch: npm run gen:engine-types.
  expect(fs.readFileSync(GENERATED, 'utf8')).toBe(text);
});
