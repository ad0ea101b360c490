/**
 * Jest runs two projects: unit (test/unit, no stack, seconds) and integration (test/integration,
 * against a real stack started once by test/global-setup.ts, only when an integration file runs).
 * `npm test` runs the unit project first, then the integration project in two jest workers, each
 * with a stack of its own (test/global-setup.ts, test/worker-env.js).
 * `npx jest <files…>` runs the given files in whichever project holds them.
 */
module.exports = {
  projects: ['<rootDir>/jest.unit.config.js', '<rootDir>/jest.integration.config.js'],
  // Per-run options (Jest reads them from this file only, not from a project's).
  testTimeout: 60000,
  reporters: ['default', '<rootDir>/test/summary-reporter.js', '<rootDir>/test/exit-watchdog.js'],
};
