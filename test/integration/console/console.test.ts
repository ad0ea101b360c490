/**
 * The web console in a real browser (Debian's Chromium through playwright-core) against the test
 * stack: the static pages and their headers, sign-in (a wrong key refused with the API's message), a
 * failing session's logs followed live and its failure, a batch to its end, a sandbox's terminal,
 * file upload and download, the hosts page and the Temporal UI link (an operator's key only), and the
 * API reference at /docs.
 */
import WebSocket from 'ws';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { api, control, eventually, T } from '../../helpers/env';
import { bashAgentsDeletedAfterAll } from '../../helpers/sessions';
import { newSandbox } from '../../helpers/sandboxes';
import { launchChromium, watchPage, withScreenshot } from '../../helpers/browser';
import { otherOrgKey } from '../../helpers/checkpoints';

jest.setTimeout(90_000);

const agents: string[] = [];
const agent = bashAgentsDeletedAfterAll(agents);
const sandboxes: string[] = [];
let browser: Browser | undefined;
let context: BrowserContext;
let page: Page;
/** What the page reported as refused by its Content-Security-Policy or failed in its scripts. */
const pageErrors: string[] = [];

beforeAll(async () => {
  browser = await launchChromium();
  context = await browser.newContext({ acceptDownloads: true, viewport: { width: 1280, height: 900 } });
  page = await context.newPage();
  watchPage(page);
  page.setDefaultTimeout(20_000);
  page.on('pageerror', (e) => pageErrors.push(`pageerror: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content Security Policy|Refused to/i.test(m.text())) pageErrors.push(m.text());
  });
});

afterAll(async () => {
  await browser?.close().catch(() => undefined);
  for (const id of sandboxes) await api('DELETE', `/api/sandboxes/${id}`).catch(() => undefined);
});

const consoleUrl = (hash: string): string => `${T.api()}/console/#${hash}`;
const step = <R>(name: string, fn: () => Promise<R>): Promise<R> => withScreenshot(page, name, fn);

async function signIn(): Promise<void> {
  await page.goto(consoleUrl('/signin'));
  await page.fill('input[name=apiKey]', T.key());
  await page.click('form.signin button[type=submit]');
  await page.waitForSelector('h1:has-text("Agents")');
}

describe('web console', () => {
  it('is served without a key at /console with a strict CSP, / redirects to it, hashed assets are cached long and the page never', async () => {
    const root = await fetch(`${T.api()}/`, { redirect: 'manual' });
    expect(root.status).toBe(302);
    expect(root.headers.get('location')).toBe('/console/');
    const index = await fetch(`${T.api()}/console/`);
    expect(index.status).toBe(200);
    expect(index.headers.get('cache-control')).toBe('no-cache');
    const csp = index.headers.get('content-security-policy') ?? '';
    expect(csp).toContain("default-src 'self'");
    expect(csp).toContain("script-src 'self'");
    expect(csp).not.toMatch(/script-src[^;]*unsafe/);
    expect(csp).toContain("frame-ancestors 'none'");
    const html = await index.text();
    const asset = /\/console\/assets\/[^"]+\.js/.exec(html)?.[0];
    expect(asset).toBeDefined();
    const js = await fetch(`${T.api()}${asset}`);
    expect(js.status).toBe(200);
    expect(js.headers.get('cache-control')).toMatch(/max-age=31536000.*immutable/);
    // Nothing else under /console is served, and the API still refuses calls without a key.
    expect((await fetch(`${T.api()}/console/assets/../../package.json`)).status).toBe(404);
    expect((await fetch(`${T.api()}/console/assets/nope.js`)).status).toBe(404);
    expect((await api('GET', '/api/hosts', { key: null })).status).toBe(401);
    expect((await api('GET', '/api/console/config', { key: null })).status).toBe(401);
  });

  it('refuses a wrong key with the API’s message, and signs in with the right one (the key only in session storage)', async () => {
    await step('wrong-key', async () => {
      await page.goto(consoleUrl('/agents'));
      await page.waitForSelector('input[name=apiKey]');
      await page.fill('input[name=apiKey]', 'not-a-key-of-anyone');
      await page.click('form.signin button[type=submit]');
      await page.waitForSelector('.error:has-text("401 unauthorized: invalid API key")');
      expect(await page.evaluate('Object.keys(sessionStorage).length')).toBe(0);
    });
    await step('sign-in', async () => {
      const id = await agent('exit 0');
      await signIn();
      await page.waitForSelector(`a:has-text("${id}")`);
      expect(page.url()).not.toContain(T.key());
      expect(await page.evaluate('Object.values(sessionStorage)')).toEqual([T.key()]);
      expect(await page.evaluate('Object.keys(localStorage).length')).toBe(0);
    });
  });

  it('starts a session that prints and fails: its logs follow live, then its failure shows (reason, exit code, stderr)', async () => {
    const id = await agent('for i in 1 2 3; do echo line-$i; sleep 2; done; echo boom-on-stderr >&2; exit 3');
    await step('session', async () => {
      await page.goto(consoleUrl(`/agents/${id}/sessions`));
      await page.click('details.new summary');
      await page.fill('textarea[name=input]', '{"task":"fail"}');
      await page.click('details.new button[type=submit]');
      await page.waitForSelector('pre.logs .line:has-text("line-1")', { timeout: 45_000 });
      // The first line came while the session still ran: the log follows, it is not read at the end.
      const sessionId = /sessions\/(sess_[a-z0-9_]+)/.exec(page.url())?.[1];
      expect(sessionId).toBeDefined();
      const now = await api('GET', `/v1/agents/${id}/sessions/${sessionId}`);
      expect(['creating', 'running']).toContain(now.body.status);
      await page.waitForSelector('.failure .reason:has-text("exit_code")', { timeout: 40_000 });
      expect(await page.textContent('.failure')).toContain('exit code 3');
      expect(await page.textContent('.failure pre.stderr')).toContain('boom-on-stderr');
      await page.waitForSelector('.log-state:has-text("The log is complete")');
      const lines = await page.$$eval('pre.logs .line', (els) => els.map((e) => [e.className, e.textContent]));
      expect(lines).toEqual([
        ['line stdout', 'line-1\n'],
        ['line stdout', 'line-2\n'],
        ['line stdout', 'line-3\n'],
        ['line stderr', 'boom-on-stderr\n'],
      ]);
      expect(await page.textContent('.session-status')).toBe('failed');
      // The Temporal UI is the operator's: a tenant's key gets no address, and its console no link
      // (nor the hosts): the nav names the role once the console read its settings.
      const config = (await api('GET', '/api/console/config')).body;
      expect(config).toMatchObject({ temporalUiUrl: null, role: 'tenant' });
      await page.waitForSelector('nav[data-role="tenant"]', { state: 'attached' });
      expect(await page.$('a.temporal-link')).toBeNull();
      expect(await page.isHidden('nav a:has-text("Hosts")')).toBe(true);
      await page.click(`a:has-text("Sessions of ${id}")`);
      await page.selectOption('select[name=status]', 'failed');
      await page.waitForSelector(`td a:has-text("${sessionId}")`);
    });
  });

  it('runs a small batch and watches it finish, its failures grouped by reason', async () => {
    const id = await agent(
      'n=$(cat "$AGENT_INPUT_PATH" | tr -dc 0-9); if [ "$n" = 2 ]; then echo "bad input $n" >&2; exit 2; fi; echo "{\\"n\\":$n}" > /tmp/agent_result.json',
    );
    await step('batch', async () => {
      await page.goto(consoleUrl(`/agents/${id}/batches`));
      await page.click('details.new summary');
      await page.fill('textarea[name=items]', '{"input":{"n":1}}\n{"input":{"n":2}}\n{"input":{"n":3}}');
      await page.click('details.new button[type=submit]');
      await page.waitForSelector('.badge:has-text("completed")', { timeout: 60_000 });
      await page.waitForSelector('td:has-text("bad input 2")');
      expect(await page.textContent('.count-completed')).toBe('2');
      expect(await page.textContent('.count-failed')).toBe('1');
      expect(await page.getAttribute('progress', 'value')).toBe('3');
      const failure = await page.$$eval('h2:has-text("Failures") + div tbody tr td', (tds) => tds.map((t) => t.textContent));
      expect(failure.slice(0, 3)).toEqual(['exit_code', '1', 'entrypoint exited with code 2; stderr: bad input 2']);
    });
  });

  it('opens a terminal in a sandbox (the key in no URL), types a command and reads its output; uploads and downloads a file', async () => {
    const sb = await newSandbox({}, { created: sandboxes });
    const sockets: string[] = [];
    page.on('websocket', (ws) => sockets.push(ws.url()));
    await step('terminal', async () => {
      await page.goto(consoleUrl(`/sandboxes/${sb}`));
      await page.waitForSelector('.sandbox-status:has-text("running")', { timeout: 45_000 });
      await page.click('button:has-text("Open terminal")');
      await page.waitForSelector('.term-status:has-text("Connected")');
      await page.click('.terminal');
      await page.keyboard.type('echo $((6*7))-from-the-console\n');
      await eventually(async () => ((await page.textContent('.terminal .xterm-rows')) ?? '').includes('42-from-the-console'), 20_000);
      expect(sockets.length).toBeGreaterThan(0);
      for (const url of sockets) expect(url).not.toContain(T.key());
    });
    await step('terminal-resize', async () => {
      // A narrower window resizes the terminal, and the shell sees its new width.
      const rows = async () => (await page.textContent('.terminal .xterm-rows')) ?? '';
      await page.keyboard.type('echo wide=$(stty size | cut -d" " -f2)x\n');
      const wide = Number((await eventually(async () => /wide=(\d+)x/.exec(await rows()), 20_000))[1]);
      await page.setViewportSize({ width: 800, height: 900 });
      await page.keyboard.type('echo narrow=$(stty size | cut -d" " -f2)x\n');
      const narrow = Number((await eventually(async () => /narrow=(\d+)x/.exec(await rows()), 20_000))[1]);
      expect(narrow).toBeLessThan(wide);
      await page.setViewportSize({ width: 1280, height: 900 });
    });
    await step('files', async () => {
      const content = `uploaded through the console ${Date.now()}\n`;
      await page.setInputFiles('input[name=upload]', { name: 'hello.txt', mimeType: 'text/plain', buffer: Buffer.from(content) });
      await page.waitForSelector('.upload-status:has-text("Uploaded hello.txt")');
      await page.waitForSelector('td .file:has-text("hello.txt")');
      const stored = await fetch(`${T.api()}/api/sandboxes/${sb}/files?path=/workspace/hello.txt`, { headers: { 'x-api-key': T.key() } });
      expect(await stored.text()).toBe(content);
      const [download] = await Promise.all([page.waitForEvent('download'), page.click('button.download[data-path="/workspace/hello.txt"]')]);
      expect(download.suggestedFilename()).toBe('hello.txt');
      const chunks: Buffer[] = [];
      for await (const c of (await download.createReadStream())!) chunks.push(c as Buffer);
      expect(Buffer.concat(chunks).toString()).toBe(content);
    });
  });

  it('makes a checkpoint from the sandbox page and lists it; hibernates and wakes the sandbox, whose terminal works again', async () => {
    const sb = sandboxes[0] ?? (await newSandbox({}, { created: sandboxes }));
    const rows = async () => (await page.textContent('.terminal .xterm-rows')) ?? '';
    const name = `console-cp-${Date.now().toString(36)}`;
    await step('checkpoint', async () => {
      // The page may already show this sandbox (the test before): going to the same URL would not load it again.
      await page.goto('about:blank');
      await page.goto(consoleUrl(`/sandboxes/${sb}`));
      await page.waitForSelector('.sandbox-status:has-text("running")', { timeout: 45_000 });
      await page.fill('input[name=checkpointName]', name);
      await page.click('button:has-text("Create checkpoint")');
      const row = page.locator('tr', { hasText: name });
      await row.locator('.badge:has-text("ready")').waitFor({ timeout: 60_000 });
      const listed = (await api('GET', `/api/sandboxes/${sb}/checkpoints`)).body as { id: string; name: string; status: string }[];
      const cp = listed.find((c) => c.name === name);
      expect(cp?.status).toBe('ready');
      expect(await row.locator('code').textContent()).toBe(cp!.id);
    });
    await step('hibernate', async () => {
      await page.click('button:has-text("Hibernate")');
      await page.waitForSelector('.sandbox-status:has-text("hibernated")', { timeout: 90_000 });
      expect((await api('GET', `/api/sandboxes/${sb}`)).body.status).toBe('hibernated');
      await page.waitForSelector('p.muted:has-text("wake it for a terminal")');
      expect(await page.$('button:has-text("Open terminal")')).toBeNull();
    });
    await step('wake', async () => {
      await page.click('button:has-text("Wake")');
      await page.waitForSelector('.sandbox-status:has-text("running")', { timeout: 90_000 });
      expect((await api('GET', `/api/sandboxes/${sb}`)).body.status).toBe('running');
      await page.click('button:has-text("Open terminal")');
      await page.waitForSelector('.term-status:has-text("Connected")');
      await page.click('.terminal');
      await page.keyboard.type('echo woke-$((20+22))\n');
      await eventually(async () => (await rows()).includes('woke-42'), 20_000);
    });
  });

  it("signs out to the sign-in page with the API's message when the key stops working mid-session", async () => {
    const other = await browser!.newContext();
    try {
      const p = await other.newPage();
      watchPage(p);
      await withScreenshot(p, 'key-revoked', async () => {
        await p.goto(consoleUrl('/signin'));
        await p.fill('input[name=apiKey]', await otherOrgKey());
        await p.click('form.signin button[type=submit]');
        await p.waitForSelector('p.muted:has-text("No agents yet")');
        // The stored key now gets 401 (as a revoked one does once the API's 30 s key cache expires).
        await p.evaluate("sessionStorage.setItem(Object.keys(sessionStorage)[0], 'revoked-key-of-no-one')");
        await p.click('nav a:has-text("Sandboxes")');
        await p.waitForSelector('form.signin');
        await p.waitForSelector('.error:has-text("401 unauthorized: invalid API key")');
        expect(p.url()).toMatch(/#\/signin$/);
        expect(await p.evaluate('Object.keys(sessionStorage).length')).toBe(0);
        expect(await p.$('.loading')).toBeNull();
      });
    } finally {
      await other.close();
    }
  });

  it("shows another organisation nothing of this one's: agents and sandboxes lists, a sandbox by id", async () => {
    const sb = sandboxes[0] ?? (await newSandbox({}, { created: sandboxes }));
    const other = await browser!.newContext();
    try {
      const p = await other.newPage();
      watchPage(p);
      await withScreenshot(p, 'other-org', async () => {
        await p.goto(consoleUrl('/signin'));
        await p.fill('input[name=apiKey]', await otherOrgKey());
        await p.click('form.signin button[type=submit]');
        await p.waitForSelector('h1:has-text("Agents")');
        await p.waitForSelector('p.muted:has-text("No agents yet")');
        await p.goto(consoleUrl(`/sandboxes/${sb}`));
        await p.waitForSelector('.error:has-text("404 not_found")');
        expect(await p.$('button:has-text("Open terminal")')).toBeNull();
        await p.goto(consoleUrl('/sandboxes'));
        await p.waitForSelector('p.muted:has-text("No sandboxes.")');
      });
    } finally {
      await other.close();
    }
  });

  it('refuses a terminal socket whose subprotocol carries a wrong key', async () => {
    const sb = sandboxes[0] ?? (await newSandbox({}, { created: sandboxes }));
    const pty = await api('POST', `/api/sandboxes/${sb}/pty`, { body: { cols: 80, rows: 24 } });
    expect(pty.status).toBe(201);
    const url = `${T.api().replace(/^http/, 'ws')}/api/sandboxes/${sb}/pty/${pty.body.sessionID}`;
    const outcome = await new Promise<{ code: number; text: string }>((resolve, reject) => {
      const ws = new WebSocket(url, ['sap-console', `sap-key.${Buffer.from('wrong-key').toString('base64url')}`]);
      let text = '';
      ws.on('message', (d, binary) => {
        if (!binary) text += d.toString();
      });
      ws.on('close', (code) => resolve({ code, text }));
      ws.on('error', reject);
    });
    expect(outcome.code).toBe(1008);
    expect(JSON.parse(outcome.text).error.type).toBe('unauthorized');
  });

  it("shows an operator's key the hosts with their load and a session's workflow in the Temporal UI; a tenant's key neither", async () => {
    // A tenant's key: the hosts page answers the API's refusal.
    await step('hosts-tenant', async () => {
      await page.goto(consoleUrl('/hosts'));
      await page.waitForSelector('.error:has-text("403 forbidden: operator only")');
      expect(await page.$('meter')).toBeNull();
    });
    const opKey = await otherOrgKey(`console-op-${Date.now().toString(36)}`, 'operator');
    const opAgent = `console-op-agent-${Date.now().toString(36)}`;
    const other = await browser!.newContext();
    try {
      // The operator's key is a key of its own organisation: it sees that organisation's sessions.
      expect((await api('POST', '/v1/agents', { key: opKey, body: { id: opAgent, core: 'bash', entrypoint: ['bash', '-c', 'exit 0'] } })).status).toBe(201);
      const session = await api('POST', `/v1/agents/${opAgent}/sessions`, { key: opKey, body: { input: {} } });
      expect(session.status).toBe(201);
      const p = await other.newPage();
      watchPage(p);
      await withScreenshot(p, 'hosts', async () => {
        await p.goto(consoleUrl('/signin'));
        await p.fill('input[name=apiKey]', opKey);
        await p.click('form.signin button[type=submit]');
        await p.waitForSelector('nav[data-role="operator"] a:has-text("Hosts")');
        await p.click('nav a:has-text("Hosts")');
        await p.waitForSelector('td .badge:has-text("live")');
        expect(await p.$$('meter')).not.toHaveLength(0);
        // Its workflow in the Temporal UI (TEMPORAL_UI_URL; the test stack runs no UI, so only the href is checked).
        const config = (await api('GET', '/api/console/config', { key: opKey })).body;
        expect(config).toMatchObject({ temporalUiUrl: 'http://temporal-ui.test.invalid:8233', role: 'operator' });
        await p.goto(consoleUrl(`/agents/${opAgent}/sessions/${session.body.id}`));
        await p.waitForSelector('a.temporal-link');
        expect(await p.getAttribute('a.temporal-link', 'href')).toBe(
          `${config.temporalUiUrl}/namespaces/${encodeURIComponent(config.temporalNamespace)}/workflows/${session.body.id}`,
        );
      });
    } finally {
      await other.close();
      await api('DELETE', `/v1/agents/${opAgent}`, { key: opKey }).catch(() => undefined);
    }
  });

  it('renders the API reference at /docs from /openapi.json with assets served here', async () => {
    await step('docs', async () => {
      const requests: string[] = [];
      page.on('request', (r) => requests.push(r.url()));
      // The page comes with an outline of every operation (shown while Swagger UI loads)…
      const html = await (await fetch(`${T.api()}/docs`)).text();
      const spec = (await (await fetch(`${T.api()}/openapi.json`)).json()) as { paths: Record<string, Record<string, unknown>> };
      const methods = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'];
      const operations = Object.values(spec.paths).reduce((n, item) => n + Object.keys(item).filter((k) => methods.includes(k)).length, 0);
      expect(operations).toBeGreaterThan(20);
      expect(html.match(/<li><a href="#\//g)).toHaveLength(operations);
      expect(html).toContain('<code class="sap-method sap-post">POST</code> <code>/v1/agents</code>');
      await page.goto(`${T.api()}/docs`);
      await page.waitForSelector('.swagger-ui .info .title:has-text("Sandbox Agent Platform")', { timeout: 45_000 });
      // …which Swagger UI replaces once it has rendered.
      await page.waitForSelector('#sap-docs-outline', { state: 'detached' });
      // Rendered from the page's 3.0 view of the spec (Swagger UI's 3.1 path costs seconds): a 3.1 construct
      // the view cannot say in 3.0 would show "OAS 3.1" here.
      expect(await page.textContent('.swagger-ui .info .version-stamp')).toBe('OAS 3.0');
      // Tags are folded: opening one shows its operations.
      await page.click('h3.opblock-tag[data-tag="agents"]');
      await page.waitForSelector('.opblock-summary-path:has-text("/v1/agents")');
      for (const u of requests) expect(new URL(u).origin).toBe(new URL(T.api()).origin);
    });
    expect(pageErrors).toEqual([]);
  });

  // Last: it restarts the API.
  it('reconnects a terminal after the API restarts, to the same shell with its scrollback', async () => {
    const sb = sandboxes[0] ?? (await newSandbox({}, { created: sandboxes }));
    const rows = async () => (await page.textContent('.terminal .xterm-rows')) ?? '';
    await step('terminal-reconnect', async () => {
      await page.goto(consoleUrl(`/sandboxes/${sb}`));
      await page.click('button:has-text("Open terminal")');
      await page.waitForSelector('.term-status:has-text("Connected")');
      await page.click('.terminal');
      await page.keyboard.type('KEPT=in-this-shell; echo before-$((2+3))\n');
      await eventually(async () => (await rows()).includes('before-5'), 20_000);
      await control('kill', 'api');
      await page.waitForSelector('.term-status:has-text("Disconnected")');
      await control('start', 'api');
      await eventually(async () => (await fetch(`${T.api()}/healthz`)).ok, 60_000, 200);
      await page.click('button:has-text("Reconnect")');
      await page.waitForSelector('.term-status:has-text("Connected")');
      // The scrollback came back, and it is the same shell (its variable is still set).
      await eventually(async () => (await rows()).includes('before-5'), 20_000);
      await page.click('.terminal');
      await page.keyboard.type('echo after-$KEPT\n');
      await eventually(async () => (await rows()).includes('after-in-this-shell'), 20_000);
    });
  });
});
