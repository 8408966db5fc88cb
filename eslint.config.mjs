// ESLint (flat config): promise handling, and the layer rules of the code base.
//   native/      the engine's TS facade: imports nothing of the code base above it
//   lib/         the library: never imports activities/, workflows/ or workers/ (not even types);
//                inside it, layers from its base files and config up to the CLI, each importing only
//                the layers below its own (LIB_LAYERS)
//   activities/  Temporal activities over lib/: never imports workflows/ or workers/, nor another
//                activity (shared code lives in lib/; activities/types.ts, the boundary's types, by type)
//   workflows/   deterministic workflow code: no Node built-ins, activities by type only
//   workers/     process entry points (worker.ts, cli.ts): may import anything
// Everywhere: no two files import each other, directly or around a circle, type imports included
// (imports/no-cycle, scripts/eslint/import-cycles.mjs).
import { existsSync, readdirSync } from 'node:fs';
import { builtinModules } from 'node:module';
import globals from 'globals';
import tseslint from 'typescript-eslint';
import importCycles from './scripts/eslint/import-cycles.mjs';

/** An import path (relative) into one of the top-level folders `dirs`. */
const into = (...dirs) => `^(\\.\\.?/)+(${dirs.join('|')})(/|$)`;

/**
 * Dynamic `import()` and `require()` of such a path: no-restricted-imports sees static imports
 * only. (A selector's regex may not contain `/`: it is written \x2F.)
 */
const dynamicInto = (message, ...dirs) => {
  const re = into(...dirs).replaceAll('/', '\\x2F');
  return [
    { selector: `ImportExpression[source.value=/${re}/]`, message },
    { selector: `CallExpression[callee.name='require'][arguments.0.value=/${re}/]`, message },
  ];
};

/**
 * lib/config/schemas/: one file per config section, lowest layer first. A file imports only files
 * of the layers below its own (so no cycle), and nothing in the folder imports index.ts, the
 * public face that re-exports the commands' schemas.
 */
const SCHEMA_LAYERS = [
  ['common', 'engine-options'],
  [
    'model',
    'temporal',
    'ckpt',
    'envs',
    'sampling',
    'lora',
    'optim',
    'loss',
    'wandb',
    'distill',
    'concurrency',
    'weights',
    'slurm',
  ],
  ['dist', 'inference', 'algorithm'],
  ['trainer', 'orchestrator', 'eval'],
  ['rl', 'sft', 'worker', 'model-tools', 'report'],
];
// A file missing from the layers would escape the rule: name it here.
const unlayered = readdirSync(new URL('lib/config/schemas/', import.meta.url))
  .filter((f) => f.endsWith('.ts') && f !== 'index.ts' && !SCHEMA_LAYERS.flat().includes(f.slice(0, -3)))
  .join(', ');
if (unlayered) throw new Error(`eslint.config.mjs: add lib/config/schemas/ ${unlayered} to SCHEMA_LAYERS`);
/** The files of layer i: the core rule, not typescript-eslint's (set for lib/ below), so both apply. */
const schemaLayer = (layer, i) => ({
  files: layer.map((name) => `lib/config/schemas/${name}.ts`),
  rules: {
    'no-restricted-imports': [
      'error',
      {
        patterns: [
          {
            regex: `^\\./(${SCHEMA_LAYERS.slice(i).flat().join('|')}|index)$|^\\.$|^\\.\\./schemas(/|$)`,
            message:
              'lib/config/schemas/: a file imports only the layers below its own (SCHEMA_LAYERS in eslint.config.mjs), never index.ts',
          },
        ],
      },
    ],
  },
});

/** An import path (relative) from inside a folder of lib/ into one of lib/'s folders or root files `names`. */
const intoLib = (...names) => `^(\\.\\./)+(lib/)?(${names.join('|')})(/|$)`;
/** The same from a file of lib/'s root. */
const fromLibRoot = (...names) => `^\\./(${names.join('|')})(/|$)`;

