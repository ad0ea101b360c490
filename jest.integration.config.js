/** Jest's integration project: test/integration, against a real stack started once by test/global-setup.ts. */
module.exports = {
  displayName: 'integration',
  testEnvironment: 'node',
  rootDir: __dirname,
  roots: ['<rootDir>/test/integration'],
  testMatch: ['**/*.test.ts'],
  // Used when this file is the whole configuration (`jest -c jest.integration.config.js …`); under
  // `npm test` the root jest.config.js sets 60 s. Jest's 5 s default (made for unit tests) fails tests
  // whose real work takes longer (sandbox-host.test.ts's file race: 4.5-6.8 s).
  testTimeout: 30_000,
  transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }] },
  globalSetup: '<rootDir>/test/global-setup.ts',
  globalTeardown: '<rootDir>/test/global-teardown.ts',
};
