// ESLint (flat config): promise handling, and the layer rules of the code base.
//   native/      the engine's TS facade: imports nothing of the code base above it
//   lib/         the library: never imports activities/, workflows/ or workers/ (not even types);
//                inside it, lib/runfolder/ (the run folder's formats) sits below the orchestrator,
//                the trainer, SFT and lib/run, and those import each other only downward (LIB_LAYERS)
//   activities/  Temporal activities over lib/: never imports workflows/ or workers/, nor another
//                activity (shared code lives in lib/; activities/types.ts, the boundary's types, by type)
//   workflows/   deterministic workflow code: no Node built-ins, activities by type only
//   workers/     process entry points (worker.ts, cli.ts): may import anything
import { readdirSync } from 'node:fs';
import { builtinModules } from 'node:module';
import globals from 'globals';
import tseslint from 'typescript-eslint';

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
  ['common'],
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

/** An import path (relative) from inside lib/ into one of lib/'s folders `dirs`. */
const intoLib = (...dirs) => `^(\\.\\./)+(lib/)?(${dirs.join('|')})(/|$)`;

const LIB = 'lib/ is the library: it never imports activities/, workflows/ or workers/ (move the code, or pass it in)';
const ACTIVITIES = 'activities/ never imports workflows/ or workers/';
const ACTIVITY_SIBLINGS =
  'an activity never imports another activity: what two share belongs in lib/ (the run folder formats in lib/runfolder/)';

/**
 * The layers inside lib/, each folder with the folders it never imports. lib/runfolder/ (the run
 * folder's formats, readers and writers) is below everything that reads or writes a run; the
 * orchestrator (rollouts -> batches), the trainer (batches -> weights) and SFT meet only there;
 * lib/run (whole-run operations: rewind, prune, the progress line, W&B) may use the trainer, never
 * the other way round.
 */
const LIB_LAYERS = [
  {
    folder: 'runfolder',
    never: ['orchestrator', 'trainer', 'sft', 'run', 'eval', 'inference', 'launch', 'cli', 'report', 'temporal'],
    message:
      'lib/runfolder/ is the data plane below the orchestrator, trainer, SFT and lib/run: it imports none of them (move the format down, or the logic up)',
  },
  {
    folder: 'trainer',
    never: ['orchestrator', 'sft', 'run', 'launch', 'cli'],
    message:
      'lib/trainer/ reads its input through lib/runfolder/: it never imports the orchestrator, SFT, lib/run or the launcher (pass behaviour in, as BatchRepacker)',
  },
  {
    folder: 'sft',
    never: ['orchestrator', 'trainer', 'run', 'launch', 'cli'],
    message:
      'lib/sft/ writes batches through lib/runfolder/: it never imports the orchestrator, the trainer, lib/run or the launcher',
  },
  {
    folder: 'orchestrator',
    never: ['trainer', 'sft', 'run', 'launch', 'cli'],
    message:
      'lib/orchestrator/ meets the trainer and SFT only in lib/runfolder/: it never imports them, lib/run or the launcher',
  },
  {
    folder: 'run',
    never: ['orchestrator', 'launch', 'cli'],
    message:
      'lib/run/ works on whole run folders through lib/runfolder/: it never imports the orchestrator or the launcher',
  },
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
    plugins: { '@typescript-eslint': tseslint.plugin },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
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
  ...LIB_LAYERS.map(({ folder, never, message }) => ({
    files: [`lib/${folder}/**/*.ts`],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          patterns: [
            { regex: into('activities', 'workflows', 'workers'), message: LIB },
            { regex: intoLib(...never), message },
          ],
        },
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
    // index.ts registers every activity; types.ts (the workflow/activity boundary) names them by type.
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
              message: 'activities/types.ts names the activities by type only',
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
