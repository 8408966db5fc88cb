/**
 * Tests run the TypeScript sources directly (swc strips types; `tsc` type-checks in the build).
 *
 * Tiers by cost; `npm test` runs them all, each file once:
 * - test/unit/ (`npm run test:unit`, under a minute): no native engine, no Temporal dev server, no
 *   HTTP server, no CLI or worker processes. Its workflow tests run on Temporal's time-skipping
 *   test server (test/unit/mock-run.ts), the one server this tier starts.
 * - test/*.test.ts: the real engine, Temporal dev servers, inference servers, processes.
 * - test/gpu/: CUDA checks, skipped where the addon sees no CUDA device.
 * A new test that needs none of those goes in test/unit/. Set-up shared between files (temp
 * folders, tiny models, configs, stacks, processes) lives in test/support/.
 */
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/test'],
  testMatch: ['**/*.test.ts'],
  transform: {
    '^.+\\.ts$': ['@swc/jest', { jsc: { target: 'es2022' } }],
    // The parquet packages are ES modules, which jest's module registry loads only as CommonJS.
    '/node_modules/(hyparquet[^/]*|hysnappy)/.+\\.js$': [
      '@swc/jest',
      { jsc: { target: 'es2022' }, module: { type: 'commonjs' } },
    ],
  },
  transformIgnorePatterns: ['/node_modules/(?!(hyparquet|hysnappy))'],
  testTimeout: 120000,
  // OPENBLAS_CORETYPE in the real environment, before any test loads the addon (test/setup/blas.ts).
  globalSetup: '<rootDir>/test/setup/blas.ts',
  // Native compute and Temporal dev servers are heavy on a 2-core machine: one test file at a time.
  maxWorkers: 1,
};
