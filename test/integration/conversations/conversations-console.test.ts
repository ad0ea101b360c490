/**
 * The console's conversation page against the real stack: its turns, its events following live, a
 * message sent from the page, and a fork made with its button (the bash runner of
 * test/fixtures/conversation-runner.sh stands in for a model).
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Browser, Page } from 'playwright-core';
import { api, eventually, T, unique } from '../../helpers/env';
import { launchChromium } from '../../helpers/browser';

jest.setTimeout(120_000);

const RUNNER = fs.readFileSync(path.join(__dirname, '..', '..', 'fixtures', 'conversation-runner.sh'), 'utf8');
let browser: Browser | undefined;
let page: Page;
let agentId: string;
const opened: string[] = [];
const pageErrors: string[] = [];

beforeAll(async () => {
  agentId = unique('conv-console');
  expect(
    (await api('POST', '/v1/agents', { body: { id: agentId, core: 'bash', entrypoint: ['true'], files: { '/opt/runner.sh': RUNNER }, user: 'root' } })).status,
  ).toBe(201);
  browser = await launchChromium();
  page = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
  page.setDefaultTimeout(30_000);
  page.on('pageerror', (e) => pageErrors.push(`pageerror: ${e.message}`));
});

afterAll(async () => {
  await browser?.close().catch(() => undefined);
  for (const id of opened) await api('POST', `/v1/conversations/${id}/archive`).catch(() => undefined);
  await api('DELETE', `/v1/agents/${agentId}`).catch(() => undefined);
});

describe('the console’s conversation page', () => {
  it('shows turns and live events, sends a message, and forks at a turn', async () => {
    const c = await api('POST', `/v1/agents/${agentId}/conversations`, {
      body: { input: 'from the api', runner: ['bash', '/opt/runner.sh'], idleSeconds: 3600 },
    });
    expect(c.status).toBe(201);
    const id: string = c.body.id;
    opened.push(id);
    await page.goto(`${T.api()}/console/#/signin`);
    await page.fill('input[name=apiKey]', T.key());
    await page.click('form.signin button[type=submit]');
    await page.waitForSelector('h1:has-text("Agents")');
    await page.goto(`${T.api()}/console/#/agents/${agentId}/conversations`);
    await page.click(`a:has-text("${id}")`);
    await page.waitForSelector('.conversation-events:has-text("I remember: from the api")');
    await page.fill('textarea[aria-label=Message]', 'from the console');
    await page.click('button:has-text("Send")');
    await page.waitForSelector('.conversation-events:has-text("I remember: from the api,from the console")');
    await eventually(async () => (await api('GET', `/v1/conversations/${id}`)).body.headTurn === 2, 60_000);
    // Fork at turn 1 from its row: the page moves to the fork, which names its parent.
    await page.locator('tr', { hasText: 'from the api' }).locator('button:has-text("Fork here")').click();
    await page.waitForURL((u) => u.hash.startsWith('#/conversations/') && !u.hash.endsWith(id));
    const forkId = decodeURIComponent(page.url().split('#/conversations/')[1]!);
    opened.push(forkId);
    await page.waitForSelector(`dd:has-text("${id}")`);
    expect((await api('GET', `/v1/conversations/${forkId}`)).body.forkedFrom).toEqual({ conversationId: id, turn: 1 });
    expect(pageErrors).toEqual([]);
  });
});
