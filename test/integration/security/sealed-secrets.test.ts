/**
 * Sealed secrets (docs/sealed-secrets.md) against real sandboxes and netns test hosts: a store
 * secret with allowedHosts reaches the sandbox as a placeholder; the host's egress proxy swaps it
 * for the value on requests to its allowed host only. The fake Messages API on a test host speaks
 * TLS with a leaf of the test CA (SANDBOX_SEAL_TRUST_FILE); names come from the fake DNS upstream.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { api, control, eventually, unique } from '../../helpers/env';
import { FakeDns } from '../../helpers/fake-dns';
import { newSandbox, run } from '../../helpers/sandboxes';
import { attachReady } from '../../helpers/exec';
import { otherOrgKey } from '../../helpers/checkpoints';
import { bashAgentsDeletedAfterAll, startSession, waitForStatus } from '../../helpers/sessions';
import { testLeaf } from '../../helpers/test-ca';
import { TestHost } from '../../helpers/test-host';
import { filesHolding } from '../../helpers/files-holding';

const FAKE_SCRIPT = path.join(__dirname, '..', '..', 'helpers', 'fake-anthropic.js');
const KEY = `sk-ant-sealed-${randomBytes(12).toString('hex')}`;
const OTHER_KEY = `other-${randomBytes(12).toString('hex')}`;
const PLAIN = `plain-${randomBytes(8).toString('hex')}`;
const API_HOST = 'api.sealed.sap-net.test';
const OTHER_HOST = 'other.sealed.sap-net.test';
/** Another name on the API host's address (a CDN's shape): no secret is for it. */
const SHARED_HOST = 'cdn.shared.sap-net.test';
const STORE = unique('sealed');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'sap-sealed-'));
const LOG_API = path.join(tmp, 'api.ndjson');
const LOG_OTHER = path.join(tmp, 'other.ndjson');
const dns = new FakeDns();
const hosts: TestHost[] = [];
const created: { id: string; key?: string }[] = [];
const newAgent = bashAgentsDeletedAfterAll();
let otherKey = '';
let otherStore = '';

type Logged = { method: string; path: string; keyOk: boolean; host?: string; headers: Record<string, string> };
const logOf = (file: string): Logged[] =>
  (fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as Logged);

/** A fake Messages API on a test host of its own, over TLS for `name`, accepting `key` only. */
async function fakeApi(name: string, key: string, log: string): Promise<TestHost> {
  const h = new TestHost('198.18');
  hosts.push(h);
  const leaf = testLeaf(name);
  const child = h.spawn(process.execPath, [
    FAKE_SCRIPT,
    '--host',
    h.addr,
    '--port',
    '443',
    '--log',
    log,
    '--key',
    key,
    '--cert',
    leaf.cert,
    '--cert-key',
    leaf.key,
  ]);
  await new Promise<void>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('{"listening":443}')) resolve();
    });
    child.once('exit', (code) => reject(new Error(`fake API for ${name} exited (${code})`)));
  });
  dns.set(name, h.addr);
  return h;
}

/** A node script in the sandbox: POST /v1/messages to `host` with x-api-key from `$envName`; prints status and body. */
const postFrom = (host: string, envName: string, scheme = 'https') =>
  `node -e 'fetch("${scheme}://${host}/v1/messages",{method:"POST",headers:{"x-api-key":process.env.${envName},"content-type":"application/json","anthropic-version":"2023-06-01"},body:JSON.stringify({model:"m",max_tokens:5,messages:[{role:"user",content:"hi"}]})}).then(async r=>console.log(r.status, await r.text())).catch(e=>{console.log("ERR", e.cause?.code ?? e.message)})'`;

/**
 * A node script in the sandbox: POST /v1/messages to `host`, x-api-key from `$keyEnv`, and `$bodyEnv`'s
 * placeholder in the body's metadata. mode small: one write with a content-length; split: chunked,
 * the placeholder cut in two writes 300 ms apart; big: a content-length body larger than 64 KiB.
 */
