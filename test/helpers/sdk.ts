import { execFile } from 'node:child_process';
import path from 'node:path';
import { T } from './env';

const ROOT = path.resolve(__dirname, '..', '..');
const SDK_SCRIPT_TIMEOUT_MS = 120_000;

/**
 * Runs `body` as an ES module with the published OpenComputer client (`@opencomputer/sdk`, which
 * is ESM-only, so it cannot be loaded inside jest) bound as `sdk`, and `opts` = { apiUrl, apiKey }
 * for the test stack. The module's `return`-less last statement must print one JSON line with
 * `out(value)`. `step(text)` notes progress on stderr, so that a script that fails or hangs says
 * how far it got. Returns that value; rejects with the script's stderr (and, when it was stopped
 * after `timeout`, that it was) on failure.
 */
export function runSdk<T = any>(body: string, env: Record<string, string> = {}): Promise<T> {
  const script = `
    import * as sdk from '@opencomputer/sdk';
    import { WebSocket } from 'ws';
    globalThis.WebSocket ??= WebSocket;
    const opts = { apiUrl: process.env.SDK_API_URL, apiKey: process.env.SDK_API_KEY };
    const out = (v) => process.stdout.write(JSON.stringify(v) + '\\n');
    const step = (text) => process.stderr.write('[' + new Date().toISOString() + '] ' + text + '\\n');
    ${body}
  `;
  return new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      ['--input-type=module', '-e', script],
      { cwd: ROOT, env: { ...process.env, SDK_API_URL: T.api(), SDK_API_KEY: T.key(), ...env }, timeout: SDK_SCRIPT_TIMEOUT_MS, maxBuffer: 64 * 1024 * 1024 },
      (err, stdout, stderr) => {
        if (err) {
          const stopped = (err as { killed?: boolean }).killed ? ` (stopped after ${SDK_SCRIPT_TIMEOUT_MS / 1000} s)` : '';
          reject(new Error(`sdk script failed${stopped}: ${stderr || err.message}`));
          return;
        }
        const last = stdout.trim().split('\n').pop() ?? 'null';
        resolve(JSON.parse(last) as T);
      },
    );
  });
}
