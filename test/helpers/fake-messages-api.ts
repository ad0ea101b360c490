/**
 * Starts the fake Anthropic Messages API (fake-anthropic.js) inside a test host, and resolves once it
 * listens; it logs each request it gets to `log` and accepts only `key`.
 */
import * as path from 'node:path';
import type { TestHost } from './test-host';

export const FAKE_MESSAGES_SCRIPT = path.join(__dirname, 'fake-anthropic.js');

export async function startFakeMessagesApi(host: TestHost, o: { port: number; log: string; key: string }): Promise<void> {
  const fake = host.spawn(process.execPath, [FAKE_MESSAGES_SCRIPT, '--host', host.addr, '--port', String(o.port), '--log', o.log, '--key', o.key]);
  let out = '';
  await new Promise<void>((resolve, reject) => {
    fake.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes(`{"listening":${o.port}}`)) resolve();
    });
    fake.once('exit', (code) => reject(new Error(`the fake Messages API exited (${code}) before listening`)));
  });
}
