/** Jest's unit project: test/unit, no stack (no global setup), so a unit failure shows in seconds. */
module.exports = {
  displayName: 'unit',
  testEnvironment: 'node',
  rootDir: __dirname,
  roots: ['<rootDir>/test/unit'],
  testMatch: ['**/*.test.ts'],
  transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }] },
};
