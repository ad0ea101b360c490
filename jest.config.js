/** Jest runs unit tests (test/unit) and integration tests (test/integration) against a real stack
 *  started once by test/global-setup.ts. */
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/test'],
  testMatch: ['**/*.test.ts'],
  transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }] },
  globalSetup: '<rootDir>/test/global-setup.ts',
  globalTeardown: '<rootDir>/test/global-teardown.ts',
  testTimeout: 60000,
  reporters: ['default', '<rootDir>/test/summary-reporter.js', '<rootDir>/test/exit-watchdog.js'],
};
