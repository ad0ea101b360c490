/**
 * The console's origin and the API key, attacked (issue 40, items 6-8): bytes a sandbox wrote are
 * never run as the console's script (its CSP admits `script-src 'self'`, the origin every file,
 * log and result is served from); the key is taken from a URL only on a WebSocket handshake and is
 * never written to the API's log, however its parameter's name is spelled; and a WebSocket answer
 * never echoes a key offered as a subprotocol.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import type { Browser } from 'playwright-core';
import { api, eventually, T, unique } from '../../helpers/env';
import { newSandbox, sh } from '../../helpers/sandboxes';
import { bashAgentsDeletedAfterAll, runSession } from '../../helpers/sessions';
import { launchChromium } from '../../helpers/browser';

jest.setTimeout(90_000);

const sandboxes: string[] = [];
const agents: string[] = [];
const agent = bashAgentsDeletedAfterAll(agents);
let browser: Browser | undefined;

afterAll(async () => {
  await browser?.close().catch(() => undefined);
  for (const id of sandboxes) await api('DELETE', `/api/sandboxes/${id}`).catch(() => undefined);
});

/** The spellings of `api_key` a server decodes to that name (Express's query parser does). */
const SPELLINGS = ['api_key', 'api%5Fkey', 'api%5fkey', '%61pi_key', '%61%70%69%5F%6B%65%79'];

/** A script that records, in the page that runs it, that it ran. */
const payload = (tag: string): string => `window.__ran = (window.__ran || []).concat(${JSON.stringify(tag)});\n`;

describe("bytes a sandbox wrote, on the console's origin", () => {
  it("never run as the console's script: files (signed URL and API), session logs; each answer is nosniff, sandboxed, a file an attachment", async () => {
    const sb = await newSandbox({}, { created: sandboxes });
    await sh(sb, `mkdir -p /workspace && printf '%s' '${payload('signed')}' > /workspace/signed.js && printf '%s' '${payload('files')}' > /workspace/files.js`);
    const signed = await api('POST', `/api/sandboxes/${sb}/files/download-url`, { body: { path: '/workspace/signed.js' } });
    expect(signed.status).toBe(200);
    const signedPath = new URL(signed.body.url as string).pathname;
    const id = await agent(`printf '%s' '${payload('log')}'`);
    const session = await runSession(id);
    const logPath = `/v1/agents/${id}/sessions/${session.session.id as string}/logs`;

    // The answers themselves: a browser takes each as the type it is sent with, and renders none.
    for (const [what, url, headers] of [
      ['signed file URL', signedPath, {}],
      ['files API', `/api/sandboxes/${sb}/files?path=/workspace/files.js`, { 'x-api-key': T.key() }],
      ['session log', logPath, { 'x-api-key': T.key() }],
    ] as const) {
      const r = await fetch(`${T.api()}${url}`, { headers });
      expect({ what, status: r.status }).toEqual({ what, status: 200 });
      expect({ what, nosniff: r.headers.get('x-content-type-options') }).toEqual({ what, nosniff: 'nosniff' });
      expect({ what, csp: r.headers.get('content-security-policy') }).toEqual({ what, csp: expect.stringMatching(/default-src 'none'.*sandbox/) });
      if (what !== 'session log')
        expect({ what, disposition: r.headers.get('content-disposition') }).toEqual({ what, disposition: expect.stringMatching(/^attachment;/) });
      expect(await r.text()).toContain('window.__ran');
    }

    // The attack: HTML injected into a page of this origin adds <script src> elements pointing at
    // those answers (script-src 'self' admits them). The key in the query is what a script tag can send.
    browser = await launchChromium();
    const page = await (await browser.newContext()).newPage();
    await page.goto(`${T.api()}/console/`);
    const csp = (await (await fetch(`${T.api()}/console/`)).headers.get('content-security-policy')) ?? '';
    expect(csp).toContain("script-src 'self'");
    const srcs = [signedPath, `/api/sandboxes/${sb}/files?path=/workspace/files.js&api_key=${T.key()}`, `${logPath}?api_key=${T.key()}`];
    // Run in the page (as an injected inline handler would): one <script src> per answer, each awaited.
    const outcome = (await page.evaluate(`(async (list) => {
      const settled = [];
      for (const src of list) {
        await new Promise((resolve) => {
          const s = document.createElement('script');
          s.src = src;
          s.onload = () => (settled.push('load ' + src), resolve());
          s.onerror = () => (settled.push('error ' + src), resolve());
          document.head.appendChild(s);
        });
      }
      return { ran: window.__ran || [], settled };
    })(${JSON.stringify(srcs)})`)) as { ran: string[]; settled: string[] };
    // Every tag was tried (each one settled), and none of them ran.
    expect(outcome.settled).toHaveLength(srcs.length);
    expect(outcome.ran).toEqual([]);
  });

  it("serves previews on their own origin only: a preview-shaped Host never gets the console, nor the API's files", async () => {
    const sb = sandboxes[0] ?? (await newSandbox({}, { created: sandboxes }));
    const { port } = new URL(T.api());
    const get = (host: string, p: string) =>
      new Promise<{ status: number; body: string; csp: string }>((resolve, reject) => {
        const req = http.get({ host: '127.0.0.1', port: Number(port), path: p, headers: { host } }, (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (d: string) => (body += d));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body, csp: String(res.headers['content-security-policy'] ?? '') }));
        });
        req.on('error', reject);
      });
    const previewHost = `${sb}-p3000.preview.localhost`;
    const consolePage = await get(`127.0.0.1:${port}`, '/console/');
    expect(consolePage.status).toBe(200);
    expect(consolePage.body).toContain('/console/assets/');
    for (const p of ['/console/', '/docs', '/openapi.json']) {
      const r = await get(previewHost, p);
      expect({ p, console: r.body.includes('/console/assets/') || r.csp.includes("script-src 'self'") || r.body.includes('"openapi"') }).toEqual({
        p,
        console: false,
      });
    }
  });
});

