import http from 'node:http';
import { WebSocket } from 'ws';
import { api, T } from './env';

/**
 * A small HTTP server run inside a sandbox (`node -e SERVER_JS <port>`): `/gated` writes a first
 * line, then its second line and end only once `/open-gate` has been asked for; any other path
 * answers JSON describing the request; an upgrade is a minimal WebSocket
 * echo (text frames come back as `echo:<text>`). Only node's own modules: nothing is installed inside.
 */
export const SERVER_JS = String.raw`
const http = require('http'), crypto = require('crypto');
const port = Number(process.argv[1]);
const gates = [];
const s = http.createServer((req, res) => {
  if (req.url === '/gated') {
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.write('first\n');
    gates.push(() => res.end('second\n'));
    return;
  }
  if (req.url === '/open-gate') {
    for (const open of gates.splice(0)) open();
    res.end('opened');
    return;
  }
  let body = '';
  req.on('data', (d) => (body += d));
  req.on('end', () => {
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ port, sandbox: require('os').hostname(), method: req.method, url: req.url, body, authorization: req.headers.authorization || null,
      previewToken: req.headers['x-preview-token'] || null, host: req.headers.host, forwardedFor: req.headers['x-forwarded-for'] || null }));
  });
});
s.on('upgrade', (req, sock) => {
  const accept = crypto.createHash('sha1').update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + accept + '\r\n\r\n');
  let buf = Buffer.alloc(0);
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    for (;;) {
      if (buf.length < 2) return;
      const op = buf[0] & 15; let len = buf[1] & 127, off = 2;
      if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); off = 4; } else if (len === 127) { sock.destroy(); return; }
      const masked = buf[1] & 128, maskAt = off; if (masked) off += 4;
      if (buf.length < off + len) return;
      let p = buf.subarray(off, off + len);
      if (masked) { const m = buf.subarray(maskAt, maskAt + 4); p = Buffer.from(p.map((b, i) => b ^ m[i % 4])); }
      buf = buf.subarray(off + len);
      if (op === 8) { sock.end(Buffer.from([0x88, 0])); return; }
      if (op === 1) {
        const out = Buffer.from('echo:' + p.toString());
        const h = out.length < 126 ? Buffer.from([0x81, out.length]) : Buffer.from([0x81, 126, out.length >> 8, out.length & 255]);
        sock.write(Buffer.concat([h, out]));
      }
    }
  });
});
s.listen(port, '127.0.0.1');
`;

/** Starts SERVER_JS on `port` inside the sandbox (an exec session through the API). */
export async function startServer(sandboxId: string, port: number): Promise<void> {
  const r = await api('POST', `/api/sandboxes/${sandboxId}/exec`, { body: { cmd: 'node', args: ['-e', SERVER_JS, String(port)] } });
  if (r.status !== 201) throw new Error(`exec: ${r.status} ${JSON.stringify(r.body)}`);
}

export interface ProxyRes {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  json: any;
}

/** An HTTP request to the API's port (the test stack's, or `opts.api`) with the given Host header (how a browser reaches a preview). */
export function viaHost(
  hostname: string,
  path = '/',
  opts: { method?: string; headers?: Record<string, string>; body?: string; agent?: http.Agent; api?: string } = {},
): Promise<ProxyRes> {
  const url = new URL(opts.api ?? T.api());
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: url.hostname, port: url.port, path, method: opts.method ?? 'GET', headers: { host: hostname, ...opts.headers }, agent: opts.agent },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString();
          let json: unknown = null;
          try {
            json = JSON.parse(text);
          } catch {
            /* not JSON */
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(opts.body);
  });
}

/** A WebSocket to the API's port with the given Host header. */
export function wsViaHost(hostname: string, path = '/', headers: Record<string, string> = {}): WebSocket {
  const url = new URL(T.api());
  return new WebSocket(`ws://${url.host}${path}`, { headers: { host: hostname, ...headers } });
}
