/** Files through the API in tests: paths in a query, streamed uploads, the API's memory while they run. */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import { Readable } from 'node:stream';
import { T } from './env';

/** A sandbox path as a query parameter's value. */
export const q = (p: string) => encodeURIComponent(p);

/** GETs a file's bytes from a sandbox through the API. */
export async function getFile(sandbox: string, p: string, key: string = T.key()): Promise<{ status: number; bytes: Buffer; headers: Headers }> {
  const res = await fetch(`${T.api()}/api/sandboxes/${sandbox}/files?path=${q(p)}`, { headers: { 'x-api-key': key } });
  return { status: res.status, bytes: Buffer.from(await res.arrayBuffer()), headers: res.headers };
}

/** The resident memory of a process in kB. */
export function rssKb(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : 0;
}

/** Samples a process's RSS every 20 ms while `fn` runs; returns fn's value and the highest sample's rise over the first. */
export async function peakRise<T>(pid: number, fn: () => Promise<T>): Promise<{ value: T; riseMb: number }> {
  const first = rssKb(pid);
  let peak = first;
  const timer = setInterval(() => (peak = Math.max(peak, rssKb(pid))), 20);
  try {
    const value = await fn();
    return { value, riseMb: (peak - first) / 1024 };
  } finally {
    clearInterval(timer);
  }
}

/** `n` MiB of deterministic bytes as a stream (never whole in memory), and their sha256 once read. */
export function patterned(n: number): { stream: Readable; sha256: () => string } {
  const hash = createHash('sha256');
  let i = 0;
  const stream = new Readable({
    read() {
      if (i === n) return this.push(null);
      const chunk = Buffer.alloc(1024 * 1024, i % 251);
      chunk.writeUInt32BE(i++, 0);
      hash.update(chunk);
      this.push(chunk);
    },
  });
  return { stream, sha256: () => hash.digest('hex') };
}

/**
 * PUTs a stream to a sandbox's file through the API; the answer's status and body. An answer that
 * comes before the whole body went out (a refusal) is no failure here.
 */
export async function putStream(sandbox: string, p: string, body: Readable): Promise<{ status: number; body: string }> {
  const r = await putStreamAnswer(sandbox, p, body);
  return { status: r.status, body: r.body };
}

/**
 * putStream with the answer's headers too, and whether it came over a connection of `agent` that an
 * earlier call had left open (`reused`).
 */
export function putStreamAnswer(
  sandbox: string,
  p: string,
  body: Readable,
  opts: { agent?: http.Agent } = {},
): Promise<{ status: number; body: string; headers: http.IncomingHttpHeaders; reused: boolean }> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${T.api()}/api/sandboxes/${sandbox}/files?path=${q(p)}`, {
      method: 'PUT',
      headers: { 'x-api-key': T.key(), 'content-type': 'application/octet-stream' },
      ...(opts.agent ? { agent: opts.agent } : {}),
    });
    let answered = false;
    req.on('response', (res) => {
      answered = true;
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text, headers: res.headers, reused: req.reusedSocket }));
      res.on('error', reject);
    });
    // Once an answer has come, the body's writes may fail (a refusal closed the connection under
    // them): the answer decides, and it ends (or fails) on its own.
    req.on('error', (err) => (req.writableEnded || answered ? undefined : reject(err)));
    body.pipe(req);
  });
}
