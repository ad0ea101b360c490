/**
 * The preview proxy: routes a request by its Host header to a sandbox port. Plain HTTP (streamed both
 * ways, kept alive) and WebSocket upgrades (raw byte pipe after the upgrade request). Which port a
 * hostname names, its bearer check and the way to the port are the preview service's
 * (services/sandboxes/previews.ts); this file is the HTTP side only.
 */
import http from 'node:http';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { ApiError } from '../contract/errors';
import { splice } from '../lib/splice';
import { hostnameOf, type PortRoute, type PreviewDoc, type PreviewService } from '../services/sandboxes/previews';

export { hostnameOf };

/** `<label>-p<port>.<domain>`: the only Host headers that may name a preview. */
const PREVIEW_HOST = /^[a-z0-9][a-z0-9-]*-p\d{1,5}\.[a-z0-9.-]+$/;
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

/** Serves preview hostnames over HTTP. One per API process. */
export class PreviewProxy {
  private readonly agent = new http.Agent({ keepAlive: true, maxFreeSockets: 64, keepAliveMsecs: 10_000 });

  constructor(private readonly previews: PreviewService) {}

  /** The hostname when this Host header can only be a preview's; null for everything else (the API). */
  match(host: string | undefined): string | null {
    const name = hostnameOf(host);
    return PREVIEW_HOST.test(name) ? name : null;
  }

  /** Stops keeping idle connections to forwarders. */
  close(): void {
    this.agent.destroy();
  }

  private routeOf(doc: PreviewDoc, fresh = false): Promise<PortRoute> {
    return this.previews.routeOf(doc, fresh);
  }

  private admit(hostname: string, headers: http.IncomingHttpHeaders): Promise<{ doc: PreviewDoc; route: PortRoute }> {
    return this.previews.admit(hostname, headers);
  }

  /** Serves one HTTP request for a preview hostname. Never throws: failures answer with the error body. */
  async handleRequest(req: http.IncomingMessage, res: http.ServerResponse, hostname: string): Promise<void> {
    let doc: PreviewDoc;
    let route: PortRoute;
    try {
      ({ doc, route } = await this.admit(hostname, req.headers));
    } catch (err) {
      sendError(res, err);
      return;
    }
    this.forward(req, res, doc, route, false);
  }

  private forward(req: http.IncomingMessage, res: http.ServerResponse, doc: PreviewDoc, route: PortRoute, retried: boolean): void {
    const headers = forwardedHeaders(req, doc);
    const preq =
      'socketPath' in route
        ? http.request({ socketPath: route.socketPath, agent: this.agent, method: req.method, path: req.url, headers })
        : http.request({
            method: req.method,
            path: req.url,
            headers,
            createConnection: ((_opts: unknown, done: (err: Error | null, socket?: net.Socket) => void) => {
              route.tunnel.openTunnel(route.sandboxId, route.port).then(
                (sock) => done(null, sock),
                (err: Error) => done(tunnelError(err)),
              );
              return undefined;
            }) as unknown as http.RequestOptions['createConnection'],
          });
    let piped = false;
    preq.on('socket', (s: net.Socket) => {
      const go = () => {
        piped = true;
        if (req.readableEnded) preq.end();
        else req.pipe(preq);
      };
      if (s.connecting) s.once('connect', go);
      else go();
    });
    preq.on('response', (pres) => {
      const out: string[] = [];
      const raw = pres.rawHeaders;
      for (let i = 0; i < raw.length; i += 2) if (!HOP_BY_HOP.has(raw[i]!.toLowerCase())) out.push(raw[i]!, raw[i + 1]!);
      res.writeHead(pres.statusCode ?? 502, pres.statusMessage, out);
      res.flushHeaders();
      pres.pipe(res);
      pres.on('error', () => res.destroy());
    });
    preq.on('error', (err: NodeJS.ErrnoException) => {
      // The forwarder is gone (host restarted, socket removed): ask the host again, once.
      if (!piped && !retried && (err.code === 'ENOENT' || err.code === 'ECONNREFUSED')) {
        this.routeOf(doc, true).then(
          (p) => this.forward(req, res, doc, p, true),
          (e) => sendError(res, e),
        );
        return;
      }
      if (res.headersSent) res.destroy();
      else
        sendError(
          res,
          err instanceof ApiError ? err : new ApiError('bad_gateway', `sandbox ${doc.sandboxId} is not accepting connections on port ${doc.port}`),
        );
    });
    res.on('close', () => {
      if (!res.writableFinished) preq.destroy();
    });
  }

