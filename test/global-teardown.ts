import fs from 'node:fs';
import path from 'node:path';
import { deleteNetTable } from '../scripts/launcher';
import { defaultScratchDir } from '../sandbox';
import type { TestStack } from './global-setup';

/** Where the stack's logs are kept after a run with failures (or with SAP_TEST_KEEP_LOGS=1). */
const KEPT_LOGS = path.resolve(__dirname, '..', 'test-logs');

/**
 * Stops the stacks started by global-setup, destroying their sandboxes, and removes their state. When a
 * test failed (test/summary-reporter.js says so), the stack's logs are copied to test-logs/ first:
 * a failure on CI can then be read from the API's, the host's and the worker's own lines.
 */
export default async function globalTeardown(): Promise<void> {
  const stacks = (globalThis as { __SAP_STACKS__?: TestStack[] }).__SAP_STACKS__ ?? [];
  await Promise.all(stacks.map((g, k) => stopTestStack(g, k + 1)));
}

async function stopTestStack(g: TestStack, k: number): Promise<void> {
  g.control.close();
  await g.stack.stop({ destroySandboxes: true });
  await deleteNetTable(g.ownTable);
  if (process.env.SAP_TEST_FAILED === '1' || process.env.SAP_TEST_KEEP_LOGS === '1') {
    const to = path.join(KEPT_LOGS, `${new Date().toISOString().replace(/[:.]/g, '-')}-stack${k}`);
    try {
      fs.cpSync(g.stack.logDir, to, { recursive: true });
      process.stderr.write(`\nThe test stack's logs are in ${to}\n`);
    } catch (err) {
      process.stderr.write(`\ncould not keep the test stack's logs: ${(err as Error).message}\n`);
    }
  }
  if (process.env.SAP_TEST_KEEP_DATA !== '1') {
    fs.rmSync(g.dataDir, { recursive: true, force: true });
    fs.rmSync(defaultScratchDir(g.dataDir), { recursive: true, force: true });
  }
}