const LIB = 'lib/ is the library: it never imports activities/, workflows/ or workers/ (move the code, or pass it in)';
const ACTIVITIES = 'activities/ never imports workflows/ or workers/';
const ACTIVITY_SIBLINGS =
  'an activity never imports another activity: what two share belongs in lib/ (the run folder formats in lib/runfolder/)';

/**
 * The layers inside lib/, lowest first, each a list of lib/'s folders (and root files): a member
 * imports only the layers below its own, never another member of its own layer, so no import runs
 * up or sideways. At the bottom, the files of lib/'s root that no layer names (failures, atomic
 * writes, paths, processes; none imports a folder of lib/); then config, which names and checks
 * what the layers above implement (`lib/config/names.ts`) and imports only those files and native/.
 * lib/runfolder/ (the run folder's formats, readers and writers) is below everything that reads or
 * writes a run: the orchestrator (rollouts -> batches), the trainer (batches -> weights) and SFT
 * meet only there; lib/run-ops (whole-run operations: rewind, prune, the progress line, W&B) works
 * on the run folder beside them.
 */
const LIB_LAYERS = [
  {
    layer: ['config'],
    why: 'config is the bottom of lib/ above its base files: the domain modules implement the names it declares',
  },
  {
    layer: ['model', 'eval', 'temporal'],
    why: 'models, eval results and the Temporal connection stand on config alone',
  },
  { layer: ['envs', 'inference'], why: 'environments and the inference server stand on lib/model' },
  {
    layer: ['runfolder', 'preflight'],
    why: 'lib/runfolder/ is the data plane below the orchestrator, the trainer, SFT and lib/run-ops (move the format down, or the logic up)',
  },
  {
    layer: ['orchestrator', 'trainer', 'sft', 'run-ops'],
    why: 'the orchestrator, the trainer, SFT and lib/run-ops meet only in lib/runfolder/ (pass behaviour in, as BatchRepacker)',
  },
  { layer: ['report'], why: 'the report reads finished runs' },
  { layer: ['launch'], why: 'the launcher starts what a command needs' },
  { layer: ['cli'], why: 'the CLI is the top of lib/' },
];
/** lib/'s root files at the bottom: every root file that no layer names. */
const LIB_BASE = readdirSync(new URL('lib/', import.meta.url))
  .filter((f) => f.endsWith('.ts'))
  .map((f) => f.slice(0, -3))
  .filter((name) => !LIB_LAYERS.some(({ layer }) => layer.includes(name)));
// A folder missing from the layers would escape the rule: name it here.
const unlayeredLib = readdirSync(new URL('lib/', import.meta.url), { withFileTypes: true })
  .filter((e) => e.isDirectory() && !LIB_LAYERS.some(({ layer }) => layer.includes(e.name)))
  .map((e) => e.name)
  .join(', ');
if (unlayeredLib) throw new Error(`eslint.config.mjs: add lib/ ${unlayeredLib} to LIB_LAYERS`);
const isLibFolder = (name) => existsSync(new URL(`lib/${name}/`, import.meta.url));
/** The ESLint config of each member of lib/'s layers: what it never imports, and why. */
const libLayerRules = [
  {
    files: LIB_BASE.map((name) => `lib/${name}.ts`),
    patterns: [
      {
        regex: fromLibRoot(...LIB_LAYERS.flatMap(({ layer }) => layer)),
        message:
          "lib/'s root files are its base, below config: they import none of lib/'s layers (LIB_LAYERS in eslint.config.mjs)",
      },
    ],
  },
  ...LIB_LAYERS.flatMap(({ layer, why }, i) => {
    const above = LIB_LAYERS.slice(i).flatMap((l) => l.layer);
    return layer.map((member) => {
      const never = above.filter((m) => m !== member);
      const message = `lib/${member} imports only the layers below its own, never ${never.join(', ')} (LIB_LAYERS in eslint.config.mjs): ${why}`;
      return isLibFolder(member)
        ? { files: [`lib/${member}/**/*.ts`], patterns: [{ regex: intoLib(...never), message }] }
        : { files: [`lib/${member}.ts`], patterns: [{ regex: fromLibRoot(...never), message }] };
    });
  }),
];
const NATIVE =
  'native/ is the engine, below lib/: it never imports lib/, activities/, workflows/ or workers/ (declare the type in native/)';

