import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import type { BenchCall } from './bench-spawn';

/**
 * `npm run bench -- seal [--n 2000] [--mb 512] [--runs 3] [--only proxy,create] [--base <checkout>]` (as root): what sealed secrets cost.
 *  - proxy: a kept-alive HTTPS GET through the sealed-secrets proxy (sandbox/seal/proxy.ts, in a
 *    process of its own, as in the host: TLS terminated with its CA's leaf, a placeholder swapped in
 *    a header, TLS again to the upstream) against the same GET straight to the upstream (a process
 *    of its own on 127.x:443), alternating blocks of 100; p50 of each and the added p50. Then a
 *    chunked stream of --mb MB through each (64 KiB chunks, as SSE would come), Mbit/s per run.
 *    The redirect of the table is not in this path (one nft rule: netfilter's cost, not the proxy's).
 *    A POST of a 1 KiB JSON body with the placeholder in the body too (swapped there: the body is held,
 *    searched and re-lengthed) against the same POST straight.
 *    --base <checkout>: also the proxy of another checkout (built), in the same alternating blocks: an A/B.
 *  - create: create → `node -v` through the API with a store holding the secret sealed, the same
 *    secret plain, and no store, --runs × 10 rounds in alternating orders; medians.
 */
/** Starts the proxy of the checkout at `root` (its dist/) as the host runs it, the client's address a sandbox holding one sealed secret. */
const proxyScript = (root: string, dir: string, clientAddr: string, name: string, placeholder: string, upstreamAddr: string) => `
  const { SealCa } = require(${JSON.stringify(path.join(root, 'dist/sandbox/seal/ca'))});
  const { SealProxy } = require(${JSON.stringify(path.join(root, 'dist/sandbox/seal/proxy'))});
  const net = require('node:net');
  const pino = require('pino');
  (async () => {
    const ca = new SealCa(${JSON.stringify(dir)});
    await ca.init('bench');
    const port = await new Promise((r) => { const s = net.createServer().listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => r(p)); }); });
    const proxy = new SealProxy({ port, ca, extraTrust: [require('fs').readFileSync(${JSON.stringify(path.join(dir, '..', 'upstream-ca.pem'))}, 'utf8')],
      refused: () => false, reachable: () => true, steer: async () => undefined, log: pino({ level: 'warn' }) });
    await proxy.start();
    proxy.register(${JSON.stringify(clientAddr)}, 'sb-bench', [{ placeholder: ${JSON.stringify(placeholder)}, name: 'KEY', hosts: [${JSON.stringify(name)}], inject: ['x-api-key', 'body'], box: 'x' }], () => 'the-real-key');
    await proxy.admit(${JSON.stringify(clientAddr)}, ${JSON.stringify(name)}, [${JSON.stringify(upstreamAddr)}], 3600);
    await ca.contextFor(${JSON.stringify(name)});
    console.log('READY ' + JSON.stringify({ port, ca: ca.certificate }));
  })();`;

