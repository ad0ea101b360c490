import fs from 'node:fs';
import type http from 'node:http';
import type { Stack } from '../scripts/launcher';
import { defaultScratchDir } from '../sandbox/base';

/** Stops the stack started by global-setup, destroying its sandboxes, and removes its state. */
export default async function globalTeardown(): Promise<void> {
  const g = (globalThis as { __SAP_STACK__?: { stack: Stack; control: http.Server; dataDir: string } }).__SAP_STACK__;
  if (!g) return;
  g.control.close();
  await g.stack.stop({ destroySandboxes: true });
  if (process.env.SAP_TEST_KEEP_DATA !== '1') {
    fs.rmSync(g.dataDir, { recursive: true, force: true });
    fs.rmSync(defaultScratchDir(g.dataDir), { recursive: true, force: true });
  }
}
