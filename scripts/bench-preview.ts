import { execFile } from 'node:child_process';
import os from 'node:os';
import { HostClient } from '../sandbox';

/**
 * Load client shared by every leg of the preview bench (run inside the sandbox and on the host alike):
 * 300 warm-up requests, n sequential keep-alive GETs for latency, then 2n at concurrency c for
 * throughput. Prints one JSON line.
 */
const CLIENT_JS = `
const http = require('http');
const o = JSON.parse(process.argv[1]);
const agent = new http.Agent({ keepAlive: true, maxSockets: o.c });
const one = () => new Promise((resolve, reject) => {
  const t = process.hrtime.bigint();
  const r = http.request({ agent, socketPath: o.socketPath, host: o.host, port: o.port, path: '/', headers: { host: o.hostHeader || 'localhost' } }, (res) => {
    if (res.statusCode !== 200) reject(new Error('status ' + res.statusCode));
    res.resume();
    res.on('end', () => resolve(Number(process.hrtime.bigint() - t) / 1e6));
  });
  r.on('error', reject);
  r.end();
});
(async () => {
  for (let i = 0; i < 300; i++) await one();
  const lat = [];
  for (let i = 0; i < o.n; i++) lat.push(await one());
  lat.sort((a, b) => a - b);
  const total = o.n * 2;
  let started = 0;
  const t0 = process.hrtime.bigint();
  await Promise.all(Array.from({ length: o.c }, async () => { while (started < total) { started++; await one(); } }));
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  const q = (p) => Math.round(lat[Math.min(lat.length - 1, Math.ceil(p * lat.length) - 1)] * 1000) / 1000;
  console.log(JSON.stringify({ p50_ms: q(0.5), p99_ms: q(0.99), requests_per_s: Math.round(total / secs) }));
})().catch((e) => { console.error(e.message); process.exit(1); });
`;

type Leg = { p50_ms: number; p99_ms: number; requests_per_s: number };

/**
 * `npm run bench -- preview`: latency (p50/p99) and requests/s of a trivial HTTP server in a sandbox,
 * hit directly (the same client run inside the sandbox), through the host's forwarder socket alone
 * (when SAP_HOST_URL and SAP_HOST_TOKEN are set), and through the API's preview proxy.
 */
export async function benchPreview(apiUrl: string, apiKey: string, n: number, c: number): Promise<Record<string, unknown>> {
  const call = async (method: string, path: string, body?: unknown): Promise<{ status: number; body: any }> => {
    const res = await fetch(`${apiUrl}${path}`, {
      method,
      headers: { 'x-api-key': apiKey, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    return { status: res.status, body: text ? JSON.parse(text) : null };
  };
  const port = 8080;
  const sb = await call('POST', '/api/sandboxes', {});
  if (sb.status !== 201) throw new Error(`create sandbox: ${JSON.stringify(sb.body)}`);
  const id = sb.body.sandboxID as string;
  try {
    const server = `require('http').createServer((q, s) => s.end('ok')).listen(${port}, '127.0.0.1')`;
    const ex = await call('POST', `/api/sandboxes/${id}/exec`, { cmd: 'node', args: ['-e', server] });
    if (ex.status !== 201) throw new Error(`exec: ${JSON.stringify(ex.body)}`);
    const pv = await call('POST', `/api/sandboxes/${id}/preview`, { port });
    if (pv.status !== 201) throw new Error(`preview: ${JSON.stringify(pv.body)}`);
    const hostname = pv.body.hostname as string;
    const api = new URL(apiUrl);
    const local = (opts: Record<string, unknown>) =>
      new Promise<Leg>((resolve, reject) => {
        execFile(process.execPath, ['-e', CLIENT_JS, JSON.stringify({ n, c, ...opts })], { timeout: 600_000 }, (err, stdout, stderr) =>
          err ? reject(new Error(stderr || err.message)) : resolve(JSON.parse(stdout) as Leg),
        );
      });
    // The exec session starts the server asynchronously: wait until it answers through the proxy.
    for (let i = 0; ; i++) {
      const ok = await local({ host: api.hostname, port: Number(api.port || 80), hostHeader: hostname, n: 1, c: 1 }).then(
        () => true,
        () => false,
      );
      if (ok) break;
      if (i > 100) throw new Error('the server in the sandbox did not come up');
      await new Promise((r) => setTimeout(r, 200));
    }
    const inside = await call('POST', `/api/sandboxes/${id}/exec/run`, {
      cmd: 'node',
      args: ['-e', CLIENT_JS, JSON.stringify({ n, c, host: '127.0.0.1', port })],
      timeout: 600,
    });
    if (inside.status !== 200 || inside.body.exitCode !== 0) throw new Error(`direct leg: ${JSON.stringify(inside.body)}`);
    const direct = JSON.parse(inside.body.stdout) as Leg;
    let forwarder: Leg | undefined;
    if (process.env.SAP_HOST_URL && process.env.SAP_HOST_TOKEN) {
      const socketPath = await new HostClient({ url: process.env.SAP_HOST_URL, token: process.env.SAP_HOST_TOKEN }).openPortForward(id, port);
      forwarder = await local({ socketPath });
    }
    const proxied = await local({ host: api.hostname, port: Number(api.port || 80), hostHeader: hostname });
    return {
      bench: 'preview',
      n,
      concurrency: c,
      cores: os.cpus().length,
      direct_in_sandbox: direct,
      ...(forwarder ? { forwarder_socket: forwarder } : {}),
      proxied,
      proxy_adds_p50_ms: Math.round((proxied.p50_ms - direct.p50_ms) * 1000) / 1000,
    };
  } finally {
    await call('DELETE', `/api/sandboxes/${id}`).catch(() => undefined);
  }
}
