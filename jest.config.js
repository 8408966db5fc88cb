/** Tests run the TypeScript sources directly (swc strips types; `tsc` type-checks in the build). */
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/test'],
  testMatch: ['**/*.test.ts'],
  transform: { '^.+\\.ts$': ['@swc/jest', { jsc: { target: 'es2022' } }] },
  testTimeout: 120000,
  // OPENBLAS_CORETYPE in the real environment, before any test loads the addon (test/setup/blas.ts).
  globalSetup: '<rootDir>/test/setup/blas.ts',
  // Native compute and Temporal dev servers are heavy on a 2-core machine: one test file at a time.
  maxWorkers: 1,
};
