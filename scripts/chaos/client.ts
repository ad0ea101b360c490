/** `npm run chaos`'s HTTP client of the API: retries on 503 and on a refused or broken connection, and counts every answer. */
import http from 'node:http';
import { KEY, rand, sleep, API } from './config';

// ---------------------------------------------------------------------------------------------
// The client: retries on 503 and on a refused or broken connection, with backoff, and counts
// every answer; a 5xx other than 503 is a finding.

export const httpStats = {
  requests: 0,
  retries: 0,
  byStatus: {} as Record<string, number>,
  connectionErrors: 0,
  /** 503 answers without the `{ error: { type, message } }` body. */
  bad503Bodies: 0,
  serverErrors: [] as { method: string; path: string; status: number; body: string }[],
};

export interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  json: any;
}

export const agent = new http.Agent({ keepAlive: true, maxSockets: 200 });

export function once(method: string, url: string, body: string | undefined, headers: Record<string, string>, timeoutMs: number): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const h: Record<string, string | number> = { 'x-api-key': KEY, ...headers };
    if (body !== undefined) h['content-length'] = Buffer.byteLength(body);
    const req = http.request(url, { method, headers: h, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json: any = null;
        try {
          json = text ? JSON.parse(text) : null;
        } catch {
          /* NDJSON or not JSON */
        }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json });
      });
    });
    req.setTimeout(timeoutMs, () => req.destroy(new Error('request timed out')));
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * One API call. 503s and connection failures (the API or something behind it is restarting) are
 * retried with backoff up to `giveUpMs`; every other answer is returned.
 */
export async function call(
  method: string,
  p: string,
  body?: unknown,
  opts: { headers?: Record<string, string>; giveUpMs?: number; raw?: string } = {},
): Promise<Answer> {
  const payload = opts.raw ?? (body === undefined ? undefined : JSON.stringify(body));
  const headers: Record<string, string> = {
    ...(payload !== undefined && !opts.headers?.['content-type'] ? { 'content-type': 'application/json' } : {}),
    ...opts.headers,
  };
  const deadline = Date.now() + (opts.giveUpMs ?? 300_000);
  const waitS = Number(/[?&]wait=(\d+)/.exec(p)?.[1] ?? 0);
  let delay = 100;
  for (let attempt = 0; ; attempt++) {
    if (attempt > 0) httpStats.retries++;
    httpStats.requests++;
    let a: Answer | null = null;
    try {
      a = await once(method, `${API}${p}`, payload, headers, (waitS + 30) * 1000);
    } catch {
      httpStats.connectionErrors++;
    }
    if (a) {
      httpStats.byStatus[a.status] = (httpStats.byStatus[a.status] ?? 0) + 1;
      if (a.status === 503) {
        if (typeof a.json?.error?.type !== 'string' || typeof a.json?.error?.message !== 'string') httpStats.bad503Bodies++;
      } else if (a.status >= 500) {
        httpStats.serverErrors.push({ method, path: p, status: a.status, body: a.text.slice(0, 300) });
      } else {
        return a;
      }
    }
    if (Date.now() > deadline) throw new Error(`${method} ${p}: no answer but 5xx or connection errors for ${opts.giveUpMs ?? 300_000} ms`);
    await sleep(delay * (0.5 + rand()));
    delay = Math.min(delay * 2, 3000);
  }
}
