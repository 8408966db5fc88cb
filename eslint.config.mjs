// ESLint (flat config): promise handling, and the layer rules of the code base.
//   native/      the engine's TS facade: imports nothing of the code base above it
//   lib/         the library: never imports activities/, workflows/ or workers/ (not even types)
//   activities/  Temporal activities over lib/: never imports workflows/ or workers/
//   workflows/   deterministic workflow code: no Node built-ins, activities by type only
//   workers/     process entry points (worker.ts, cli.ts): may import anything
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

const LIB = 'lib/ is the library: it never imports activities/, workflows/ or workers/ (move the code, or pass it in)';
const ACTIVITIES = 'activities/ never imports workflows/ or workers/';
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