const bodyFrom = (host: string, keyEnv: string, bodyEnv: string, mode: 'small' | 'split' | 'big') => {
  const js = `const https = require("https");
const p = process.env.${bodyEnv};
const body = JSON.stringify({ model: "m", max_tokens: 5, metadata: { user_id: p }, messages: [{ role: "user", content: "hi" + "x".repeat(${mode === 'big' ? 100_000 : 0}) }] });
const headers = { "x-api-key": process.env.${keyEnv}, "content-type": "application/json", "anthropic-version": "2023-06-01" };
if ("${mode}" !== "split") headers["content-length"] = Buffer.byteLength(body);
const req = https.request({ host: "${host}", path: "/v1/messages", method: "POST", headers }, (res) => {
  let t = ""; res.on("data", (d) => (t += d)); res.on("end", () => console.log(res.statusCode, t));
});
req.on("error", (e) => console.log("ERR", e.code || e.message));
if ("${mode}" === "split") { const cut = body.indexOf(p) + 20; req.write(body.slice(0, cut)); setTimeout(() => req.end(body.slice(cut)), 300); } else req.end(body);`;
  return `echo ${Buffer.from(js).toString('base64')} | base64 -d > /tmp/body.js && node /tmp/body.js`;
};

/** Whether anything the sandbox can read holds `secret`: every process's environ, and its files outside /usr, /opt, /proc, /sys, /dev. */
async function leaks(sb: string, secret: string, key?: string): Promise<string> {
  const b64 = Buffer.from(secret).toString('base64');
  const script = `K=$(echo ${b64} | base64 -d); { grep -lasF "$K" /proc/[0-9]*/environ; grep -rlasF "$K" /etc /workspace /root /home /tmp /var /run /srv /mnt; } | head; true`;
  const r = await api('POST', `/api/sandboxes/${sb}/exec/run`, { body: { cmd: 'bash', args: ['-c', script], timeout: 60 }, key });
  if (r.status !== 200) throw new Error(`leak check: ${r.status} ${JSON.stringify(r.body)}`);
  return (r.body.stdout as string).trim();
}

beforeAll(async () => {
  await dns.listen();
  const apiHost = await fakeApi(API_HOST, KEY, LOG_API);
  dns.set(SHARED_HOST, apiHost.addr);
  await fakeApi(OTHER_HOST, OTHER_KEY, LOG_OTHER);
  expect((await api('POST', '/api/secret-stores', { body: { name: STORE } })).status).toBe(201);
  const put = (name: string, body: Record<string, unknown>) => api('PUT', `/api/secret-stores/${STORE}/secrets/${name}`, { body });
  // Its value may go into the x-api-key header and into bodies (the body tests below).
  expect((await put('ANTHROPIC_API_KEY', { value: KEY, allowedHosts: [API_HOST], injectInto: ['x-api-key', 'body'] })).status).toBe(200);
  expect((await put('OTHER_TOKEN', { value: OTHER_KEY, allowedHosts: ['*.sealed.sap-net.test'] })).status).toBe(200);
  expect((await put('PLAIN_VAR', { value: PLAIN })).status).toBe(200);
}, 120_000);

