import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { freePort, startStack, type Stack } from '../../scripts/launcher';
import { ownStackEnv } from './own-stack-env';

/**
 * A stack of a test file's own with two sandbox hosts (SANDBOX_HOSTS=2), each with its worker, in a
 * fresh temporary data dir; a host silent for `deadAfterS` is lost (short, so that the tests are
 * quick), heartbeats every 500 ms. `env` adds to (or overrides) the test settings.
 */
export async function startTwoHostStack(opts: {
  prefix: string;
  apiKey: string;
  hostToken: string;
  deadAfterS: number;
  env?: Record<string, string>;
}): Promise<{ stack: Stack; dataDir: string }> {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), opts.prefix));
  const stack = await startStack({
    dataDir,
    apiPort: await freePort(),
    temporalPort: await freePort(),
    mongoPort: await freePort(),
    hostPort: 0,
    hostPorts: [await freePort(), await freePort()],
    hosts: 2,
    apiKey: opts.apiKey,
    hostToken: opts.hostToken,
    env: await ownStackEnv({
      HOST_DEAD_AFTER: String(opts.deadAfterS),
      HOST_HEARTBEAT_MS: '500',
      ...opts.env,
    }),
  });
  return { stack, dataDir };
}
