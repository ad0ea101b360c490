/**
 * Webhooks when a session ends (and when a batch completes): signed, durable, at least once. Every
 * receiver is a server this test runs on 127.0.0.1; nothing else is ever called.
 */
import { createHmac, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { api, control, eventually, T } from '../helpers/env';
import { bashAgent, runSession, startSession, waitForStatus } from '../helpers/sessions';

jest.setTimeout(180_000);

interface Delivery {
  headers: http.IncomingHttpHeaders;
  body: string;
  json: { event: string; delivery_id: string; data: Record<string, any> };
}

/** A receiver on 127.0.0.1 that records every POST and answers with `answer(n)` (n: 1-based). */
class Receiver {
  readonly got: Delivery[] = [];
  private server: http.Server | null = null;
  port = 0;
  constructor(private readonly answer: (n: number) => number = () => 200) {}

  async listen(port = 0): Promise<this> {
    const server = http.createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        this.got.push({ headers: req.headers, body, json: JSON.parse(body) });
        res.writeHead(this.answer(this.got.length)).end();
      });
    });
    await new Promise<void>((r) => server.listen(port, '127.0.0.1', r));
    this.server = server;
    this.port = (server.address() as { port: number }).port;
    return this;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}/hooks/sap`;
  }

  async close(): Promise<void> {
    const s = this.server;
    this.server = null;
    if (s) await new Promise((r) => s.close(r));
  }
}

/** Checks X-SAP-Signature as a receiver would: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">. */
function verify(d: Delivery, secret: string): boolean {
  const m = /^t=(\d+),v1=([0-9a-f]{64})$/.exec(String(d.headers['x-sap-signature'] ?? ''));
  if (!m) return false;
  const expected = createHmac('sha256', secret).update(`${m[1]}.${d.body}`).digest('hex');
  return expected === m[2] && Math.abs(Date.now() / 1000 - Number(m[1])) < 300;
}

const receivers: Receiver[] = [];
const agents: string[] = [];
afterAll(async () => {
  for (const r of receivers) await r.close();
  for (const id of agents) await api('DELETE', `/v1/agents/${id}`).catch(() => undefined);
});

async function receiver(answer?: (n: number) => number, port?: number): Promise<Receiver> {
  const r = new Receiver(answer);
  receivers.push(r);
  return r.listen(port);
}

async function agent(script: string, extra: Record<string, unknown> = {}): Promise<string> {
  const id = await bashAgent(script, extra);
  agents.push(id);
  return id;
}

const settle = () => new Promise((r) => setTimeout(r, 1500));

describe('webhooks', () => {
  it("an agent's webhook gets exactly one valid signed delivery when each session ends; the secret is never shown", async () => {
    const secret = `whsec-${randomBytes(12).toString('hex')}`;
    const r = await receiver();
    const id = await agent('echo "{\\"ok\\":true}" > /tmp/agent_result.json', { webhook: { url: r.url, secret } });
    const shown = await api('GET', `/v1/agents/${id}`);
    expect(shown.body.webhook).toEqual({ url: r.url, has_secret: true });
    expect(JSON.stringify(shown.body)).not.toContain(secret);
    const { session } = await runSession(id, { n: 1 });
    await eventually(async () => r.got.length >= 1, 30_000, 100);
    await settle();
    expect(r.got).toHaveLength(1);
    const d = r.got[0]!;
    expect(verify(d, secret)).toBe(true);
    expect(verify(d, 'another-secret')).toBe(false);
    expect(d.headers['x-sap-event']).toBe('session.ended');
    expect(d.headers['x-sap-delivery']).toBe(`${session.id}-webhook`);
    expect(d.json).toMatchObject({ event: 'session.ended', delivery_id: `${session.id}-webhook`, data: { id: session.id, status: 'completed', result: { ok: true }, input: { n: 1 } } });
    expect(d.json.data.outcome).toEqual({ reason: null, exit_code: 0, message: null });
    // The secret is in no log line of the API or the worker.
    for (const f of ['api.log', 'worker.log']) expect(fs.readFileSync(path.join(T.logDir(), f), 'utf8')).not.toContain(secret);
  });

  it("a session's own webhook replaces its agent's; a failed session's delivery carries its outcome; no secret means no signature", async () => {
    const agentHook = await receiver();
    const own = await receiver();
    const id = await agent('echo nope >&2; exit 4', { webhook: { url: agentHook.url } });
    const s = await startSession(id, { webhook: { url: own.url } });
    await waitForStatus(id, s.id, ['failed']);
    await eventually(async () => own.got.length >= 1, 30_000, 100);
    await settle();
    expect([own.got.length, agentHook.got.length]).toEqual([1, 0]);
    expect(own.got[0]!.headers['x-sap-signature']).toBeUndefined();
    expect(own.got[0]!.json.data).toMatchObject({ id: s.id, status: 'failed', outcome: { reason: 'exit_code', exit_code: 4 } });
    expect(own.got[0]!.json.data.outcome.message).toContain('nope');
  });

  it('retries a receiver that answers 500 twice, with the same delivery id, until it answers 200', async () => {
    const r = await receiver((n) => (n <= 2 ? 500 : 200));
    const id = await agent('true', { webhook: { url: r.url, secret: 'retry-secret-123' } });
    const { session } = await runSession(id);
    await eventually(async () => r.got.length >= 3, 60_000, 100);
    await settle();
    expect(r.got).toHaveLength(3);
    expect(new Set(r.got.map((d) => d.headers['x-sap-delivery']))).toEqual(new Set([`${session.id}-webhook`]));
    for (const d of r.got) expect(verify(d, 'retry-secret-123')).toBe(true);
  });

  it('delivers to a receiver that was down while the worker restarted, once it is up', async () => {
    // A port nobody listens on yet: take one, and give it back.
    const probe = await receiver();
    const port = probe.port;
    await probe.close();
    const id = await agent('true', { webhook: { url: `http://127.0.0.1:${port}/late` } });
    const { session } = await runSession(id);
    await control('kill', 'worker', 'SIGKILL');
    await control('start', 'worker');
    const late = await receiver(() => 200, port);
    await eventually(async () => late.got.length >= 1, 90_000, 200);
    expect(late.got[0]!.json.data.id).toBe(session.id);
  });

  it("a batch's webhook is called once when it completes, with its counts", async () => {
    const r = await receiver();
    const id = await agent('cat "$AGENT_INPUT_PATH" > /tmp/agent_result.json');
    const b = await api('POST', `/v1/agents/${id}/batches`, { body: { items: [{ input: { i: 1 } }, { input: { i: 2 } }, { input: { i: 3 } }], webhook: { url: r.url, secret: 'batch-secret-1' } } });
    expect(b.status).toBe(201);
    expect(b.body.webhook).toEqual({ url: r.url, has_secret: true });
    await eventually(async () => r.got.length >= 1, 60_000, 200);
    await settle();
    expect(r.got).toHaveLength(1);
    expect(verify(r.got[0]!, 'batch-secret-1')).toBe(true);
    expect(r.got[0]!.json).toMatchObject({ event: 'batch.completed', data: { id: b.body.id, status: 'completed', counts: { completed: 3, failed: 0 } } });
  });

  it('refuses webhook URLs that are not absolute http(s) without credentials, and short secrets, with 400', async () => {
    for (const webhook of [
      { url: 'ftp://127.0.0.1/x' },
      { url: 'not a url' },
      { url: '/relative' },
      { url: 'http://user:pass@127.0.0.1/x' },
      { url: `http://127.0.0.1/${'x'.repeat(3000)}` },
      { url: 'http://127.0.0.1/x', secret: 'short' },
      { url: 'http://127.0.0.1/x', extra: 1 },
    ]) {
      const r = await api('POST', '/v1/agents', { body: { core: 'bash', entrypoint: ['true'], webhook } });
      if (r.status === 201) agents.push(r.body.id as string);
      expect([webhook.url.slice(0, 30), r.status, r.body?.error?.type]).toEqual([webhook.url.slice(0, 30), 400, 'invalid_request']);
    }
    const id = await agent('true');
    const s = await api('POST', `/v1/agents/${id}/sessions`, { body: { webhook: { url: 'gopher://x' } } });
    expect(s.status).toBe(400);
    const cleared = await api('PATCH', `/v1/agents/${id}`, { body: { webhook: { url: 'https://example.test/hook', secret: 'a-long-secret' } } });
    expect(cleared.body.webhook).toEqual({ url: 'https://example.test/hook', has_secret: true });
    expect((await api('PATCH', `/v1/agents/${id}`, { body: { webhook: null } })).body.webhook).toBeNull();
  });
});
