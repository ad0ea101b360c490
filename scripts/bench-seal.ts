import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import type { BenchCall } from './bench-spawn';

/**
 * `npm run bench -- seal [--n 2000] [--mb 512] [--runs 3]` (as root): what sealed secrets cost.
 *  - proxy: a kept-alive HTTPS GET through the sealed-secrets proxy (sandbox/seal/proxy.ts, in a
 *    process of its own, as in the host: TLS terminated with its CA's leaf, a placeholder swapped in
 *    a header, TLS again to the upstream) against the same GET straight to the upstream (a process
 *    of its own on 127.x:443), alternating blocks of 100; p50 of each and the added p50. Then a
 *    chunked stream of --mb MB through each (64 KiB chunks, as SSE would come), Mbit/s per run.
 *    The redirect of the table is not in this path (one nft rule: netfilter's cost, not the proxy's).
 *  - create: create → `node -v` through the API with a store holding the secret sealed, the same
 *    secret plain, and no store, --runs × 10 rounds in alternating orders; medians.
 */
export async function benchSeal(opts: { n: number; mb: number; runs: number; call: BenchCall }): Promise<Record<string, unknown>> {
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
          const ok = req.headers['x-api-key'] === 'the-real-key';
          res.writeHead(ok ? 200 : 401, { 'content-type': 'text/plain' }).end(ok ? 'ok' : 'no');
        }).listen(443, ${JSON.stringify(upstreamAddr)}, () => console.log('READY ' + JSON.stringify(ca.certificate)));
      })();`);
    const upstreamCaPem = JSON.parse(upCa) as string;
    fs.writeFileSync(path.join(dir, 'upstream-ca.pem'), upstreamCaPem);
    // The proxy, as the host runs it, with the client's address as a sandbox holding one sealed secret.
    const proxyOut = await start(`
      const { SealCa } = require('./dist/sandbox/seal/ca');
      const { SealProxy } = require('./dist/sandbox/seal/proxy');
      const net = require('node:net');
      const pino = require('pino');
      (async () => {
        const ca = new SealCa(${JSON.stringify(path.join(dir, 'proxy-ca'))});
        await ca.init('bench');
        const port = await new Promise((r) => { const s = net.createServer().listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => r(p)); }); });
        const proxy = new SealProxy({ port, ca, extraTrust: [require('fs').readFileSync(${JSON.stringify(path.join(dir, 'upstream-ca.pem'))}, 'utf8')],
          refused: () => false, steer: async () => undefined, log: pino({ level: 'warn' }) });
        await proxy.start();
        proxy.register(${JSON.stringify(clientAddr)}, 'sb-bench', [{ placeholder: ${JSON.stringify(placeholder)}, name: 'KEY', hosts: [${JSON.stringify(name)}], box: 'x' }], () => 'the-real-key');
        await proxy.admit(${JSON.stringify(clientAddr)}, ${JSON.stringify(name)}, [${JSON.stringify(upstreamAddr)}], 3600);
        await ca.contextFor(${JSON.stringify(name)});
        console.log('READY ' + JSON.stringify({ port, ca: ca.certificate }));
      })();`);
    const proxy = JSON.parse(proxyOut) as { port: number; ca: string };
    const viaProxy = new https.Agent({ keepAlive: true, maxSockets: 1, ca: proxy.ca, localAddress: clientAddr, servername: name });
    const direct = new https.Agent({ keepAlive: true, maxSockets: 1, ca: upstreamCaPem, servername: name });
    const get = (agent: https.Agent, host: string, port: number, p: string, key: string, sink = false) =>
      new Promise<{ ms: number; bytes: number; status: number }>((resolve, reject) => {
        const t0 = process.hrtime.bigint();
        let bytes = 0;
        const req = https.request({ host, port, path: p, agent, headers: { host: name, 'x-api-key': key } }, (res) => {
          res.on('data', (d: Buffer) => {
            bytes += d.length;
            if (!sink) return;
          });
          res.on('end', () => resolve({ ms: Number(process.hrtime.bigint() - t0) / 1e6, bytes, status: res.statusCode ?? 0 }));
          res.on('error', reject);
        });
        req.on('error', reject);
        req.end();
      });
    const proxied = () => get(viaProxy, '127.0.0.1', proxy.port, '/small', placeholder);
    const straight = () => get(direct, upstreamAddr, 443, '/small', 'the-real-key');
    for (const f of [proxied, straight]) for (let i = 0; i < 50; i++) if ((await f()).status !== 200) throw new Error('warm-up request failed');
    const lat = { proxy: [] as number[], direct: [] as number[] };
    for (let i = 0; i < opts.n; i += 100) {
      for (let j = 0; j < 100; j++) lat.proxy.push((await proxied()).ms);
      for (let j = 0; j < 100; j++) lat.direct.push((await straight()).ms);
    }
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)]!;
    const r3 = (x: number) => Math.round(x * 1000) / 1000;
    const stream = { proxy: [] as number[], direct: [] as number[] };
    for (let i = 0; i < opts.runs; i++) {
      const a = await get(viaProxy, '127.0.0.1', proxy.port, `/stream?mb=${opts.mb}`, placeholder, true);
      const b = await get(direct, upstreamAddr, 443, `/stream?mb=${opts.mb}`, 'the-real-key', true);
      for (const [k, x] of [['proxy', a] as const, ['direct', b] as const]) {
        if (x.bytes !== opts.mb * 2 ** 20) throw new Error(`stream ${k}: ${x.bytes} bytes of ${opts.mb * 2 ** 20}`);
        stream[k].push(Math.round((x.bytes * 8) / (x.ms / 1000) / 1e6));
      }
    }
    viaProxy.destroy();
    direct.destroy();
    const create = await benchCreate(opts.call, opts.runs * 10);
    return {
      bench: 'seal',
      cores: os.cpus().length,
      https_request_ms: {
        proxy_p50: r3(median(lat.proxy)),
        direct_p50: r3(median(lat.direct)),
        added_p50: r3(median(lat.proxy) - median(lat.direct)),
        n: lat.proxy.length,
      },
      stream_mbit_per_s: { ...stream, mb: opts.mb },
      create_node_v_ms: create,
    };
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
