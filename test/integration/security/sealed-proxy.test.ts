/**
 * The sealed-secrets proxy under attack (issue 40, third pass; docs/threat-model.md, "The
 * sealed-secrets proxy's framing"): a raw client inside a real sandbox sends what a compromised agent
 * would, toward fake upstreams on netns test hosts that log every request they parse. Each test is
 * the attack: what the upstream logs shows that the value never left toward another host, never came
 * back, and that the proxy never reached the host itself.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { api, stackPid, T, unique } from '../../helpers/env';
import { FakeDns } from '../../helpers/fake-dns';
import { newSandbox, run } from '../../helpers/sandboxes';
import { testLeaf } from '../../helpers/test-ca';
import { TestHost } from '../../helpers/test-host';

const ECHO_SCRIPT = path.join(__dirname, '..', '..', 'helpers', 'echo-upstream.js');
const KEY = `sk-sealed-${randomBytes(12).toString('hex')}`;
const CUSTOM = `custom-${randomBytes(12).toString('hex')}`;
const API_HOST = 'api.proxy.sap-net.test';
const OTHER_HOST = 'other.proxy.sap-net.test';
/** A sealed name that resolves to one of the host's own addresses (the host end of a test host's link). */
const SELF_HOST = 'self.proxy.sap-net.test';
const STORE = unique('sealed-proxy');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'sap-sealed-proxy-'));
const LOG_API = path.join(tmp, 'api.ndjson');
const LOG_OTHER = path.join(tmp, 'other.ndjson');
const dns = new FakeDns();
const hosts: TestHost[] = [];
const servers: net.Server[] = [];
const created: string[] = [];
/** What the host's own services (on the host end of a test host's link) saw. */
const hostSaw: string[] = [];

type Logged = { method: string; url: string; rawHeaders: string[]; body: string };
const logOf = (file: string): Logged[] =>
  (fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as Logged);
/** The requests an upstream logged whose target holds `mark`. */
const seen = (file: string, mark: string) => logOf(file).filter((r) => r.url.includes(mark));

async function echoUpstream(name: string, log: string): Promise<TestHost> {
  const h = new TestHost('198.18');
  hosts.push(h);
  const leaf = testLeaf(name);
  const child = h.spawn(process.execPath, [ECHO_SCRIPT, '--host', h.addr, '--port', '443', '--log', log, '--cert', leaf.cert, '--cert-key', leaf.key]);
  await new Promise<void>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('{"listening":443}')) resolve();
    });
    child.once('exit', (code) => reject(new Error(`echo upstream for ${name} exited (${code})`)));
  });
  dns.set(name, h.addr);
  return h;
}

interface Case {
  id: string;
  /** The request's raw bytes; `${NAME}` is replaced, in the sandbox, by its environment variable NAME. */
  raw: string;
  tls?: boolean;
  /** The name to connect to (and the TLS server name); default API_HOST. */
  to?: string;
  /** Connect to this address instead of resolving `to` (an address the sandbox learnt earlier); `to` stays the server name. */
  addr?: string;
}
interface Answer {
  id: string;
  status?: number;
  text?: string;
  err?: string;
}

/**
 * Sends each case's raw bytes on a connection of its own from inside the sandbox (TLS verified
 * against the sandbox's trust, which holds the host's sealed CA) and reads the answer until the
 * connection ends (every case asks `connection: close`, or is refused and closed).
 */
