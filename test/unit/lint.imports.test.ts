/**
 * The import rules of eslint.config.mjs against code that breaks them: the cycle rule
 * (scripts/eslint/import-cycles.mjs) on a small project of its own, type-only circles included, and
 * the layers inside lib/ (`LIB_LAYERS`) on this project's files with an upward import added. ESLint
 * is an ES module: it runs in a node process of its own.
 */
import { spawnSync } from 'node:child_process';
import * as path from 'node:path';
import { scratchDir } from '../support/setup';

const root = path.join(__dirname, '..', '..');

interface Finding {
  file: string;
  line: number;
  rule: string | null;
  message: string;
}

/** ESLint's findings for `lint` (the body of an async function given `ESLint` and `tseslint`), run in the repo. */
function eslint(lint: string): Finding[] {
  const script = `
    import { ESLint } from 'eslint';
    import tseslint from 'typescript-eslint';
    const results = await (async () => { ${lint} })();
    process.stdout.write(JSON.stringify(results.flatMap((r) =>
      r.messages.map((m) => ({ file: r.filePath, line: m.line, rule: m.ruleId, message: m.message })))));`;
  const run = spawnSync(process.execPath, ['--input-type=module', '-e', script], { cwd: root, encoding: 'utf8' });
  if (run.status !== 0) throw new Error(`eslint exited ${run.status}: ${run.stderr}`);
  return JSON.parse(run.stdout) as Finding[];
}

describe('no two files import each other', () => {
  const project = scratchDir('prime-cycles-');
  project.file('tsconfig.json', JSON.stringify({ compilerOptions: { strict: true }, include: ['*.ts'] }));
  // a <-> b by type only; c -> d -> e -> c around a circle; f imports a and is on no circle.
  project.file('a.ts', "import type { B } from './b';\nexport interface A { b?: B }\n");
  project.file('b.ts', "import type { A } from './a';\nexport interface B { a?: A }\n");
  project.file('c.ts', "import { d } from './d';\nexport const c = () => d;\n");
  project.file('d.ts', "export { e as d } from './e';\n");
  project.file('e.ts', "import { c } from './c';\nexport const e = () => c;\n");
  project.file('f.ts', "import type { A } from './a';\nexport const f: A = {};\n");

  test('each import that closes a circle is reported at its line, with the circle', () => {
    const findings = eslint(`
      const cycles = (await import(${JSON.stringify(path.join(root, 'scripts/eslint/import-cycles.mjs'))})).default;
      const eslint = new ESLint({
        cwd: ${JSON.stringify(project.dir)},
        overrideConfigFile: true,
        overrideConfig: [{
          files: ['**/*.ts'],
          languageOptions: { parser: tseslint.parser },
          plugins: { imports: cycles },
          rules: { 'imports/no-cycle': 'error' },
        }],
      });
      return eslint.lintFiles(['*.ts']);`);
    const found = findings.map((f) => `${path.basename(f.file)}:${f.line} ${f.message.split('. ')[0]}`).sort();
    expect(found).toEqual([
      'a.ts:1 import cycle: a.ts -> b.ts -> a.ts',
      'b.ts:1 import cycle: b.ts -> a.ts -> b.ts',
      'c.ts:1 import cycle: c.ts -> d.ts -> e.ts -> c.ts',
      'd.ts:1 import cycle: d.ts -> e.ts -> c.ts -> d.ts',
      'e.ts:1 import cycle: e.ts -> c.ts -> d.ts -> e.ts',
    ]);
    expect(findings.every((f) => f.rule === 'imports/no-cycle')).toBe(true);
  });
});

describe("lib/'s layers", () => {
  const cases: [file: string, line: string, refused: string | null][] = [
    ['lib/config/names.ts', "import type { AdvantageGroup } from '../orchestrator/advantages';", 'lib/config imports'],
    ['lib/model/arch.ts', "import type { RLConfig } from '../config/schemas';", null],
    ['lib/model/arch.ts', "import type { EnvPool } from '../envs/pool';", 'lib/model imports'],
    [
      'lib/runfolder/layout.ts',
      "import type { ClaimMix } from '../orchestrator/inflight-decisions';",
      'lib/runfolder imports',
    ],
    ['lib/trainer/spec.ts', "import type { SftMixSchedule } from '../sft/schedule';", 'lib/trainer imports'],
    ['lib/failures.ts', "import type { Arch } from './config/names';", "lib/'s root files are its base"],
    ['lib/preflight.ts', "import type { RunLayout } from './runfolder/layout';", 'lib/preflight imports'],
  ];

  test('an import of a layer above, or of a sibling, is refused with the layer rule; one below is not', () => {
    // The project's config with its import rules alone, without type information (they need none).
    const findings = eslint(`
      const fs = await import('node:fs');
      const eslint = new ESLint({
        cwd: ${JSON.stringify(root)},
        overrideConfig: [{ files: ['**/*.ts'], languageOptions: { parserOptions: { projectService: false } } }],
        ruleFilter: ({ ruleId }) => ruleId.endsWith('no-restricted-imports'),
      });
      const results = [];
      for (const [file, line] of ${JSON.stringify(cases)}) {
        const filePath = ${JSON.stringify(root)} + '/' + file;
        const [r] = await eslint.lintText(line + '\\n' + fs.readFileSync(filePath, 'utf8'), { filePath });
        results.push({ ...r, filePath: file + ' ' + line });
      }
      return results;`);
    for (const [file, line, refused] of cases) {
      const found = findings.filter((f) => f.file === `${file} ${line}`);
      if (refused === null) expect(found).toEqual([]);
      else expect(found.map((f) => [f.line, f.message.includes(refused)])).toEqual([[1, true]]);
    }
  });
});
