import { randomBytes, createHash } from 'node:crypto';
import { HostClient } from '../../../sandbox/host-contract/client';
import { api, eventually, T, unique, withMongo } from '../../helpers/env';
import { runSdk } from '../../helpers/sdk';
import { newSandbox } from '../../helpers/sandboxes';
import { startServer, viaHost, wsViaHost } from '../../helpers/previews';

const DOMAIN = 'preview.localhost';

/** Waits until the server inside the sandbox answers through the proxy (exec start is asynchronous). */
async function ready(hostname: string, headers: Record<string, string> = {}): Promise<void> {
  await eventually(async () => (await viaHost(hostname, '/ready', { headers })).status === 200, 20_000, 100);
}

describe('preview URLs through the proxy', () => {
  let sb: string;
  let other: string;

  beforeAll(async () => {
    [sb, other] = await Promise.all([newSandbox(), newSandbox()]);
    await Promise.all([startServer(sb, 8000), startServer(sb, 8001), startServer(sb, 8002), startServer(other, 8000)]);
  });

  it('works with the published OpenComputer client: create, list, delete', async () => {
    const out = await runSdk(`
      const s = await sdk.Sandbox.connect(${JSON.stringify(sb)}, opts);
      const created = await s.createPreviewURL({ port: 8000 });
      const listed = await s.listPreviewURLs();
      out({ created, listed });
    `);
    expect(out.created).toEqual({
      id: expect.stringMatching(/^pv-[a-z0-9]+$/),
      sandboxId: sb,
      orgId: 'default',
      hostname: `${sb}-p8000.${DOMAIN}`,
      port: 8000,
      sslStatus: 'none',
      authConfig: {},
      createdAt: expect.any(String),
    });
    expect(out.listed).toEqual([out.created]);
    const hostname = out.created.hostname as string;
    await ready(hostname);

    const got = await viaHost(hostname, '/hello?x=1');
    expect(got.status).toBe(200);
    expect(got.json).toMatchObject({ port: 8000, sandbox: sb, method: 'GET', url: '/hello?x=1', host: hostname, forwardedFor: '127.0.0.1' });
    const posted = await viaHost(hostname, '/echo', { method: 'POST', body: 'payload-'.repeat(10_000), headers: { 'content-type': 'text/plain' } });
    expect(posted.json).toMatchObject({ method: 'POST', body: 'payload-'.repeat(10_000) });

    // Requests for any other host still reach the API, on the same port.
    expect((await api('GET', `/api/sandboxes/${sb}/preview`)).status).toBe(200);

    await runSdk(`const s = await sdk.Sandbox.connect(${JSON.stringify(sb)}, opts); await s.deletePreviewURL(8000); out(await s.listPreviewURLs());`);
    // Deleted: 404 at once, with the error body.
    const gone = await viaHost(hostname, '/hello');
    expect(gone.status).toBe(404);
    expect(gone.json).toEqual({ error: { type: 'not_found', message: expect.stringContaining(hostname) } });
    expect((await api('GET', `/api/sandboxes/${sb}/preview`)).body).toEqual([]);
    expect((await api('DELETE', `/api/sandboxes/${sb}/preview/8000`)).status).toBe(404);
  });

  it('streams responses as the sandbox writes them', async () => {
    const { body } = await api('POST', `/api/sandboxes/${sb}/preview`, { body: { port: 8001 } });
    await ready(body.hostname);
    const http = await import('node:http');
    const url = new URL(process.env.SAP_TEST_API_URL!);
    // The sandbox writes a first line, and its end only once a second request has come, which is
    // sent when the first line has arrived: a proxy that held the response back until its end would
    // never pass the first line on (the test would run out of time instead of passing).
    const get = (p: string, onResponse: (res: import('node:http').IncomingMessage) => void, onError: (err: Error) => void) =>
      http.get({ host: url.hostname, port: url.port, path: p, headers: { host: body.hostname } }, onResponse).on('error', onError);
    const text = await new Promise<string>((resolve, reject) => {
      let got = '';
      let asked = false;
      get(
        '/gated',
        (res) => {
          res.on('data', (c: Buffer) => {
            got += c.toString();
            if (!asked && got.includes('first\n')) {
              asked = true;
              get('/open-gate', (r) => r.resume(), reject);
            }
          });
          res.on('end', () => resolve(got));
        },
        reject,
      );
    });
    expect(text).toBe('first\nsecond\n');
  });

  it('carries WebSocket upgrades to the sandbox', async () => {
    const hostname = `${sb}-p8001.${DOMAIN}`;
    await ready(hostname);
    const ws = wsViaHost(hostname, '/socket');
    const messages: string[] = [];
    await new Promise<void>((resolve, reject) => {
      ws.on('open', () => {
        ws.send('one');
        ws.send('two');
      });
      ws.on('message', (m) => {
        messages.push(m.toString());
        if (messages.length === 2) resolve();
      });
      ws.on('error', reject);
    });
    expect(messages).toEqual(['echo:one', 'echo:two']);
    ws.close();
  });

  it('requires the bearer token before anything reaches the sandbox', async () => {
    const created = await api('POST', `/api/sandboxes/${sb}/preview`, { body: { port: 8002, authConfig: { type: 'bearer' } } });
    expect(created.status).toBe(201);
    const token = created.body.authConfig.token as string;
    expect(token.length).toBeGreaterThanOrEqual(32);
    const hostname = created.body.hostname as string;
    // Returned once: the list shows the type only, and only a hash is stored.
    const listed = await api('GET', `/api/sandboxes/${sb}/preview`);
    expect(listed.body.find((p: any) => p.port === 8002).authConfig).toEqual({ type: 'bearer' });
    const stored = await withMongo((c) =>
      c
        .db()
        .collection('previews')
        .findOne({ _id: hostname as never }),
    );
    expect(JSON.stringify(stored)).not.toContain(token);

    await ready(hostname, { authorization: `Bearer ${token}` });
    const none = await viaHost(hostname, '/secret');
    expect(none.status).toBe(401);
    expect(none.json).toEqual({ error: { type: 'unauthorized', message: expect.stringMatching(/Bearer/) } });
    expect((await viaHost(hostname, '/secret', { headers: { authorization: 'Bearer wrong-token-wrong-token' } })).status).toBe(401);
    const ok = await viaHost(hostname, '/secret', { headers: { authorization: `Bearer ${token}` } });
    expect(ok.status).toBe(200);
    // The token is not passed on to the sandbox.
    expect(ok.json).toMatchObject({ url: '/secret', authorization: null, previewToken: null });
    expect((await viaHost(hostname, '/x', { headers: { 'x-preview-token': token } })).status).toBe(200);

    // WebSockets too.
    const refused = await new Promise<number>((resolve) => {
      const ws = wsViaHost(hostname);
      ws.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0));
      ws.on('open', () => resolve(101));
      ws.on('error', () => undefined);
    });
    expect(refused).toBe(401);
    const ws = wsViaHost(hostname, '/', { authorization: `Bearer ${token}` });
    const echoed = await new Promise<string>((resolve, reject) => {
      ws.on('open', () => ws.send('hi'));
      ws.on('message', (m) => resolve(m.toString()));
      ws.on('error', reject);
    });
    expect(echoed).toBe('echo:hi');
    ws.close();

    // A caller's own token, on a custom domain.
    const own = 'my-own-token-0123456789';
    const custom = await api('POST', `/api/sandboxes/${sb}/preview`, {
      body: { port: 8002, domain: 'Apps.Example.com', authConfig: { type: 'bearer', token: own } },
    });
    expect(custom.status).toBe(201);
    expect(custom.body).toMatchObject({
      hostname: `${sb}-p8002.apps.example.com`,
      customHostname: `${sb}-p8002.apps.example.com`,
      sslStatus: 'none',
      authConfig: { type: 'bearer', token: own },
    });
    expect((await viaHost(custom.body.hostname, '/', { headers: { authorization: `Bearer ${own}` } })).status).toBe(200);
    expect((await viaHost(custom.body.hostname, '/', { headers: { authorization: `Bearer ${token}` } })).status).toBe(401);
  });

  it('validates the port, the token and the domain (400 naming the field), and refuses a second preview of a port', async () => {
    const bad: [unknown, RegExp][] = [
      [{ port: 0 }, /body\.port: must be 1 to 65535/],
      [{ port: 65536 }, /body\.port: must be 1 to 65535/],
      [{ port: 80.5 }, /body\.port: must be an integer/],
      [{ port: '80' }, /body\.port/],
      [{}, /body\.port/],
      [{ port: 80, authConfig: { type: 'bearer', token: 'short' } }, /body\.authConfig\.token: must be at least 16 characters/],
      [{ port: 80, authConfig: { type: 'basic' } }, /body\.authConfig\.type/],
      [{ port: 80, domain: 'not a domain' }, /body\.domain/],
    ];
    for (const [body, message] of bad) {
      const r = await api('POST', `/api/sandboxes/${sb}/preview`, { body });
      expect([r.status, r.body.error?.message]).toEqual([400, expect.stringMatching(message)]);
    }
    expect((await api('POST', `/api/sandboxes/${sb}/preview`, { body: { port: 8001 } })).status).toBe(409);
  });

  it('answers 404 for unknown hostnames and 502 with the error body when nothing listens', async () => {
    const unknown = await viaHost(`${sb}-p9999.${DOMAIN}`);
    expect(unknown.status).toBe(404);
    expect(unknown.json.error.type).toBe('not_found');
    const created = await api('POST', `/api/sandboxes/${sb}/preview`, { body: { port: 8999 } });
    expect(created.status).toBe(201);
    const dead = await viaHost(created.body.hostname);
    expect(dead.status).toBe(502);
    expect(dead.json).toEqual({ error: { type: 'bad_gateway', message: expect.stringContaining('port 8999') } });
  });

  it("keeps other sandboxes' ports unreachable: from inside a sandbox, and without a preview", async () => {
    const created = await api('POST', `/api/sandboxes/${other}/preview`, { body: { port: 8000 } });
    await ready(created.body.hostname);
    // sb's port 8002 and other's port 8000 both listen; from inside sb, other's server does not exist
    // (its own loopback only), and the forwarders' sockets on the host are not visible.
    const probe = `
      const net = require('net');
      const tryPort = (p) => new Promise((r) => { const s = net.connect(p, '127.0.0.1'); s.on('connect', () => { s.destroy(); r('open'); }); s.on('error', (e) => r(e.code)); });
      (async () => console.log(JSON.stringify({ own: await tryPort(8002), absent: await tryPort(8003), fwd: require('fs').existsSync(process.argv[1]) })))();`;
    const socketPath = await new HostClient({ url: T.hostUrl(), token: T.hostToken() }).openPortForward(other, 8000);
    const run = await api('POST', `/api/sandboxes/${sb}/exec/run`, { body: { cmd: 'node', args: ['-e', probe, socketPath], timeout: 20 } });
    expect(run.status).toBe(200);
    expect(JSON.parse(run.body.stdout)).toEqual({ own: 'open', absent: 'ECONNREFUSED', fwd: false });
    // other's 8000 is not sb's 8000: each preview reaches its own sandbox.
    const a = await viaHost(created.body.hostname, '/who');
    expect(a.json).toMatchObject({ port: 8000, sandbox: other, host: created.body.hostname });
    // A port of `other` without a preview cannot be reached through the proxy either.
    expect((await viaHost(`${other}-p8001.${DOMAIN}`)).status).toBe(404);
  });

  it("hides another organisation's sandbox (404)", async () => {
    const key = `sap_${randomBytes(18).toString('base64url')}`;
    const orgId = unique('pv-org');
    await withMongo(async (c) => {
      await c
        .db()
        .collection('orgs')
        .insertOne({ _id: orgId as never, name: orgId, createdAt: new Date(), settings: {} });
      await c
        .db()
        .collection('api_keys')
        .insertOne({ _id: createHash('sha256').update(key).digest('hex') as never, orgId, label: 't', prefix: 'sap_', createdAt: new Date() });
    });
    expect((await api('POST', `/api/sandboxes/${sb}/preview`, { key, body: { port: 8000 } })).status).toBe(404);
    expect((await api('GET', `/api/sandboxes/${sb}/preview`, { key })).status).toBe(404);
    expect((await api('DELETE', `/api/sandboxes/${sb}/preview/8001`, { key })).status).toBe(404);
  });

  it("removes a sandbox's previews with it: one made on it, and those a delete cut short left", async () => {
    const record = (id: string) => withMongo((c) => c.db().collection<{ _id: string; noPreviews?: boolean; status: string }>('sandboxes').findOne({ _id: id }));
    const previewsOf = (id: string) => withMongo((c) => c.db().collection('previews').countDocuments({ sandboxId: id }));
    // A new sandbox's record says it has no preview (its delete then reads none); the view does not show it.
    const plain = await newSandbox();
    expect((await record(plain))?.noPreviews).toBe(true);
    expect((await api('GET', `/api/sandboxes/${plain}`)).body).not.toHaveProperty('noPreviews');
    expect((await api('DELETE', `/api/sandboxes/${plain}`)).status).toBe(200);

    // A preview's create marks the record first: the delete looks, and finds it.
    const withPreview = await newSandbox();
    const made = await api('POST', `/api/sandboxes/${withPreview}/preview`, { body: { port: 8000 } });
    expect(made.status).toBe(201);
    expect((await record(withPreview))?.noPreviews).toBeUndefined();
    expect((await api('DELETE', `/api/sandboxes/${withPreview}`)).status).toBe(200);
    expect(await previewsOf(withPreview)).toBe(0);
    expect((await viaHost(made.body.hostname)).status).toBe(404);

    // A delete cut short after the record was marked stopped: deleting it again removes its previews.
    const cut = await newSandbox();
    const left = await api('POST', `/api/sandboxes/${cut}/preview`, { body: { port: 8000 } });
    expect(left.status).toBe(201);
    await new HostClient({ url: T.hostUrl(), token: T.hostToken() }).destroySandbox(cut);
    await withMongo((c) =>
      c
        .db()
        .collection<{ _id: string }>('sandboxes')
        .updateOne({ _id: cut }, { $set: { status: 'stopped' } }),
    );
    expect(await previewsOf(cut)).toBe(1);
    expect((await api('DELETE', `/api/sandboxes/${cut}`)).status).toBe(200);
    expect(await previewsOf(cut)).toBe(0);
    expect((await viaHost(left.body.hostname)).status).toBe(404);
  });
});
