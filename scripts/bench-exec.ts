import os from 'node:os';
import { WebSocket } from 'ws';

/**
 * `npm run bench -- exec`: exec sessions through the API against a running stack.
 *  - first byte: POST /api/sandboxes/:id/exec (`echo`), then attach over WebSocket, until the first
 *    stdout byte arrives; n times in sequence; p50/p95/p99 in ms.
 *  - throughput: one client attached to a command writing `mb` MiB (`head -c … /dev/zero`); MB/s
 *    from the first byte to the exit frame (1 MB = 10^6 bytes).
 */
export async function benchExec(opts: { url: string; key: string; n: number; mb: number }): Promise<Record<string, unknown>> {
  const headers = { 'x-api-key': opts.key, 'content-type': 'application/json' };
  const call = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${opts.url}${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const json = (await res.json()) as Record<string, any>;
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(json)}`);
    return json;
  };
  const wsBase = opts.url.replace(/^http/, 'ws');
  const open = (sb: string, sid: string) =>
    new WebSocket(`${wsBase}/api/sandboxes/${sb}/exec/${sid}`, { headers: { 'x-api-key': opts.key }, perMessageDeflate: false });

  const sb = (await call('POST', '/api/sandboxes', { metadata: { bench: 'exec' } })).sandboxID as string;
  try {
    // Warm-up (first spawn in a sandbox, connection pools).
    for (let i = 0; i < 3; i++) await firstByte();
    const lat: number[] = [];
    for (let i = 0; i < opts.n; i++) lat.push(await firstByte());

    async function firstByte(): Promise<number> {
      const t0 = performance.now();
      const es = await call('POST', `/api/sandboxes/${sb}/exec`, { cmd: 'echo', args: ['x'] });
      const ws = open(sb, es.sessionID as string);
      return new Promise((resolve, reject) => {
        ws.on('message', (d: Buffer) => {
          if (d[0] === 0x01) {
            const ms = performance.now() - t0;
            ws.close();
            resolve(ms);
          }
        });
        ws.on('error', reject);
      });
    }

    const bytes = opts.mb * 1024 * 1024;
    const es = await call('POST', `/api/sandboxes/${sb}/exec`, { cmd: 'sh', args: ['-c', `read go; head -c ${bytes} /dev/zero`] });
    const ws = open(sb, es.sessionID as string);
    const result = await new Promise<{ got: number; seconds: number; exit: number }>((resolve, reject) => {
      let got = 0;
      let t1 = 0;
      ws.on('message', (d: Buffer) => {
        if (d[0] === 0x04) ws.send(Buffer.from('\x00go\n'));
        else if (d[0] === 0x01) {
          if (t1 === 0) t1 = performance.now();
          got += d.length - 1;
        } else if (d[0] === 0x03) resolve({ got, seconds: (performance.now() - t1) / 1000, exit: d.readInt32BE(1) });
      });
      ws.on('error', reject);
    });
    const sorted = [...lat].sort((a, b) => a - b);
    const pct = (p: number) => Math.round(sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]! * 10) / 10;
    return {
      bench: 'exec',
      n: opts.n,
      cores: os.cpus().length,
      first_byte_ms: { p50: pct(50), p95: pct(95), p99: pct(99) },
      stream_bytes: result.got,
      stream_intact: result.got === bytes && result.exit === 0,
      throughput_MBps: Math.round(result.got / result.seconds / 1e6),
    };
  } finally {
    await call('DELETE', `/api/sandboxes/${sb}`).catch(() => undefined);
  }
}