export async function benchSeal(opts: {
  n: number;
  mb: number;
  runs: number;
  call: BenchCall;
  only?: string;
  base?: string;
}): Promise<Record<string, unknown>> {
  const parts = new Set((opts.only ?? 'proxy,create').split(','));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sap-bench-seal-'));
  const children: ChildProcess[] = [];
  const root = path.resolve(__dirname, '..', '..'); // dist/scripts → the checkout
  const upstreamAddr = `127.${77}.${1 + (randomBytes(1)[0]! % 200)}.1`;
  const clientAddr = '127.0.0.2';
  const name = 'api.bench-seal.test';
  const placeholder = `osb_sealed_${randomBytes(16).toString('hex')}`;
  const start = (script: string) =>
    new Promise<string>((resolve, reject) => {
      const c = spawn(process.execPath, ['-e', script], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
      children.push(c);
      let out = '';
      c.stdout!.on('data', (d: Buffer) => {
        out += d.toString();
        const line = out.split('\n').find((l) => l.startsWith('READY '));
        if (line) resolve(line.slice(6));
      });
      c.once('exit', (code) => reject(new Error(`a bench process exited (${code})`)));
    });
  try {
    // The upstream: its own CA (a SealCa in another directory) and a leaf for the name.
    const upCa = await start(`
      const { SealCa } = require('./dist/sandbox/seal/ca');
      const https = require('node:https');
      (async () => {
        const ca = new SealCa(${JSON.stringify(path.join(dir, 'upstream-ca'))});
        await ca.init('bench upstream');
        const ctx = await ca.contextFor(${JSON.stringify(name)});
        const chunk = Buffer.alloc(65536, 97);
        https.createServer({ SNICallback: (_n, cb) => cb(null, ctx) }, (req, res) => {
          if (req.url.startsWith('/stream')) {
            let left = Number(new URL(req.url, 'https://x').searchParams.get('mb')) * 16;
            res.writeHead(200, { 'content-type': 'text/event-stream' });
            const go = () => { while (left > 0) { left--; if (!res.write(chunk)) return res.once('drain', go); } res.end(); };
            return go();
          }
          let body = '';
          req.on('data', (d) => (body += d));
          req.on('end', () => {
            const ok = req.headers['x-api-key'] === 'the-real-key' && (req.method !== 'POST' || body.includes('"the-real-key"'));
            res.writeHead(ok ? 200 : 401, { 'content-type': 'text/plain' }).end(ok ? 'ok' : 'no');
          });
        }).listen(443, ${JSON.stringify(upstreamAddr)}, () => console.log('READY ' + JSON.stringify(ca.certificate)));
      })();`);
    const upstreamCaPem = JSON.parse(upCa) as string;
    fs.writeFileSync(path.join(dir, 'upstream-ca.pem'), upstreamCaPem);
    // The proxy, as the host runs it (and the base checkout's, for an A/B).
    const roots = [root, ...(opts.base ? [path.resolve(opts.base)] : [])];
    const proxies: { port: number; ca: string }[] = [];
    for (const [i, r] of roots.entries()) {
      proxies.push(
        JSON.parse(await start(proxyScript(r, path.join(dir, `proxy-ca-${i}`), clientAddr, name, placeholder, upstreamAddr))) as { port: number; ca: string },
      );
    }
    const agentFor = (p: { ca: string }) => new https.Agent({ keepAlive: true, maxSockets: 1, ca: p.ca, localAddress: clientAddr, servername: name });
    const viaProxies = proxies.map(agentFor);
    const direct = new https.Agent({ keepAlive: true, maxSockets: 1, ca: upstreamCaPem, servername: name });
    const send = (agent: https.Agent, host: string, port: number, p: string, key: string, body?: string) =>
      new Promise<{ ms: number; bytes: number; status: number }>((resolve, reject) => {
        const t0 = process.hrtime.bigint();
        let bytes = 0;
        const headers = { host: name, 'x-api-key': key, ...(body ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } : {}) };
        const req = https.request({ host, port, path: p, agent, method: body ? 'POST' : 'GET', headers }, (res) => {
          res.on('data', (d: Buffer) => (bytes += d.length));
          res.on('end', () => resolve({ ms: Number(process.hrtime.bigint() - t0) / 1e6, bytes, status: res.statusCode ?? 0 }));
          res.on('error', reject);
        });
        req.on('error', reject);
        req.end(body);
      });
    // A Messages-API-like JSON body of about 1 KiB with the key in it (the placeholder through the proxy).
    const jsonWith = (key: string) => JSON.stringify({ model: 'm', max_tokens: 5, metadata: { key }, messages: [{ role: 'user', content: 'x'.repeat(900) }] });
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)]!;
    const r3 = (x: number) => Math.round(x * 1000) / 1000;
    const out: Record<string, unknown> = { bench: 'seal', cores: os.cpus().length, ...(opts.base ? { base: path.resolve(opts.base) } : {}) };
    if (parts.has('proxy')) {
      for (const method of ['GET', 'POST'] as const) {
        const body = (key: string) => (method === 'POST' ? jsonWith(key) : undefined);
        const legs: [string, () => Promise<{ ms: number; status: number }>][] = [
          ...proxies.map(
            (p, i) =>
              [i ? 'base_proxy' : 'proxy', () => send(viaProxies[i]!, '127.0.0.1', p.port, '/small', placeholder, body(placeholder))] as [
                string,
                () => Promise<{ ms: number; status: number }>,
              ],
          ),
          ['direct', () => send(direct, upstreamAddr, 443, '/small', 'the-real-key', body('the-real-key'))],
        ];
        // (A base checkout older than body swapping answers the POST with the upstream's 401: the same path, timed the same.)
        const fine = (k: string, status: number) => status === 200 || (k === 'base_proxy' && status === 401);
        for (const [k, f] of legs) for (let i = 0; i < 50; i++) if (!fine(k, (await f()).status)) throw new Error(`warm-up ${method} ${k} failed`);
        const lat: Record<string, number[]> = Object.fromEntries(legs.map(([k]) => [k, []]));
        // Alternating blocks of 100, the order reversed every other block.
        for (let i = 0; i < opts.n; i += 100)
          for (const [k, f] of (i / 100) % 2 ? [...legs].reverse() : legs) for (let j = 0; j < 100; j++) lat[k]!.push((await f()).ms);
        const p50 = Object.fromEntries(Object.entries(lat).map(([k, xs]) => [`${k}_p50`, r3(median(xs))]));
        const added = Object.fromEntries(legs.filter(([k]) => k !== 'direct').map(([k]) => [`added_${k}_p50`, r3(median(lat[k]!) - median(lat.direct!))]));
        out[method === 'GET' ? 'https_request_ms' : 'https_post_1k_body_ms'] = { ...p50, ...added, n: lat.direct!.length };
      }
      const stream: Record<string, number[]> = { proxy: [], ...(opts.base ? { base_proxy: [] } : {}), direct: [] };
      for (let i = 0; i < opts.runs; i++) {
        const legs: [string, https.Agent, string, number, string][] = [
          ...proxies.map(
            (p, j) => [j ? 'base_proxy' : 'proxy', viaProxies[j]!, '127.0.0.1', p.port, placeholder] as [string, https.Agent, string, number, string],
          ),
          ['direct', direct, upstreamAddr, 443, 'the-real-key'],
        ];
        for (const [k, agent, host, port, key] of legs) {
          const x = await send(agent, host, port, `/stream?mb=${opts.mb}`, key);
          if (x.bytes !== opts.mb * 2 ** 20) throw new Error(`stream ${k}: ${x.bytes} bytes of ${opts.mb * 2 ** 20}`);
          stream[k]!.push(Math.round((x.bytes * 8) / (x.ms / 1000) / 1e6));
        }
      }
      out.stream_mbit_per_s = { ...stream, mb: opts.mb };
    }
    for (const a of [...viaProxies, direct]) a.destroy();
    if (parts.has('create')) out.create_node_v_ms = await benchCreate(opts.call, opts.runs * 10);
    return out;
  } finally {
    for (const c of children) c.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** create → `node -v` with a sealed store and without, alternating; medians (ms). */
async function benchCreate(call: BenchCall, n: number): Promise<Record<string, number>> {
  const store = `bench-seal-${randomBytes(4).toString('hex')}`;
  const ok = (r: { status: number; body: any }, what: string) => {
    if (r.status >= 300) throw new Error(`${what}: ${r.status} ${JSON.stringify(r.body)}`);
    return r;
  };
  ok(await call('POST', '/api/secret-stores', { name: store }), 'create store');
  ok(await call('POST', '/api/secret-stores', { name: `${store}-plain` }), 'create store');
  ok(await call('PUT', `/api/secret-stores/${store}/secrets/ANTHROPIC_API_KEY`, { value: 'sk-bench', allowedHosts: ['api.anthropic.com'] }), 'set secret');
  ok(await call('PUT', `/api/secret-stores/${store}-plain/secrets/ANTHROPIC_API_KEY`, { value: 'sk-bench' }), 'set secret');
  const times = { sealed: [] as number[], plain: [] as number[], none: [] as number[] };
  try {
    for (let i = 0; i < n; i++) {
      for (const kind of i % 2 ? (['sealed', 'plain', 'none'] as const) : (['none', 'plain', 'sealed'] as const)) {
        const t0 = Date.now();
        const body = kind === 'sealed' ? { secretStore: store } : kind === 'plain' ? { secretStore: `${store}-plain` } : {};
        const r = ok(await call('POST', '/api/sandboxes', body), 'create');
        const id = r.body.sandboxID as string;
        const x = ok(await call('POST', `/api/sandboxes/${id}/exec/run`, { cmd: 'node', args: ['-v'] }), 'node -v');
        times[kind].push(Date.now() - t0);
        if (x.body.exitCode !== 0) throw new Error(`node -v: ${JSON.stringify(x.body)}`);
        await call('DELETE', `/api/sandboxes/${id}`);
      }
    }
  } finally {
    await call('DELETE', `/api/secret-stores/${store}`);
    await call('DELETE', `/api/secret-stores/${store}-plain`);
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)]!;
  // sealed: a store whose secret has allowedHosts; plain: the same secret without; none: no store at all.
  return { sealed_store_p50: median(times.sealed), plain_store_p50: median(times.plain), no_store_p50: median(times.none), n };
}
