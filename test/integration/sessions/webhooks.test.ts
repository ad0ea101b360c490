/**
 * Webhooks when a session ends (and when a batch completes): signed, durable, at least once. Every
 * receiver is a server this test runs on 127.0.0.2, the one address the test stack's allow list
 * opens (WEBHOOK_ALLOWED_CIDRS, test/global-setup.ts); receivers on 127.0.0.1 stand for the
 * operator's internal services, which must never be called.
 */
import { createHmac, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { ApplicationFailure, Client, Connection, WorkflowFailedError } from '@temporalio/client';
import { api, control, eventually, T, withMongo } from '../../helpers/env';
import { bashAgentsDeletedAfterAll, runSession, startSession, waitForStatus } from '../../helpers/sessions';

jest.setTimeout(180_000);

interface Delivery {
  headers: http.IncomingHttpHeaders;
  body: string;
  json: { event: string; delivery_id: string; data: Record<string, any> };
}

/** A receiver on `host` (127.0.0.2: allowed) that records every POST and answers with `answer(n)` (n: 1-based). */
class Receiver {
  readonly got: Delivery[] = [];
  private server: http.Server | null = null;
  port = 0;
  constructor(
    private readonly answer: (n: number) => number = () => 200,
    readonly host = '127.0.0.2',
  ) {}

  async listen(port = 0): Promise<this> {
    const server = http.createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        this.got.push({ headers: req.headers, body, json: JSON.parse(body) });
        res.writeHead(this.answer(this.got.length)).end();
      });
    });
    await new Promise<void>((r) => server.listen(port, this.host, r));
    this.server = server;
    this.port = (server.address() as { port: number }).port;
    return this;
  }

  get url(): string {
    return `http://${this.host}:${this.port}/hooks/sap`;
  }

  async close(): Promise<void> {
    const s = this.server;
    this.server = null;
    if (s) {
      s.closeAllConnections();
      await new Promise((r) => s.close(r));
    }
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
const servers: http.Server[] = [];
const agents: string[] = [];
const agent = bashAgentsDeletedAfterAll(agents);
let connection: Connection | undefined;
afterAll(async () => {
  for (const r of receivers) await r.close();
  for (const s of servers) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
  await connection?.close();
});

async function receiver(answer?: (n: number) => number, port?: number, host?: string): Promise<Receiver> {
  const r = new Receiver(answer, host);
  receivers.push(r);
  return r.listen(port);
}

/**
 * Waits until no further delivery can come for `subjectId` (a session or a batch): its delivery
 * workflow (every attempt is an activity of it) and the workflow that starts it have both closed.
 */
async function settled(subjectId: string): Promise<void> {
  connection ??= await Connection.connect({ address: T.temporal() });
  const client = new Client({ connection });
  for (const id of [`${subjectId}-webhook`, subjectId]) {
    const handle = client.workflow.getHandle(id);
    await eventually(async () => (await handle.describe()).status.name !== 'RUNNING', 60_000, 100);
  }
}

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
    await settled(session.id);
    expect(r.got).toHaveLength(1);
    const d = r.got[0]!;
    expect(verify(d, secret)).toBe(true);
    expect(verify(d, 'another-secret')).toBe(false);
    expect(d.headers['x-sap-event']).toBe('session.ended');
    expect(d.headers['x-sap-delivery']).toBe(`${session.id}-webhook`);
    expect(d.json).toMatchObject({
      event: 'session.ended',
      delivery_id: `${session.id}-webhook`,
      data: { id: session.id, status: 'completed', result: { ok: true }, input: { n: 1 } },
    });
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
    await settled(s.id);
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
    await settled(session.id);
    expect(r.got).toHaveLength(3);
    expect(new Set(r.got.map((d) => d.headers['x-sap-delivery']))).toEqual(new Set([`${session.id}-webhook`]));
    for (const d of r.got) expect(verify(d, 'retry-secret-123')).toBe(true);
  });

  it('delivers to a receiver that was down while the worker restarted, once it is up', async () => {
    // A port nobody listens on yet: take one, and give it back.
    const probe = await receiver();
    const port = probe.port;
    await probe.close();
    const id = await agent('true', { webhook: { url: `http://127.0.0.2:${port}/late` } });
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
    const b = await api('POST', `/v1/agents/${id}/batches`, {
      body: { items: [{ input: { i: 1 } }, { input: { i: 2 } }, { input: { i: 3 } }], webhook: { url: r.url, secret: 'batch-secret-1' } },
    });
    expect(b.status).toBe(201);
    expect(b.body.webhook).toEqual({ url: r.url, has_secret: true });
    await eventually(async () => r.got.length >= 1, 60_000, 200);
    await settled(b.body.id);
    expect(r.got).toHaveLength(1);
    expect(verify(r.got[0]!, 'batch-secret-1')).toBe(true);
    expect(r.got[0]!.json).toMatchObject({ event: 'batch.completed', data: { id: b.body.id, status: 'completed', counts: { completed: 3, failed: 0 } } });
  });

  it('refuses webhook URLs that are not absolute http(s) without credentials, and short secrets, with 400', async () => {
    for (const webhook of [
      { url: 'ftp://127.0.0.2/x' },
      { url: 'not a url' },
      { url: '/relative' },
      { url: 'http://user:pass@127.0.0.2/x' },
      { url: `http://127.0.0.2/${'x'.repeat(3000)}` },
      { url: 'http://127.0.0.2/x', secret: 'short' },
      { url: 'http://127.0.0.2/x', extra: 1 },
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

  it('refuses at create, with 400, receivers outside the allow list: loopback in every spelling, names resolving to it, metadata, private, multicast, unspecified', async () => {
    const internal = await receiver(() => 200, undefined, '127.0.0.1');
    const p = internal.port;
    const refused = [
      internal.url,
      `http://localhost:${p}/`,
      `http://LOCALHOST:${p}/`,
      `http://0x7f000001:${p}/`,
      `http://2130706433:${p}/`,
      `http://0177.0.0.1:${p}/`,
      `http://127.1:${p}/`,
      `http://127.0.0.3:${p}/`,
      `http://0:${p}/`,
      `http://0.0.0.0:${p}/`,
      `http://[::]:${p}/`,
      `http://[::1]:${p}/`,
      `http://[::ffff:127.0.0.1]:${p}/`,
      `http://[::ffff:7f00:3]:${p}/`,
      'http://169.254.169.254/latest/meta-data/',
      'http://[fd00:ec2::254]/latest/meta-data/',
      'http://10.0.0.1/',
      'http://172.16.0.1/',
      'http://192.168.1.1/',
      'http://100.112.0.1/',
      'http://224.0.0.1/',
      'http://[fe80::1]/',
      'http://255.255.255.255/',
    ];
    const id = await agent('true');
    const attempts: Array<[string, () => Promise<{ status: number; body: any }>]> = [];
    for (const url of refused) {
      attempts.push(
        [`create ${url}`, () => api('POST', '/v1/agents', { body: { core: 'bash', entrypoint: ['true'], webhook: { url } } })],
        [`patch ${url}`, () => api('PATCH', `/v1/agents/${id}`, { body: { webhook: { url } } })],
        [`session ${url}`, () => api('POST', `/v1/agents/${id}/sessions`, { body: { webhook: { url } } })],
        [`batch ${url}`, () => api('POST', `/v1/agents/${id}/batches`, { body: { items: [{ input: {} }], webhook: { url } } })],
      );
    }
    const passed: string[] = [];
    for (const [what, call] of attempts) {
      const r = await call();
      if (r.status === 201 && what.startsWith('create')) agents.push(r.body.id as string);
      if (r.status !== 400 || r.body?.error?.type !== 'invalid_request' || !/body\.webhook\.url: .*(address|resolves)/.test(r.body.error.message))
        passed.push(`${what} → ${r.status} ${JSON.stringify(r.body)}`);
    }
    expect(passed).toEqual([]);
    // The agent kept no webhook; the address the operator opened is accepted.
    expect((await api('GET', `/v1/agents/${id}`)).body.webhook).toBeNull();
    const open = await api('PATCH', `/v1/agents/${id}`, { body: { webhook: { url: `http://127.0.0.2:${p}/` } } });
    expect([open.status, open.body.webhook]).toEqual([200, { url: `http://127.0.0.2:${p}/`, has_secret: false }]);
    expect(internal.got).toHaveLength(0);
  });

  /** The result of the webhook delivery workflow of session `sessionId`, or its failure. */
  async function delivery(sessionId: string): Promise<{ status: number } | ApplicationFailure> {
    connection ??= await Connection.connect({ address: T.temporal() });
    const handle = new Client({ connection }).workflow.getHandle(`${sessionId}-webhook`);
    await eventually(() => handle.describe().then(() => true), 60_000, 200);
    return handle.result().catch((err: unknown) => {
      // WorkflowFailedError → ActivityFailure → the activity's ApplicationFailure.
      for (let e: unknown = err instanceof WorkflowFailedError ? err.cause : undefined; e; e = (e as Error).cause)
        if (e instanceof ApplicationFailure) return e;
      throw err;
    });
  }

  it('checks again at delivery: a stored receiver on a refused address (a name that now resolves elsewhere) is never called, and the delivery fails for good', async () => {
    const internal = await receiver(() => 200, undefined, '127.0.0.1');
    const id = await agent('true');
    // As if the name given at create time resolved to a public address then and to 127.0.0.1 now.
    await withMongo((c) =>
      c
        .db()
        .collection('agents')
        .updateOne({ id }, { $set: { webhook: { url: `http://localhost:${internal.port}/hook` } } }),
    );
    const { session } = await runSession(id);
    const out = await delivery(session.id);
    expect(out).toBeInstanceOf(ApplicationFailure);
    expect((out as ApplicationFailure).type).toBe('WebhookTargetRefused');
    expect(internal.got).toHaveLength(0);
  });

  it('reads only a few KiB of an endless answer: the delivery succeeds once and the worker closes the connection', async () => {
    let attempts = 0;
    let closed = 0;
    const server = http.createServer((req, res) => {
      attempts++;
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/octet-stream' });
        const chunk = Buffer.alloc(256 * 1024, 'x');
        const pump = (): void => {
          while (!res.destroyed && res.write(chunk));
        };
        res.on('drain', pump);
        res.on('close', () => closed++);
        pump();
      });
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.2', r));
    const url = `http://127.0.0.2:${(server.address() as { port: number }).port}/flood`;
    const id = await agent('true', { webhook: { url } });
    const { session } = await runSession(id);
    // Read whole, the answer never ends: the attempt would time out and be retried forever.
    expect(await delivery(session.id)).toEqual({ status: 200 });
    await eventually(async () => closed >= 1, 30_000, 100);
    expect(attempts).toBe(1);
  });

  it('ends an exchange whose answer trickles past WEBHOOK_TIMEOUT_MS, and retries it', async () => {
    let attempts = 0;
    const timers = new Set<NodeJS.Timeout>();
    const cut: number[] = [];
    const server = http.createServer((req, res) => {
      const n = ++attempts;
      req.resume();
      req.on('end', () => {
        if (n > 1) return void res.writeHead(200).end();
        // The first attempt: a head, then a byte now and then, never the end.
        res.writeHead(200);
        const t = setInterval(() => res.write('.'), 500);
        timers.add(t);
        res.on('close', () => {
          clearInterval(t);
          cut.push(n);
        });
      });
    });
    servers.push(server);
    try {
      await new Promise<void>((r) => server.listen(0, '127.0.0.2', r));
      const id = await agent('true', { webhook: { url: `http://127.0.0.2:${(server.address() as { port: number }).port}/slow` } });
      const { session } = await runSession(id);
      expect(await delivery(session.id)).toEqual({ status: 200 });
      expect(attempts).toBe(2);
      expect(cut).toContain(1);
    } finally {
      for (const t of timers) clearInterval(t);
    }
  });

  it('does not follow redirects, not even to a receiver it may call', async () => {
    const target = await receiver();
    let redirected = 0;
    const server = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => (++redirected <= 2 ? res.writeHead(307, { location: target.url }).end() : res.writeHead(200).end()));
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.2', r));
    const id = await agent('true', { webhook: { url: `http://127.0.0.2:${(server.address() as { port: number }).port}/moved` } });
    const { session } = await runSession(id);
    expect(await delivery(session.id)).toEqual({ status: 200 });
    expect([redirected, target.got.length]).toEqual([3, 0]);
  });
});
