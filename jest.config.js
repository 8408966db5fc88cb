/** Tests run the TypeScript sources directly (swc strips types; `tsc` type-checks in the build). */
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/test'],
  testMatch: ['**/*.test.ts'],
  transform: { '^.+\\.ts$': ['@swc/jest', { jsc: { target: 'es2022' } }] },
  testTimeout: 120000,
  // Native compute and Temporal dev servers are heavy on a 2-core machine: one test file at a time.
  maxWorkers: 1,
};
