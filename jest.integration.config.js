/** Jest's integration project: test/integration, against a real stack started once by test/global-setup.ts. */
module.exports = {
  displayName: 'integration',
  testEnvironment: 'node',
  rootDir: __dirname,
  roots: ['<rootDir>/test/integration'],
  testMatch: ['**/*.test.ts'],
  // Every test here drives real processes on a shared machine: jest's 5 s default (made for unit tests)
  // failed a test whose work takes 4.5-5.5 s (sandbox-host.test.ts: 300 file calls racing a renaming
  // loop). A test or hook that needs longer still says so itself.
  testTimeout: 30_000,
  transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }] },
  globalSetup: '<rootDir>/test/global-setup.ts',
  globalTeardown: '<rootDir>/test/global-teardown.ts',
};