async function rawFrom(sb: string, cases: Case[]): Promise<Record<string, Answer>> {
  const js = `const tls = require("tls"), net = require("net");
const cases = JSON.parse(Buffer.from(process.argv[2], "base64").toString());
// A chunked answer's body without its framing (so that a value cut by chunk lines is still seen whole).
const unchunk = (t) => {
  const at = t.indexOf("\\r\\n\\r\\n");
  if (at < 0 || !/^transfer-encoding: *chunked/im.test(t.slice(0, at))) return t;
  let rest = t.slice(at + 4), body = "";
  for (;;) {
    const nl = rest.indexOf("\\r\\n");
    const n = parseInt(rest.slice(0, nl), 16);
    if (nl < 0 || !(n > 0)) break;
    body += rest.slice(nl + 2, nl + 2 + n);
    rest = rest.slice(nl + 2 + n + 2);
  }
  return t.slice(0, at + 4) + body;
};
const one = (c) => new Promise((resolve) => {
  const host = c.to || "${API_HOST}";
  let raw = c.raw.replace(/\\$\\{(\\w+)\\}/g, (_, n) => process.env[n] || "");
  const at = raw.indexOf("\\r\\n\\r\\n");
  raw = raw.replace("__LEN__", String(Buffer.byteLength(raw.slice(at + 4))));
  // <<<text>>>: one chunk of a chunked body, sized after the substitution.
  raw = raw.replace(/<<<([\\s\\S]*?)>>>/g, (_, t) => Buffer.byteLength(t).toString(16) + "\\r\\n" + t + "\\r\\n");
  const dest = c.addr || host;
  const s = c.tls === false ? net.connect({ host: dest, port: 80 }) : tls.connect({ host: dest, port: 443, servername: host, ALPNProtocols: ["http/1.1"] });
  let t = "";
  const done = (err) => { clearTimeout(timer); s.destroy(); const m = /^HTTP\\/1\\.1 (\\d{3})/.exec(t); resolve({ id: c.id, status: m ? Number(m[1]) : undefined, text: unchunk(t), ...(err ? { err } : {}) }); };
  const timer = setTimeout(() => done("timeout"), 20000);
  s.once(c.tls === false ? "connect" : "secureConnect", () => s.write(raw));
  s.on("data", (d) => (t += d.toString("latin1")));
  s.on("end", () => done());
  s.on("error", (e) => done(e.code || e.message));
});
(async () => { const out = []; for (const c of cases) out.push(await one(c)); console.log(JSON.stringify(out)); })();`;
  const arg = Buffer.from(JSON.stringify(cases)).toString('base64');
  const script = `echo ${Buffer.from(js).toString('base64')} | base64 -d > /tmp/raw.js && node /tmp/raw.js ${arg}`;
  const r = await run(sb, script, { timeout: 120 });
  if (!r.stdout.trim().startsWith('[')) throw new Error(`the raw client failed: ${r.stdout} ${r.stderr}`);
  const list = JSON.parse(r.stdout) as Answer[];
  return Object.fromEntries(list.map((a) => [a.id, a]));
}

const get = (target: string, headers: string[], host = API_HOST) =>
  `GET ${target} HTTP/1.1\r\nHost: ${host}\r\n${headers.map((h) => `${h}\r\n`).join('')}connection: close\r\n\r\n`;
/** One chunk of a chunked body (sized in the sandbox, after `${NAME}` is replaced there). */
const chunk = (s: string) => `<<<${s}>>>`;

let sb = '';
let selfHost: TestHost;
let apiHost: TestHost;

beforeAll(async () => {
  await dns.listen();
  apiHost = await echoUpstream(API_HOST, LOG_API);
  await echoUpstream(OTHER_HOST, LOG_OTHER);
  // The host's own services, on an address of the host's that is not in a refused range.
  selfHost = new TestHost('198.18');
  hosts.push(selfHost);
  const web = http.createServer((req, res) => {
    hostSaw.push(`http ${req.url}`);
    res.end('host service');
  });
  const raw443 = net.createServer((s) => {
    hostSaw.push('tcp 443');
    s.destroy();
  });
  servers.push(web, raw443);
  await new Promise<void>((resolve) => web.listen(80, selfHost.hostAddr, resolve));
  await new Promise<void>((resolve) => raw443.listen(443, selfHost.hostAddr, resolve));
  dns.set(SELF_HOST, selfHost.hostAddr);

  expect((await api('POST', '/api/secret-stores', { body: { name: STORE } })).status).toBe(201);
  const put = (name: string, body: Record<string, unknown>) => api('PUT', `/api/secret-stores/${STORE}/secrets/${name}`, { body });
  // The default places (auth headers only), for the API host and the host-address name.
  expect((await put('SEALED_KEY', { value: KEY, allowedHosts: [API_HOST, SELF_HOST] })).status).toBe(200);
  expect((await put('CUSTOM_KEY', { value: CUSTOM, allowedHosts: [API_HOST], injectInto: ['X-Custom-Auth'] })).status).toBe(200);
  sb = await newSandbox({ secretStore: STORE });
  created.push(sb);
}, 180_000);

