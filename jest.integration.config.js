/** Jest's integration project: test/integration, against a real stack started once by test/global-setup.ts. */
module.exports = {
  displayName: 'integration',
  testEnvironment: 'node',
  rootDir: __dirname,
  roots: ['<rootDir>/test/integration'],
  testMatch: ['**/*.test.ts'],
  transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }] },
  globalSetup: '<rootDir>/test/global-setup.ts',
  setupFiles: ['<rootDir>/test/worker-env.js'],
  globalTeardown: '<rootDir>/test/global-teardown.ts',
};