export default tseslint.config(
  {
    ignores: [
      'dist/**',
      'dist.new/**',
      'dist.old/**',
      'build/**',
      'node_modules/**',
      'tools/**',
      'outputs/**',
      '.venv/**',
      'lib/report/client.js',
    ],
  },
  {
    files: ['**/*.ts'],
    languageOptions: {
      parser: tseslint.parser,
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
      globals: globals.node,
    },
    plugins: { '@typescript-eslint': tseslint.plugin, imports: importCycles },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      'imports/no-cycle': 'error',
      // A promise nobody awaits loses its error (an unhandled rejection kills the process).
      '@typescript-eslint/no-floating-promises': 'error',
      // An `any` switches type checking off; where one is needed, a disable comment says why.
      '@typescript-eslint/no-explicit-any': 'error',
      // Type-checked rules that found defects (#53): an await of a value that is no promise; numbers
      // sorted as strings (10 before 9); an object from outside written into a message as
      // "[object Object]" (lib/json.ts `textOf` writes it as JSON).
      '@typescript-eslint/await-thenable': 'error',
      '@typescript-eslint/require-array-sort-compare': ['error', { ignoreStringArrays: true }],
      '@typescript-eslint/no-base-to-string': 'error',
    },
  },
  {
    files: ['lib/**/*.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        { patterns: [{ regex: into('activities', 'workflows', 'workers'), message: LIB }] },
      ],
      'no-restricted-syntax': ['error', ...dynamicInto(LIB, 'activities', 'workflows', 'workers')],
    },
  },
  ...SCHEMA_LAYERS.map(schemaLayer),
  ...libLayerRules.map(({ files, patterns }) => ({
    files,
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        { patterns: [{ regex: into('activities', 'workflows', 'workers'), message: LIB }, ...patterns] },
      ],
    },
  })),
  {
    files: ['native/**/*.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        { patterns: [{ regex: into('lib', 'activities', 'workflows', 'workers'), message: NATIVE }] },
      ],
      'no-restricted-syntax': ['error', ...dynamicInto(NATIVE, 'lib', 'activities', 'workflows', 'workers')],
    },
  },
  {
    files: ['activities/**/*.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        { patterns: [{ regex: into('workflows', 'workers'), message: ACTIVITIES }] },
      ],
      'no-restricted-syntax': ['error', ...dynamicInto(ACTIVITIES, 'workflows', 'workers')],
    },
  },
  {
    // index.ts registers every activity (and names each pool's by type); types.ts, the boundary's data, takes summaries by type.
    files: ['activities/**/*.ts'],
    ignores: ['activities/index.ts', 'activities/types.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          patterns: [
            { regex: into('workflows', 'workers'), message: ACTIVITIES },
            { regex: '^\\./(?!types$)', message: ACTIVITY_SIBLINGS },
            { regex: '^\\./types$', allowTypeImports: true, message: 'activities/types.ts is imported by type only' },
          ],
        },
      ],
    },
  },
  {
    files: ['activities/types.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          patterns: [
            { regex: into('workflows', 'workers'), message: ACTIVITIES },
            {
              regex: '^\\./',
              allowTypeImports: true,
              message: "activities/types.ts takes the activities' summaries by type only",
            },
          ],
        },
      ],
    },
  },
  {
    files: ['workflows/**/*.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          paths: builtinModules
            .flatMap((name) => [name, `node:${name}`])
            .map((name) => ({
              name,
              message:
                'workflow code runs in the deterministic Temporal sandbox: no Node built-ins (do the I/O in an activity)',
            })),
          patterns: [
            {
              regex: into('activities'),
              allowTypeImports: true,
              message: 'workflows/ imports activities by type only (`import type`), through proxyActivities',
            },
            { regex: into('workers'), message: 'workflows/ never imports workers/' },
          ],
        },
      ],
      'no-restricted-syntax': [
        'error',
        { selector: 'ImportExpression', message: 'workflow code imports statically (the bundle is built once)' },
      ],
    },
  },
);
