import { execFile } from 'node:child_process';
import path from 'node:path';
import { T } from './env';

const ROOT = path.resolve(__dirname, '..', '..');

/**
 * Runs `body` as an ES module with the published OpenComputer client (`@opencomputer/sdk`, which
 * is ESM-only, so it cannot be loaded inside jest) bound as `sdk`, and `opts` = { apiUrl, apiKey }
 * for the test stack. The module's `return`-less last statement must print one JSON line with
 * `out(value)`. Returns that value; rejects with the script's stderr on failure.
 */
export function runSdk<T = any>(body: string, env: Record<string, string> = {}): Promise<T> {
  const script = `
    import * as sdk from '@opencomputer/sdk';
    import { WebSocket } from 'ws';
    globalThis.WebSocket ??= WebSocket;
    const opts = { apiUrl: process.env.SDK_API_URL, apiKey: process.env.SDK_API_KEY };
    const out = (v) => process.stdout.write(JSON.stringify(v) + '\\n');
    ${body}
  `;
  return new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      ['--input-type=module', '-e', script],
      { cwd: ROOT, env: { ...process.env, SDK_API_URL: T.api(), SDK_API_KEY: T.key(), ...env }, timeout: 120_000, maxBuffer: 64 * 1024 * 1024 },
      (err, stdout, stderr) => {
        if (err) {
          reject(new Error(`sdk script failed: ${stderr || err.message}`));
          return;
        }
        const last = stdout.trim().split('\n').pop() ?? 'null';
        resolve(JSON.parse(last) as T);
      },
    );
  });
}