afterAll(async () => {
  for (const id of created) await api('DELETE', `/api/sandboxes/${id}`).catch(() => undefined);
  await api('DELETE', `/api/secret-stores/${STORE}`).catch(() => undefined);
  for (const s of servers) s.close();
  for (const h of hosts) h.remove();
  await dns.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('sealed-secrets proxy: it forwards exactly the request it checked', () => {
  it('the secret says where its value goes; the API validates it, shows it, and gives the default to secrets without one', async () => {
    const put = (body: Record<string, unknown>) => api('PUT', `/api/secret-stores/${STORE}/secrets/BAD`, { body });
    for (const bad of [['host'], ['content-length'], ['x-forwarded-host'], ['a b'], [], Array.from({ length: 17 }, (_, i) => `h${i}`)]) {
      const r = await put({ value: 'v', allowedHosts: [API_HOST], injectInto: bad });
      expect(r.status).toBe(400);
      expect(r.body.error.type).toBe('invalid_request');
    }
    const list = (await api('GET', `/api/secret-stores/${STORE}/secrets`)).body as { name: string; injectInto: string[] }[];
    expect(list.find((e) => e.name === 'CUSTOM_KEY')!.injectInto).toEqual(['x-custom-auth']);
    expect(list.find((e) => e.name === 'SEALED_KEY')!.injectInto).toEqual(expect.arrayContaining(['authorization', 'x-api-key']));
    expect(list.find((e) => e.name === 'SEALED_KEY')!.injectInto).not.toContain('body');
  });

  it('absolute-form targets (https://other…, http://other:80/…) on a connection to the allowed host are refused, never forwarded', async () => {
    const got = await rawFrom(sb, [
      { id: 'https', raw: get(`https://${OTHER_HOST}/abs-https`, ['x-api-key: ${SEALED_KEY}']) },
      { id: 'http80', raw: get(`http://${OTHER_HOST}:80/abs-http80`, ['x-api-key: ${SEALED_KEY}']) },
      { id: 'self', raw: get(`https://${API_HOST}/abs-self`, ['x-api-key: ${SEALED_KEY}']) },
      { id: 'authority', raw: get(`//${OTHER_HOST}/abs-slashes`, ['x-api-key: ${SEALED_KEY}']) },
    ]);
    // What the upstream received first (before, each arrived there with the value in it), then the answers.
    expect(seen(LOG_API, 'abs-')).toEqual([]);
    for (const id of ['https', 'http80', 'self', 'authority']) expect(got[id]).toMatchObject({ status: 403 });
    expect(got.https!.text).toContain('sealed_secret_refused');
  }, 180_000);

  it('two Host headers, a Host on another port, or a Host other than the server name are refused; forwarded headers are dropped', async () => {
    const got = await rawFrom(sb, [
      { id: 'two', raw: `GET /two-hosts HTTP/1.1\r\nHost: ${API_HOST}\r\nHost: ${OTHER_HOST}\r\nx-api-key: \${SEALED_KEY}\r\nconnection: close\r\n\r\n` },
      { id: 'port', raw: get('/host-port', ['x-api-key: ${SEALED_KEY}'], `${API_HOST}:8443`) },
      { id: 'sni', raw: get('/host-sni', ['x-api-key: ${SEALED_KEY}'], OTHER_HOST) },
      {
        id: 'fwd',
        raw: get('/forwarded', [
          `X-Forwarded-Host: ${OTHER_HOST}`,
          `Forwarded: host=${OTHER_HOST};proto=https`,
          'X-Forwarded-For: 203.0.113.9',
          `X-Original-Host: ${OTHER_HOST}`,
          'x-api-key: ${SEALED_KEY}',
        ]),
      },
    ]);
    expect(seen(LOG_API, '/two-hosts')).toEqual([]);
    expect(seen(LOG_API, '/host-port')).toEqual([]);
    expect(seen(LOG_API, '/host-sni')).toEqual([]);
    for (const id of ['two', 'port', 'sni']) expect(got[id]).toMatchObject({ status: 403 });
    // Forwarded: exactly once, with the value, and without a header that names another host.
    expect(got.fwd).toMatchObject({ status: 200 });
    const fwd = seen(LOG_API, '/forwarded');
    expect(fwd).toHaveLength(1);
    const names = fwd[0]!.rawHeaders.filter((_, i) => i % 2 === 0).map((n) => n.toLowerCase());
    for (const n of ['x-forwarded-host', 'forwarded', 'x-forwarded-for', 'x-original-host']) expect(names).not.toContain(n);
    expect(JSON.stringify(fwd[0]!.rawHeaders)).not.toContain(OTHER_HOST);
    expect(fwd[0]!.rawHeaders).toContain(KEY);
  }, 180_000);

  it('a chunked GET or DELETE cannot smuggle a second request: the upstream parses exactly one, and the value is in neither body', async () => {
    const smuggled = (mark: string) => `GET /smuggled-${mark} HTTP/1.1\r\nHost: ${OTHER_HOST}\r\nx-api-key: \${SEALED_KEY}\r\n\r\n`;
    const te = (method: string, mark: string) =>
      `${method} /carrier-${mark} HTTP/1.1\r\nHost: ${API_HOST}\r\nTransfer-Encoding: chunked\r\nconnection: close\r\n\r\n${chunk(smuggled(mark))}0\r\n\r\n`;
    const got = await rawFrom(sb, [
      { id: 'get', raw: te('GET', 'get') },
      { id: 'delete', raw: te('DELETE', 'delete') },
      // Transfer-encodings other than chunked alone are refused.
      { id: 'te-gzip', raw: `POST /carrier-te HTTP/1.1\r\nHost: ${API_HOST}\r\nTransfer-Encoding: gzip, chunked\r\nconnection: close\r\n\r\n0\r\n\r\n` },
    ]);
    // Before, each carrier's body reached the upstream unframed and was parsed as a request of its own, value swapped in.
    expect(seen(LOG_API, '/smuggled-')).toEqual([]);
    expect(got.get).toMatchObject({ status: 200 });
    expect(got.delete).toMatchObject({ status: 200 });
    expect(got['te-gzip']).toMatchObject({ status: 403 });
    for (const mark of ['get', 'delete']) {
      const carried = seen(LOG_API, `/carrier-${mark}`);
      expect(carried).toHaveLength(1);
      // The body arrived as a body (framed), with the placeholder as it was (bodies are not a place of this secret).
      expect(carried[0]!.body).toContain(`/smuggled-${mark}`);
      expect(carried[0]!.body).toMatch(/osb_sealed_[0-9a-f]{32}/);
      expect(carried[0]!.body).not.toContain(KEY);
    }
    expect(seen(LOG_API, '/carrier-te')).toEqual([]);
    expect(logOf(LOG_OTHER)).toEqual([]);
  }, 180_000);

  it('a value is swapped only where its secret says: the default auth headers, or its own header; elsewhere the placeholder goes as it is', async () => {
    const body = '{"note":"${SEALED_KEY} ${CUSTOM_KEY}"}';
    const got = await rawFrom(sb, [
      {
        id: 'where',
        raw: `POST /where HTTP/1.1\r\nHost: ${API_HOST}\r\nAuthorization: Bearer \${SEALED_KEY}\r\nx-debug: \${SEALED_KEY}\r\nx-custom-auth: \${CUSTOM_KEY}\r\nx-api-key: \${CUSTOM_KEY}\r\ncontent-type: application/json\r\ncontent-length: __LEN__\r\nconnection: close\r\n\r\n${body}`,
      },
    ]);
    expect(got.where).toMatchObject({ status: 200 });
    const [r] = seen(LOG_API, '/where');
    const h = (name: string) => r!.rawHeaders[r!.rawHeaders.findIndex((x, i) => i % 2 === 0 && x.toLowerCase() === name) + 1];
    expect(h('authorization')).toBe(`Bearer ${KEY}`);
    expect(h('x-custom-auth')).toBe(CUSTOM);
    expect(h('x-debug')).toMatch(/^osb_sealed_[0-9a-f]{32}$/);
    expect(h('x-api-key')).toMatch(/^osb_sealed_[0-9a-f]{32}$/);
    expect(r!.body).not.toContain(KEY);
    expect(r!.body).not.toContain(CUSTOM);
  }, 180_000);

  it('an upstream that echoes the request never hands the value back: headers and bodies (plain, dripped, gzip) carry the placeholder', async () => {
    const got = await rawFrom(sb, [
      { id: 'plain', raw: get('/echo', ['x-api-key: ${SEALED_KEY}', 'x-custom-auth: ${CUSTOM_KEY}']) },
      { id: 'drip', raw: get('/echo?drip', ['x-api-key: ${SEALED_KEY}']) },
      { id: 'gzip', raw: get('/echo?gzip', ['x-api-key: ${SEALED_KEY}', 'accept-encoding: gzip']) },
    ]);
    // The upstream did get the value (the swap worked) ...
    expect(seen(LOG_API, '/echo').map((r) => r.rawHeaders.includes(KEY))).toEqual([true, true, true]);
    for (const id of ['plain', 'drip', 'gzip']) {
      const a = got[id]!;
      expect(a.status).toBe(200);
      // ... and the sandbox never sees it back: the echo (header x-echo and the body) holds the placeholder.
      expect(a.text).not.toContain(KEY);
      expect(a.text).not.toContain(CUSTOM);
      expect(a.text).toMatch(/x-echo: osb_sealed_[0-9a-f]{32}/i);
    }
    expect(got.plain!.text).toMatch(/"x-custom-auth","osb_sealed_[0-9a-f]{32}"/);
    expect(got.gzip!.text).toMatch(/"x-api-key","osb_sealed_[0-9a-f]{32}"/);
  }, 180_000);

  it("never reaches the host's own services: a sealed name resolving to an address of the host's is neither proxied on 80 nor on 443", async () => {
    const got = await rawFrom(sb, [
      { id: 'http', raw: get('/self', ['x-note: plain'], SELF_HOST), tls: false, to: SELF_HOST },
      { id: 'tls', raw: get('/self-tls', ['x-api-key: ${SEALED_KEY}'], SELF_HOST), to: SELF_HOST },
    ]);
    expect(got.http!.text ?? '').not.toContain('host service');
    expect(got.tls!.status).toBeUndefined();
    expect(hostSaw).toEqual([]);
  }, 180_000);

  it("the resolver and the proxy listen on the host's sandbox-facing service address only, not on 0.0.0.0: from the host's own addresses they are closed", async () => {
    const pid = stackPid('host');
    const apiPort = Number(new URL(T.hostUrl()).port);
    // The host process's listeners (ss: "<local address>:<port>" in the fourth column, the process in the last).
    const listeners = (proto: 't' | 'u') =>
      execFileSync('ss', [`-Hln${proto}p`], { encoding: 'utf8' })
        .split('\n')
        .filter((l) => l.includes(`pid=${pid},`))
        .map((l) => {
          const local = l.trim().split(/\s+/)[3]!;
          const at = local.lastIndexOf(':');
          return { address: local.slice(0, at), port: Number(local.slice(at + 1)) };
        })
        .filter((x) => x.port !== apiPort);
    const tcp = listeners('t');
    // The resolver: the port the process holds over both UDP and TCP (its other UDP sockets are its
    // unconnected upstream ones, on ephemeral ports); every TCP listener but the host's API is the resolver's or the proxy's.
    const udp = listeners('u').filter((u) => tcp.some((t) => t.port === u.port));
    expect(udp).toHaveLength(1);
    expect(tcp).toHaveLength(2);
    expect([...udp, ...tcp].filter((l) => ['0.0.0.0', '*', '[::]', '[::ffff:0.0.0.0]'].includes(l.address))).toEqual([]);
    // From the host's loopback and from a host address that is no sandbox link, every one of them is closed.
    const tcpRefused = (port: number, host: string) =>
      new Promise<string>((resolve) => {
        const s = net.connect({ port, host }, () => (s.destroy(), resolve('connected')));
        s.on('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
      });
    for (const { port } of tcp) {
      expect(await tcpRefused(port, '127.0.0.1')).toBe('ECONNREFUSED');
      expect(await tcpRefused(port, selfHost.hostAddr)).toBe('ECONNREFUSED');
    }
  }, 60_000);
});

describe("sealed-secrets proxy: its destinations obey the sandbox's own egress policy", () => {
  const setEgress = async (id: string, egress: unknown) => {
    const r = await api('PUT', `/api/sandboxes/${id}/network`, { body: { egress } });
    expect(r.status).toBe(200);
    expect(r.body.network).toEqual({ egress });
  };
  /** The header the upstream got for `mark`'s request (one request, or none). */
  const keyAt = (mark: string) =>
    seen(LOG_API, mark).map((r) => r.rawHeaders[r.rawHeaders.findIndex((x, i) => i % 2 === 0 && x.toLowerCase() === 'x-api-key') + 1]);
  let allowed = '';

  it('a policy that does not allow the sealed host (an allow list of another host, or none) reaches it neither by name nor by its address; allowed, the same request arrives with the value', async () => {
    const other = await newSandbox({ secretStore: STORE, network: { egress: { allow: [OTHER_HOST] } } }, { created });
    const none = await newSandbox({ secretStore: STORE, network: { egress: 'none' } }, { created });
    allowed = await newSandbox({ secretStore: STORE, network: { egress: { allow: [API_HOST] } } }, { created });
    const attempt = (mark: string): Case[] => [
      { id: 'name', raw: get(`/pol-${mark}-name`, ['x-api-key: ${SEALED_KEY}']) },
      { id: 'addr', raw: get(`/pol-${mark}-addr`, ['x-api-key: ${SEALED_KEY}']), addr: apiHost.addr },
    ];
    const refused = { other: await rawFrom(other, attempt('other')), none: await rawFrom(none, attempt('none')) };
    // The control: the same request, from a sandbox whose policy allows the host, arrives with the value swapped in.
    const ok = await rawFrom(allowed, attempt('allowed'));
    expect(keyAt('/pol-allowed-name')).toEqual([KEY]);
    expect(keyAt('/pol-allowed-addr')).toEqual([KEY]);
    expect(ok.name).toMatchObject({ status: 200 });
    expect(ok.addr).toMatchObject({ status: 200 });
    // Refused before the proxy: the name is not resolved for them (EAI_AGAIN), and their connection to
    // its address, never steered, meets the table (ECONNREFUSED).
    for (const mark of ['other', 'none']) expect(seen(LOG_API, `/pol-${mark}-`)).toEqual([]);
    for (const got of [refused.other, refused.none]) {
      expect(got.name).toEqual({ id: 'name', err: 'EAI_AGAIN', text: '' });
      expect(got.addr).toEqual({ id: 'addr', err: 'ECONNREFUSED', text: '' });
    }
    expect(logOf(LOG_OTHER)).toEqual([]);
  }, 300_000);

  it("the proxy follows a change of a running sandbox's policy: a connection still steered to it for the sealed host is refused once the policy no longer allows the host", async () => {
    expect(allowed).not.toBe('');
    // Under the allow list, the sandbox resolved the sealed host: its connections to that address go to the proxy.
    const byAddr = (mark: string): Case[] => [{ id: 'addr', raw: get(`/chg-${mark}`, ['x-api-key: ${SEALED_KEY}']), addr: apiHost.addr }];
    const before = await rawFrom(allowed, byAddr('before'));
    expect(before.addr).toMatchObject({ status: 200 });
    expect(keyAt('/chg-before')).toEqual([KEY]);

    // An allow list of another host, then none: the address is still steered to the proxy, which refuses.
    await setEgress(allowed, { allow: [OTHER_HOST] });
    const other = await rawFrom(allowed, byAddr('other'));
    await setEgress(allowed, 'none');
    const none = await rawFrom(allowed, byAddr('none'));

    // Allowed by name again: an address admitted under an old policy stays closed until the sandbox resolves the name again.
    await setEgress(allowed, { allow: [API_HOST] });
    const stale = await rawFrom(allowed, byAddr('stale'));
    // None of the three reached the upstream (checked together, so that a failure shows each that did).
    expect(['/chg-other', '/chg-none', '/chg-stale'].flatMap((m) => seen(LOG_API, m)).map((r) => r.url)).toEqual([]);
    for (const got of [other, none, stale]) {
      expect(got.addr).toMatchObject({ status: 403 });
      expect(got.addr!.text).toContain('sealed_secret_refused');
    }
    const again = await rawFrom(allowed, [{ id: 'name', raw: get('/chg-again', ['x-api-key: ${SEALED_KEY}']) }]);
    expect(again.name).toMatchObject({ status: 200 });
    expect(keyAt('/chg-again')).toEqual([KEY]);

    // internet: the address is reachable as it is.
    await setEgress(allowed, 'internet');
    const open = await rawFrom(allowed, byAddr('internet'));
    expect(open.addr).toMatchObject({ status: 200 });
    expect(keyAt('/chg-internet')).toEqual([KEY]);
    expect(logOf(LOG_OTHER)).toEqual([]);
  }, 300_000);
});
