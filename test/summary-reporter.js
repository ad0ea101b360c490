/**
 * Prints one plain closing line, "Tests: N passed, N failed", after jest's own summary, and tells
 * the global teardown (same process, run after this) to keep the stack's logs when anything failed.
 */
class SummaryReporter {
  onRunComplete(_contexts, results) {
    const skipped = results.numPendingTests + results.numTodoTests;
    const failed = results.numFailedTests + results.numRuntimeErrorTestSuites;
    if (failed > 0) process.env.SAP_TEST_FAILED = '1';
    process.stdout.write(`\nTests: ${results.numPassedTests} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}\n`);
  }
}
module.exports = SummaryReporter;