/** Opens a WebSocket handshake by hand; resolves with the answer's status and headers and the first frame's text (if any). */
function handshake(p: string, headers: Record<string, string>): Promise<{ status: number; headers: http.IncomingHttpHeaders; firstText?: string }> {
  return new Promise((resolve, reject) => {
    const { port } = new URL(T.api());
    const req = http.request({
      host: '127.0.0.1',
      port: Number(port),
      path: p,
      headers: {
        connection: 'Upgrade',
        upgrade: 'websocket',
        'sec-websocket-version': '13',
        'sec-websocket-key': crypto.randomBytes(16).toString('base64'),
        ...headers,
      },
    });
    req.on('response', (res) => {
      res.resume();
      resolve({ status: res.statusCode ?? 0, headers: res.headers });
    });
    req.on('upgrade', (res, socket, head) => {
      let buf = head;
      const done = (firstText?: string) => {
        socket.destroy();
        resolve({ status: res.statusCode ?? 0, headers: res.headers, firstText });
      };
      const tryFrame = () => {
        if (buf.length < 2) return;
        let len = buf[1]! & 0x7f;
        let off = 2;
        if (len === 126) {
          if (buf.length < 4) return;
          len = buf.readUInt16BE(2);
          off = 4;
        }
        if (buf.length < off + len) return;
        done((buf[0]! & 0x0f) === 1 ? buf.subarray(off, off + len).toString('utf8') : undefined);
      };
      socket.on('data', (d: Buffer) => {
        buf = Buffer.concat([buf, d]);
        tryFrame();
      });
      socket.on('close', () => done());
      socket.on('error', () => done());
      tryFrame();
    });
    req.on('error', reject);
    req.end();
  });
}

describe('the API key on a WebSocket', () => {
  const b64 = (s: string) => Buffer.from(s).toString('base64url');

  it('is never echoed: sap-key.<key> offered alone gets no protocol back and is refused; beside sap-console, sap-console is selected', async () => {
    const p = `/api/sandboxes/${unique('sb-none')}/pty/none`;
    // What a socket that got past authentication is told (the sandbox does not exist): the answer with X-API-Key.
    const control = JSON.parse((await handshake(p, { 'x-api-key': T.key() })).firstText ?? '{}').error?.type as string;
    expect(control).not.toBe('unauthorized');
    const alone = await handshake(p, { 'sec-websocket-protocol': `sap-key.${b64(T.key())}` });
    expect(alone.status).toBe(101);
    expect(alone.headers['sec-websocket-protocol']).toBeUndefined();
    expect(JSON.stringify(alone.headers)).not.toContain(b64(T.key()));
    expect(JSON.parse(alone.firstText ?? '{}')).toMatchObject({ error: { type: 'unauthorized', message: expect.stringContaining('sap-console') } });

    const beside = await handshake(p, { 'sec-websocket-protocol': `sap-console, sap-key.${b64(T.key())}` });
    expect(beside.status).toBe(101);
    expect(beside.headers['sec-websocket-protocol']).toBe('sap-console');
    expect(JSON.stringify(beside.headers)).not.toContain(b64(T.key()));
    // The key was taken: the socket gets past authentication, as with the header.
    expect(JSON.parse(beside.firstText ?? '{}')).toMatchObject({ error: { type: control } });
  });

  it('is taken from the query on a WebSocket handshake only, and never written to the log, however api_key is spelled', async () => {
    const reqId = unique('keyq');
    const socketPath = `/api/sandboxes/${unique('sb-none')}/pty/none`;
    const control = JSON.parse((await handshake(socketPath, { 'x-api-key': T.key() })).firstText ?? '{}').error?.type as string;
    expect(control).not.toBe('unauthorized');
    for (const [i, name] of SPELLINGS.entries()) {
      // A plain request: the query carries no key (a header can be sent), whatever the spelling.
      const r = await api('GET', `/v1/agents?${name}=${encodeURIComponent(T.key())}`, { key: null, headers: { 'x-request-id': `${reqId}-${i}` } });
      expect({ name, status: r.status }).toEqual({ name, status: 401 });
      // A WebSocket (OpenComputer's client sends ?api_key=): the key is taken, the socket gets past authentication.
      const ws = await handshake(`${socketPath}?${name}=${encodeURIComponent(T.key())}`, { 'x-request-id': `${reqId}-ws-${i}` });
      expect({ name, status: ws.status }).toEqual({ name, status: 101 });
      expect({ name, error: JSON.parse(ws.firstText ?? '{}').error?.type }).toEqual({ name, error: control });
    }
    const file = path.join(T.logDir(), 'api.log');
    const lines = await eventually(async () => {
      const found = fs
        .readFileSync(file, 'utf8')
        .split('\n')
        .filter((l) => l.includes(`"${reqId}-`));
      return SPELLINGS.every((_n, i) => found.some((l) => l.includes(`"id":"${reqId}-${i}"`))) ? found : undefined;
    }, 10_000);
    for (const [i, name] of SPELLINGS.entries()) {
      const line = lines.find((l) => l.includes(`"id":"${reqId}-${i}"`));
      expect({ name, line }).toEqual({ name, line: expect.stringContaining(`${name}=[redacted]`) });
    }
    // Every line of these requests (the sockets' too, if they are logged), and the whole log: no key.
    for (const l of lines) expect(l).not.toContain(T.key());
    expect(fs.readFileSync(file, 'utf8')).not.toContain(T.key());
  });
});
