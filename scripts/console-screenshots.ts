import fs from 'node:fs';
import path from 'node:path';
import type { Page } from 'playwright-core';
import { launchChromium, signedInContext } from './console-browser';

/**
 * `npm run console:screenshots` against a running stack (SAP_API_URL, SAP_API_KEY; npm start's by
 * default): makes a little to show (an agent, a failing session, a batch, a sandbox with a file and a
 * terminal) and writes a PNG of each console page, and of /docs, to docs/console/.
 */
const URL_ = process.env.SAP_API_URL ?? 'http://127.0.0.1:8080';
const KEY = process.env.SAP_API_KEY ?? 'dev-key';
const OUT = path.join(__dirname, '..', '..', 'docs', 'console');

async function call(method: string, p: string, body?: unknown): Promise<any> {
  const res = await fetch(`${URL_}${p}`, {
    method,
    headers: { 'x-api-key': KEY, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${p}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

async function shot(page: Page, name: string, route: string, ready: string, before?: (p: Page) => Promise<void>): Promise<void> {
  await page.goto(route.startsWith('/docs') ? `${URL_}${route}` : `${URL_}/console/#${route}`);
  await page.waitForSelector(ready, { timeout: 60_000 });
  if (before) await before(page);
  await page.waitForTimeout(300);
  await page.screenshot({ path: path.join(OUT, `${name}.png`), fullPage: false });
  process.stdout.write(`docs/console/${name}.png\n`);
}

async function main(): Promise<void> {
  fs.mkdirSync(OUT, { recursive: true });
  const suffix = Date.now().toString(36);
  const agentId = `demo-${suffix}`;
  await call('POST', '/v1/agents', {
    id: agentId,
    display_name: 'Demo: prints, fails on n=2',
    core: 'bash',
    entrypoint: [
      'bash',
      '-c',
      'n=$(tr -dc 0-9 < "$AGENT_INPUT_PATH"); echo "working on $n"; sleep 1; if [ "$n" = 2 ]; then echo "bad input $n" >&2; exit 2; fi; echo "{\\"n\\":$n}" > /tmp/agent_result.json',
    ],
    timeoutSeconds: 60,
  });
  const failing = await call('POST', `/v1/agents/${agentId}/sessions`, { input: { n: 2 }, metadata: { user: 'u1' } });
  await call('POST', `/v1/agents/${agentId}/sessions`, { input: { n: 1 }, metadata: { user: 'u2' } });
  const batch = await call('POST', `/v1/agents/${agentId}/batches`, { items: [1, 2, 3, 4, 5, 6].map((n) => ({ input: { n } })), concurrency: 3 });
  const sb = await call('POST', '/api/sandboxes', { metadata: { team: 'demo' } });
  await fetch(`${URL_}/api/sandboxes/${sb.sandboxID}/files?path=/workspace/notes.txt`, { method: 'PUT', headers: { 'x-api-key': KEY }, body: 'hello\n' });
  await call('GET', `/v1/agents/${agentId}/sessions/${failing.id}?wait=30`);

  const browser = await launchChromium();
  try {
    const anon = await browser.newContext({ viewport: { width: 1280, height: 860 } });
    const p0 = await anon.newPage();
    await shot(p0, 'signin', '/signin', 'input[name=apiKey]');
    await anon.close();
    const context = await signedInContext(browser, KEY);
    const page = await context.newPage();
    await shot(page, 'agents', '/agents', 'tbody tr');
    await shot(page, 'sessions', `/agents/${agentId}/sessions`, 'tbody tr');
    await shot(page, 'session', `/agents/${agentId}/sessions/${failing.id}`, '.log-state:has-text("complete")');
    await shot(page, 'batch', `/agents/${agentId}/batches/${batch.id}`, '.badge:has-text("completed")');
    await shot(page, 'batches', `/agents/${agentId}/batches`, 'tbody tr');
    await shot(page, 'sandboxes', '/sandboxes', 'tbody tr');
    await shot(page, 'sandbox', `/sandboxes/${sb.sandboxID}`, '.sandbox-status', async (p) => {
      await p.click('button:has-text("Open terminal")');
      await p.waitForSelector('.term-status:has-text("Connected")');
      await p.click('.terminal');
      await p.keyboard.type('uname -sr; ls /workspace\n');
      await p.waitForTimeout(800);
    });
    await shot(page, 'hosts', '/hosts', 'tbody tr');
    await shot(page, 'docs', '/docs', '.swagger-ui .info .title');
  } finally {
    await browser.close();
    await call('DELETE', `/api/sandboxes/${sb.sandboxID}`).catch(() => undefined);
  }
}

main().catch((err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`);
  process.exit(1);
});
