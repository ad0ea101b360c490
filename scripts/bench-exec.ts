import os from 'node:os';
import { WebSocket } from 'ws';

/**
 * `npm run bench -- exec`: exec sessions through the API against a running stack.
 *  - first byte: POST /api/sandboxes/:id/exec (`echo`), then attach over WebSocket, until the first
 *    stdout byte arrives; n times in sequence; p50/p95/p99 in ms.
 *  - first byte, streamed (first_byte_stream_ms): the same POST with `Accept: text/event-stream`,
 *    until its first `stdout` event (one request); n times, alternated with the above.
 *  - throughput: one client attached to `cat` of a file of `mb` MiB written beforehand in the
 *    sandbox (a 63-byte line repeated); MB/s from the first byte to the exit frame (1 MB = 10^6
 *    bytes); `runs` times, the median reported. The client checks every byte against the pattern
 *    (a memcmp per frame, so the check costs little) and the total length.
 */
const LINE = Buffer.from('0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n');
const WINDOW = 1 << 20;
/** The pattern from any phase: PATTERN.subarray(p, p + n) for p < LINE.length, n <= WINDOW. */
const PATTERN = Buffer.alloc(WINDOW + LINE.length, LINE);

/** True when `chunk` is the pattern's bytes from stream offset `offset` on. */
export function matchesPattern(chunk: Buffer, offset: number): boolean {
  for (let pos = 0; pos < chunk.length; pos += WINDOW) {
    const n = Math.min(WINDOW, chunk.length - pos);
    const phase = (offset + pos) % LINE.length;
    if (!chunk.subarray(pos, pos + n).equals(PATTERN.subarray(phase, phase + n))) return false;
  }
  return true;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

export async function benchExec(opts: { url: string; key: string; n: number; mb: number; runs: number }): Promise<Record<string, unknown>> {
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
    for (let i = 0; i < 3; i++) {
      await firstByte();
      await firstByteStreamed();
    }
    const lat: number[] = [];
    const latStreamed: number[] = [];
    for (let i = 0; i < opts.n; i++) {
      lat.push(await firstByte());
      latStreamed.push(await firstByteStreamed());
    }

    /** POST with `Accept: text/event-stream` to the first `stdout` event; the rest of the answer is read to its end. */
    async function firstByteStreamed(): Promise<number> {
      const t0 = performance.now();
      const res = await fetch(`${opts.url}/api/sandboxes/${sb}/exec`, {
        method: 'POST',
        headers: { ...headers, accept: 'text/event-stream' },
        body: JSON.stringify({ cmd: 'echo', args: ['x'] }),
      });
      if (res.status !== 201) throw new Error(`streamed exec: ${res.status} ${await res.text()}`);
      const dec = new TextDecoder();
      let text = '';
      let ms = 0;
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        text += dec.decode(chunk, { stream: true });
        if (!ms && text.includes('event: stdout')) ms = performance.now() - t0;
      }
      if (!ms || !text.includes('event: exit')) throw new Error(`streamed exec: no output or no exit in ${JSON.stringify(text.slice(0, 500))}`);
      return ms;
    }

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
    const file = '/tmp/bench-exec-pattern';
    const made = await call('POST', `/api/sandboxes/${sb}/exec/run`, {
      cmd: 'sh',
      args: ['-c', `yes '${LINE.toString().trimEnd()}' | head -c ${bytes} > ${file}`],
      timeout: 600,
    });
    if (made.exitCode !== 0) throw new Error(`could not write the pattern file: ${JSON.stringify(made)}`);

    // Warm-up: a shorter stream of the same file (first use of the relay code, the file's pages).
    const warm = Math.min(bytes, 32 * 1024 * 1024);
    if (!(await stream(`exec head -c ${warm} ${file}`, warm)).intact) throw new Error('warm-up stream not intact');
    const streams: { got: number; seconds: number; exit: number; intact: boolean }[] = [];
    for (let r = 0; r < opts.runs; r++) streams.push(await stream(`exec cat ${file}`, bytes));

    async function stream(cmd: string, expect: number): Promise<{ got: number; seconds: number; exit: number; intact: boolean }> {
      const es = await call('POST', `/api/sandboxes/${sb}/exec`, { cmd: 'sh', args: ['-c', `read go; ${cmd}`] });
      const ws = open(sb, es.sessionID as string);
      return new Promise((resolve, reject) => {
        let got = 0;
        let t1 = 0;
        let intact = true;
        ws.on('message', (d: Buffer) => {
          if (d[0] === 0x04) ws.send(Buffer.from('\x00go\n'));
          else if (d[0] === 0x01) {
            if (t1 === 0) t1 = performance.now();
            const chunk = d.subarray(1);
            if (intact && !matchesPattern(chunk, got)) intact = false;
            got += chunk.length;
          } else if (d[0] === 0x03) {
            const seconds = (performance.now() - t1) / 1000;
            const exit = d.readInt32BE(1);
            resolve({ got, seconds, exit, intact: intact && got === expect && exit === 0 });
          }
        });
        ws.on('error', reject);
      });
    }
    const pcts = (xs: number[]) => {
      const sorted = [...xs].sort((a, b) => a - b);
      const pct = (p: number) => Math.round(sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]! * 10) / 10;
      return { p50: pct(50), p95: pct(95), p99: pct(99) };
    };
    return {
      bench: 'exec',
      n: opts.n,
      cores: os.cpus().length,
      first_byte_ms: pcts(lat),
      first_byte_stream_ms: pcts(latStreamed),
      stream_bytes: bytes,
      stream_runs: opts.runs,
      stream_intact: streams.every((x) => x.intact),
      throughput_MBps: Math.round(median(streams.map((x) => x.got / x.seconds / 1e6))),
      throughput_runs_MBps: streams.map((x) => Math.round(x.got / x.seconds / 1e6)),
    };
  } finally {
    await call('DELETE', `/api/sandboxes/${sb}`).catch(() => undefined);
  }
}