afterAll(async () => {
  for (const c of created) await api('DELETE', `/api/sandboxes/${c.id}`, { key: c.key }).catch(() => undefined);
  await api('DELETE', `/api/secret-stores/${STORE}`).catch(() => undefined);
  if (otherStore) await api('DELETE', `/api/secret-stores/${otherStore}`, { key: otherKey }).catch(() => undefined);
  for (const h of hosts) h.remove();
  await dns.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('sealed secrets', () => {
  let sb = '';
  let placeholder = '';

  it('allowedHosts are validated and bounded; answers show hosts, never values', async () => {
    const put = (body: Record<string, unknown>) => api('PUT', `/api/secret-stores/${STORE}/secrets/BAD`, { body });
    for (const bad of [['1.2.3.4'], ['*'], ['localhost'], ['a b.test'], ['x'.repeat(300)], Array.from({ length: 33 }, (_, i) => `h${i}.test`)]) {
      const r = await put({ value: 'v', allowedHosts: bad });
      expect(r.status).toBe(400);
      expect(r.body.error.type).toBe('invalid_request');
    }
    const list = await api('GET', `/api/secret-stores/${STORE}/secrets`);
    expect(list.body.find((e: { name: string }) => e.name === 'ANTHROPIC_API_KEY')).toMatchObject({ allowedHosts: [API_HOST] });
    expect(list.body.find((e: { name: string }) => e.name === 'PLAIN_VAR')).toMatchObject({ allowedHosts: [] });
    expect(JSON.stringify(list.body)).not.toContain(KEY);
  });

  it('the sandbox holds a placeholder; the proxy swaps it toward its host only; a plain secret stays plain', async () => {
    sb = await newSandbox({ secretStore: STORE });
    created.push({ id: sb });
    const env = JSON.parse((await run(sb, 'node -e "console.log(JSON.stringify(process.env))"')).stdout) as Record<string, string>;
    placeholder = env.ANTHROPIC_API_KEY!;
    expect(placeholder).toMatch(/^osb_sealed_[0-9a-f]{32}$/);
    expect(env.OTHER_TOKEN).toMatch(/^osb_sealed_[0-9a-f]{32}$/);
    expect(env.OTHER_TOKEN).not.toBe(placeholder);
    expect(env.PLAIN_VAR).toBe(PLAIN);
    expect(env.NODE_EXTRA_CA_CERTS).toBe('/etc/ssl/osb-sealed-ca.pem');

    // To its host: the fake gets the real key (it answers 401 to any other).
    const ok = await run(sb, postFrom(API_HOST, 'ANTHROPIC_API_KEY'), { timeout: 60 });
    expect(ok.stdout).toMatch(/^200 /);
    expect(
      logOf(LOG_API)
        .filter((r) => r.path === '/v1/messages')
        .map((r) => r.keyOk),
    ).toEqual([true]);

    // The same placeholder toward another host that the proxy intercepts: refused, never forwarded.
    const before = logOf(LOG_OTHER).length;
    const refused = await run(sb, postFrom(OTHER_HOST, 'ANTHROPIC_API_KEY'), { timeout: 60 });
    expect(refused.stdout).toMatch(/^403 .*sealed_secret_refused.*ANTHROPIC_API_KEY/);
    expect(logOf(LOG_OTHER).length).toBe(before);
    // Never in clear: over plain HTTP to its own host, refused before anything is sent.
    expect((await run(sb, postFrom(API_HOST, 'ANTHROPIC_API_KEY', 'http'), { timeout: 60 })).stdout).toMatch(/^403 .*only sent over HTTPS/);
    // The wildcard secret may go to both.
    expect((await run(sb, postFrom(OTHER_HOST, 'OTHER_TOKEN'), { timeout: 60 })).stdout).toMatch(/^200 /);
    expect(
      logOf(LOG_OTHER)
        .filter((r) => r.path === '/v1/messages')
        .map((r) => r.keyOk),
    ).toEqual([true]);

    // No process environment and no file the sandbox can read holds the key.
    expect(await leaks(sb, KEY)).toBe('');
    for (const p of [`/api/sandboxes/${sb}`, `/api/sandboxes/${sb}/allowed-hosts`, `/api/secret-stores/${STORE}`]) {
      expect(JSON.stringify((await api('GET', p)).body)).not.toContain(KEY);
    }
    expect((await api('GET', `/api/sandboxes/${sb}/allowed-hosts`)).body.perSecretAllowedHosts).toEqual({
      ANTHROPIC_API_KEY: [API_HOST],
      OTHER_TOKEN: ['*.sealed.sap-net.test'],
    });
  }, 180_000);

  it('placeholders in request bodies: swapped toward their host (small and chunked, split across writes), refused toward another', async () => {
    expect(sb).toMatch(/^sb-/);
    const bodies = (from: number) =>
      logOf(LOG_API)
        .slice(from)
        .filter((r) => r.path === '/v1/messages')
        .map((r) => ({ keyOk: r.keyOk, user: (r as Logged & { body: { metadata?: { user_id?: string } } }).body.metadata?.user_id }));
    for (const mode of ['small', 'split'] as const) {
      const before = logOf(LOG_API).length;
      expect((await run(sb, bodyFrom(API_HOST, 'ANTHROPIC_API_KEY', 'ANTHROPIC_API_KEY', mode), { timeout: 60 })).stdout).toMatch(/^200 /);
      expect(bodies(before)).toEqual([{ keyOk: true, user: KEY }]);
    }
    // Toward the other host (its own key in the header is fine there): the body's placeholder refuses the request; nothing is logged there.
    for (const mode of ['small', 'split', 'big'] as const) {
      const before = logOf(LOG_OTHER).length;
      const r = await run(sb, bodyFrom(OTHER_HOST, 'OTHER_TOKEN', 'ANTHROPIC_API_KEY', mode), { timeout: 60 });
      expect(r.stdout).toMatch(/^403 .*sealed_secret_refused.*ANTHROPIC_API_KEY/);
      expect(logOf(LOG_OTHER).length).toBe(before);
    }
    // A body too large to hold with a content-length cannot change length: refused, said so; chunked it works.
    const before = logOf(LOG_API).length;
    expect((await run(sb, bodyFrom(API_HOST, 'ANTHROPIC_API_KEY', 'ANTHROPIC_API_KEY', 'big'), { timeout: 60 })).stdout).toMatch(
      /^403 .*chunked or at most 65536/,
    );
    expect(bodies(before)).toEqual([]);
    expect(await leaks(sb, KEY)).toBe('');
  }, 180_000);

  it('a name sharing an address with a sealed host passes through the proxy untouched (its own certificate, nothing swapped)', async () => {
    expect(sb).toMatch(/^sb-/);
    // Raw TLS from the sandbox to each name (not verifying: the sandbox does not trust the test CA), a GET with the placeholder; the issuer and the answer.
    const js = `const tls = require("tls");
const one = (host) => new Promise((resolve) => {
  const s = tls.connect({ host, port: 443, servername: host, rejectUnauthorized: false, ALPNProtocols: ["http/1.1"] }, () => {
    const issuer = s.getPeerCertificate().issuer.CN;
    s.write("GET /v1/models HTTP/1.1\\r\\nhost: " + host + "\\r\\nx-api-key: " + process.env.ANTHROPIC_API_KEY + "\\r\\nconnection: close\\r\\n\\r\\n");
    let t = ""; s.on("data", (d) => (t += d)); s.on("end", () => resolve({ host, issuer, status: t.split(" ")[1] }));
  });
  s.on("error", (e) => resolve({ host, err: e.code || e.message }));
});
(async () => console.log(JSON.stringify([await one("${API_HOST}"), await one("${SHARED_HOST}")])))();`;
    const before = logOf(LOG_API).length;
    const out = await run(sb, `echo ${Buffer.from(js).toString('base64')} | base64 -d > /tmp/tls.js && node /tmp/tls.js`, { timeout: 60 });
    const [sealed, shared] = JSON.parse(out.stdout) as { host: string; issuer?: string; status?: string; err?: string }[];
    // The sealed name: terminated by the host's CA, the key swapped in (the fake knows no /v1/models: 404, after the key check).
    expect(sealed).toMatchObject({ issuer: expect.stringMatching(/^sealed secrets proxy CA/), status: '404' });
    // The other name: the upstream's own certificate; the placeholder reached it as it was (a wrong key there: 401).
    expect(shared).toMatchObject({ issuer: 'sap test CA', status: '401' });
    const got = logOf(LOG_API)
      .slice(before)
      .map((r) => [r.host, r.keyOk]);
    expect(got).toEqual([
      [API_HOST, true],
      [SHARED_HOST, false],
    ]);
  }, 120_000);

  it('a hibernated sandbox keeps its sealed secrets: once woken, the same placeholder, swapped toward its host only, no value inside', async () => {
    const id = await newSandbox({ secretStore: STORE });
    created.push({ id });
    const placeholderOf = async () => (await run(id, 'echo -n $ANTHROPIC_API_KEY')).stdout;
    const mine = await placeholderOf();
    expect(mine).toMatch(/^osb_sealed_[0-9a-f]{32}$/);
    expect((await api('POST', `/api/sandboxes/${id}/hibernate`)).body.status).toBe('hibernated');
    expect((await api('POST', `/api/sandboxes/${id}/wake`, { body: { timeout: 0 } })).status).toBe(200);
    expect(await placeholderOf()).toBe(mine);
    const before = logOf(LOG_API).length;
    expect((await run(id, postFrom(API_HOST, 'ANTHROPIC_API_KEY'), { timeout: 60 })).stdout).toMatch(/^200 /);
    expect((await run(id, bodyFrom(API_HOST, 'ANTHROPIC_API_KEY', 'ANTHROPIC_API_KEY', 'small'), { timeout: 60 })).stdout).toMatch(/^200 /);
    const sent = logOf(LOG_API)
      .slice(before)
      .filter((r) => r.path === '/v1/messages');
    expect(sent.map((r) => r.keyOk)).toEqual([true, true]);
    const otherBefore = logOf(LOG_OTHER).length;
    expect((await run(id, postFrom(OTHER_HOST, 'ANTHROPIC_API_KEY'), { timeout: 60 })).stdout).toMatch(/^403 .*sealed_secret_refused/);
    expect(logOf(LOG_OTHER).length).toBe(otherBefore);
    expect(await leaks(id, KEY)).toBe('');
  }, 180_000);

  it("another organisation's sandbox cannot use the first's placeholder", async () => {
    expect(placeholder).toMatch(/^osb_sealed_/);
    otherKey = await otherOrgKey();
    otherStore = unique('sealed-b');
    expect((await api('POST', '/api/secret-stores', { body: { name: otherStore, egressAllowlist: [API_HOST] }, key: otherKey })).status).toBe(201);
    expect((await api('PUT', `/api/secret-stores/${otherStore}/secrets/MINE`, { body: { value: 'theirs' }, key: otherKey })).status).toBe(200);
    const sb2 = await newSandbox({ secretStore: otherStore, envs: { STOLEN: placeholder } }, { key: otherKey });
    created.push({ id: sb2, key: otherKey });
    const before = logOf(LOG_API).length;
    const r = await api('POST', `/api/sandboxes/${sb2}/exec/run`, {
      body: { cmd: 'bash', args: ['-c', postFrom(API_HOST, 'STOLEN')], timeout: 60 },
      key: otherKey,
    });
    expect(r.body.stdout).toMatch(/^403 .*sealed_secret_refused/);
    expect(logOf(LOG_API).length).toBe(before);
    // Its own store's egressAllowlist sealed its secret for that host.
    expect(r.status).toBe(200);
    const mine = await api('POST', `/api/sandboxes/${sb2}/exec/run`, { body: { cmd: 'bash', args: ['-c', 'echo $MINE'] }, key: otherKey });
    expect(mine.body.stdout.trim()).toMatch(/^osb_sealed_/);
  }, 120_000);

  it('the Claude Agent SDK in the sandbox sends the placeholder over TLS; the fake receives the real key', async () => {
    const before = logOf(LOG_API).length;
    const sdkSb = await newSandbox({ secretStore: STORE, envs: { ANTHROPIC_BASE_URL: `https://${API_HOST}` } });
    created.push({ id: sdkSb });
    const start = await api('POST', `/api/sandboxes/${sdkSb}/agent`, { body: { prompt: 'sealed hello', model: 'claude-sonnet-4-5' } });
    expect(start.status).toBe(201);
    const a = await attachReady(sdkSb, start.body.sessionID as string);
    try {
      await a.until(() => a.text('stdout').includes('"turn_complete"'), 120_000);
      expect(a.text('stdout')).toContain('You said: sealed hello');
      expect(a.text('stdout')).not.toContain(KEY);
    } finally {
      a.ws.close();
      await api('POST', `/api/sandboxes/${sdkSb}/agent/${start.body.sessionID}/kill`, { body: {} });
    }
    const sent = logOf(LOG_API)
      .slice(before)
      .filter((l) => l.path === '/v1/messages');
    expect(sent.length).toBeGreaterThan(0);
    expect(sent.every((l) => l.keyOk)).toBe(true);
    expect(await leaks(sdkSb, KEY)).toBe('');
  }, 240_000);

  it('survives a restart of the sandbox host (adoption); no file of the stack holds the value in plain text', async () => {
    expect(sb).toMatch(/^sb-/);
    await control('kill', 'host', 'SIGKILL');
    await control('start', 'host');
    await eventually(async () => (await api('POST', `/api/sandboxes/${sb}/exec/run`, { body: { cmd: 'true' } })).status === 200, 60_000, 250);
    const before = logOf(LOG_API).length;
    expect((await run(sb, postFrom(API_HOST, 'ANTHROPIC_API_KEY'), { timeout: 60 })).stdout).toMatch(/^200 /);
    expect((await run(sb, postFrom(OTHER_HOST, 'ANTHROPIC_API_KEY'), { timeout: 60 })).stdout).toMatch(/^403 /);
    expect(
      logOf(LOG_API)
        .slice(before)
        .map((r) => r.keyOk),
    ).toEqual([true]);
    // The data dir (host state, sealed-secret records, FerretDB's and Temporal's files, logs) holds no plain value.
    const dataDir = process.env.SAP_TEST_DATA_DIR!;
    // The sandboxes' disk images (sparse ext4) included: filesHolding reads their written extents.
    expect(filesHolding(KEY, [dataDir, process.env.SAP_TEST_LOG_DIR ?? dataDir])).toEqual([]);
  }, 180_000);

  it('a /v1 session of an agent with the store: the entrypoint holds a placeholder that works toward its host only', async () => {
    const agent = await newAgent(
      `printf '{"key":"%s","api":"%s","other":"%s"}' "$ANTHROPIC_API_KEY" "$(${postFrom(API_HOST, 'ANTHROPIC_API_KEY')} | cut -c1-3)" "$(${postFrom(OTHER_HOST, 'ANTHROPIC_API_KEY')} | cut -c1-3)" > /tmp/agent_result.json`,
      { secret_store: STORE },
    );
    const s = await startSession(agent, { input: {} });
    const done = await waitForStatus(agent, s.id, ['completed', 'failed'], 120_000);
    expect(done.status).toBe('completed');
    const result = await api('GET', `/v1/agents/${agent}/sessions/${s.id}/result`);
    expect(JSON.stringify(result.body)).not.toContain(KEY);
    const out = (result.body.result ?? result.body) as { key: string; api: string; other: string };
    expect(JSON.stringify(out)).toMatch(/osb_sealed_[0-9a-f]{32}/);
    expect(JSON.stringify(out)).toContain('"api":"200"');
    expect(JSON.stringify(out)).toContain('"other":"403"');
    expect(JSON.stringify((await api('GET', `/v1/agents/${agent}/sessions/${s.id}`)).body)).not.toContain(KEY);
  }, 180_000);
});