  /** Serves a WebSocket (or other) upgrade for a preview hostname: the bytes are piped once connected. */
  async handleUpgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer, hostname: string): Promise<void> {
    socket.on('error', () => socket.destroy());
    let doc: PreviewDoc;
    let route: PortRoute;
    try {
      ({ doc, route } = await this.admit(hostname, req.headers));
    } catch (err) {
      rawError(socket, err);
      return;
    }
    const pipe = (up: Duplex) => {
      const lines = [`${req.method} ${req.url} HTTP/1.1`];
      const headers = forwardedHeaders(req, doc, true);
      for (const [k, v] of Object.entries(headers)) for (const one of Array.isArray(v) ? v : [v]) lines.push(`${k}: ${one}`);
      up.write(`${lines.join('\r\n')}\r\n\r\n`);
      if (head.length) up.write(head);
      splice(up, socket);
    };
    const refused = () => new ApiError('bad_gateway', `sandbox ${doc.sandboxId} is not accepting connections on port ${doc.port}`);
    const connect = (r: PortRoute, retried: boolean) => {
      if (!('socketPath' in r)) {
        r.tunnel.openTunnel(r.sandboxId, r.port).then(pipe, (err: Error) => rawError(socket, tunnelError(err)));
        return;
      }
      const up = net.connect(r.socketPath);
      up.once('connect', () => {
        up.removeAllListeners('error');
        pipe(up);
      });
      up.once('error', (err: NodeJS.ErrnoException) => {
        if (!retried && (err.code === 'ENOENT' || err.code === 'ECONNREFUSED')) {
          this.routeOf(doc, true).then(
            (p) => connect(p, true),
            (e) => rawError(socket, e),
          );
          return;
        }
        rawError(socket, refused());
      });
    };
    connect(route, false);
  }
}

/** What a failed tunnel through a host means for the preview's client. */
function tunnelError(err: Error & { type?: string }): ApiError {
  if (err.type === 'conflict') return new ApiError('unavailable', err.message);
  return new ApiError('bad_gateway', `could not reach the sandbox port through its host: ${err.message}`);
}

/** Request headers for the sandbox: hop-by-hop headers and the preview token removed, X-Forwarded-* added. */
function forwardedHeaders(req: http.IncomingMessage, doc: PreviewDoc, upgrade = false): http.OutgoingHttpHeaders {
  const out: http.OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(req.headers)) {
    if (v === undefined || k === 'x-preview-token') continue;
    if (HOP_BY_HOP.has(k) && !(upgrade && (k === 'connection' || k === 'upgrade'))) continue;
    if (k === 'authorization' && doc.auth) continue;
    out[k] = v;
  }
  const prior = req.headers['x-forwarded-for'];
  const addr = req.socket.remoteAddress ?? '';
  out['x-forwarded-for'] = prior ? `${String(prior)}, ${addr}` : addr;
  out['x-forwarded-host'] = req.headers.host ?? doc.hostname;
  out['x-forwarded-proto'] = req.headers['x-forwarded-proto'] ?? 'http';
  return out;
}

function toApiError(err: unknown): ApiError {
  return err instanceof ApiError ? err : new ApiError('bad_gateway', (err as Error)?.message ?? 'proxy error');
}

function sendError(res: http.ServerResponse, err: unknown): void {
  const e = toApiError(err);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = JSON.stringify(e.toBody());
  res.writeHead(e.status, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

function rawError(socket: Duplex, err: unknown): void {
  const e = toApiError(err);
  const body = JSON.stringify(e.toBody());
  socket.end(
    `HTTP/1.1 ${e.status} ${http.STATUS_CODES[e.status]}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
  );
}
