/**
 * The preview proxy: routes a request by its Host header to a sandbox port. Plain HTTP (streamed both
 * ways, kept alive) and WebSocket upgrades (raw byte pipe after the upgrade request).
 *
 * Path of a request: Host → preview record (`_id` lookup, cached 2 s; dropped at once on delete here)
 * → bearer check → the Unix socket of the sandbox port's forwarder on the sandbox host (see
 * sandbox/host/forward.ts; asked for once, then cached) → 127.0.0.1:<port> inside the sandbox.
 * When the API and the host do not share a machine (or PREVIEW_TRANSPORT=tcp), each connection is a
 * tunnel through the host's HTTP port instead (HostClient.openTunnel: authenticated with HOST_TOKEN,
 * then a byte pipe to the same forwarder): not kept alive, one more hop.
 */
import { timingSafeEqual } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import type { ApiDeps } from './deps';
import { ApiError } from '../lib/errors';
import { hashSecret } from '../lib/ids';
import { listSandboxPreviews, previewsOf, type PreviewDoc } from '../store/previews';
import { machineName } from '../lib/machine';
import { splice } from '../lib/splice';
import type { HostClient } from '../sandbox';

/** How the proxy reaches a sandbox port: the forwarder's Unix socket, or a tunnel through its host. */
type PortRoute = { socketPath: string } | { tunnel: HostClient; sandboxId: string; port: number };

const CACHE_MS = 2_000;
/** `<label>-p<port>.<domain>`: the only Host headers that may name a preview. */
const PREVIEW_HOST = /^[a-z0-9][a-z0-9-]*-p\d{1,5}\.[a-z0-9.-]+$/;
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

/** The hostname (lowercase, no port) of a Host header. */
export function hostnameOf(host: string | undefined): string {
  if (!host) return '';
  const h = host.toLowerCase();
  const i = h.lastIndexOf(':');
  return i > 0 && !h.endsWith(']') ? h.slice(0, i) : h;
}

/** Preview records by hostname, and the forwarder sockets of sandbox ports. One per API process. */
export class PreviewProxy {
  private readonly records = new Map<string, { doc: PreviewDoc | null; until: number }>();
  private readonly sockets = new Map<string, PortRoute>();
  private readonly agent = new http.Agent({ keepAlive: true, maxFreeSockets: 64, keepAliveMsecs: 10_000 });

  constructor(private readonly deps: ApiDeps) {}

  /** The hostname when this Host header can only be a preview's; null for everything else (the API). */
  match(host: string | undefined): string | null {
    const name = hostnameOf(host);
    return PREVIEW_HOST.test(name) ? name : null;
  }

  /** Forgets a hostname (after create or delete on this process), so the change applies at once. */
  invalidate(hostname: string): void {
    this.records.delete(hostname);
  }

  /** Remembers where a sandbox port's forwarder listens. */
  rememberSocket(sandboxId: string, port: number, socketPath: string, machine: string | undefined, host: HostClient): void {
    this.sockets.set(`${sandboxId}:${port}`, this.routeFor(sandboxId, port, socketPath, machine, host));
  }

  /** The Unix socket when it is reachable from here (and PREVIEW_TRANSPORT allows), else a tunnel through the host. */
  private routeFor(sandboxId: string, port: number, socketPath: string, machine: string | undefined, host: HostClient): PortRoute {
    const transport = this.deps.cfg.PREVIEW_TRANSPORT;
    const local = transport === 'unix' || (transport === 'auto' && machine === machineName());
    return local ? { socketPath } : { tunnel: host, sandboxId, port };
  }

  /** Forgets a sandbox port's socket (the preview is gone). */
  forgetSocket(sandboxId: string, port: number): void {
    this.sockets.delete(`${sandboxId}:${port}`);
  }

  /** Stops keeping idle connections to forwarders. */
  close(): void {
    this.agent.destroy();
  }

  private async lookup(hostname: string): Promise<PreviewDoc | null> {
    if (!hostname) return null;
    const now = Date.now();
    const hit = this.records.get(hostname);
    if (hit && hit.until > now) return hit.doc;
    const doc = await previewsOf(this.deps.store).findOne({ _id: hostname });
    if (this.records.size > 10_000) this.records.clear();
    this.records.set(hostname, { doc, until: now + CACHE_MS });
    return doc;
  }

  /** Checks the request's bearer token against the preview's; throws 401. */
  private authorize(doc: PreviewDoc, headers: http.IncomingHttpHeaders): void {
    if (!doc.auth) return;
    const auth = headers.authorization;
    const presented =
      (typeof headers['x-preview-token'] === 'string' ? headers['x-preview-token'] : undefined) ??
      (auth && /^bearer\s+/i.test(auth) ? auth.replace(/^bearer\s+/i, '').trim() : undefined);
    if (!presented) throw new ApiError('unauthorized', 'this preview needs a token: send Authorization: Bearer <token> or X-Preview-Token');
    const a = Buffer.from(hashSecret(presented), 'hex');
    const b = Buffer.from(doc.auth.tokenHash, 'hex');
    if (a.length !== b.length || !timingSafeEqual(a, b)) throw new ApiError('unauthorized', 'invalid preview token');
  }

  /** The route to the preview's port; asks the sandbox host when not known (or `fresh`). */
  private async routeOf(doc: PreviewDoc, fresh = false): Promise<PortRoute> {
    const key = `${doc.sandboxId}:${doc.port}`;
    const known = this.sockets.get(key);
    if (known && !fresh) return known;
    const host = await this.deps.hosts.get(doc.hostId);
    try {
      const { socketPath, machine } = await host.portForward(doc.sandboxId, doc.port);
      const route = this.routeFor(doc.sandboxId, doc.port, socketPath, machine, host);
      this.sockets.set(key, route);
      return route;
    } catch (err) {
      const e = err as { type?: string; message?: string };
      if (e.type === 'not_found') throw new ApiError('bad_gateway', `sandbox ${doc.sandboxId} is not running`);
      // Hibernated (or stopping): the host says which; waking it brings the preview back.
      if (e.type === 'conflict') throw new ApiError('unavailable', e.message ?? `sandbox ${doc.sandboxId} is not running`);
      throw new ApiError('bad_gateway', `could not reach sandbox ${doc.sandboxId}: ${e.message ?? String(err)}`);
    }
  }

  /** The preview of `hostname` and the socket to its port, once the request may pass: 404 or 401 otherwise. */
  private async admit(hostname: string, headers: http.IncomingHttpHeaders): Promise<{ doc: PreviewDoc; route: PortRoute }> {
    const doc = await this.lookup(hostname);
    if (!doc) throw new ApiError('not_found', `preview ${hostname} not found`);
    this.authorize(doc, headers);
    return { doc, route: await this.routeOf(doc) };
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
              route.tunnel.openTunnel(route.sandboxId, route.port).then((sock) => done(null, sock), (err: Error) => done(tunnelError(err)));
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
      else sendError(res, err instanceof ApiError ? err : new ApiError('bad_gateway', `sandbox ${doc.sandboxId} is not accepting connections on port ${doc.port}`));
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
          this.routeOf(doc, true).then((p) => connect(p, true), (e) => rawError(socket, e));
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

const proxies = new WeakMap<ApiDeps, PreviewProxy>();

/** The preview proxy of an API process (one per deps object: the routes and the server share it). */
export function previewProxyOf(deps: ApiDeps): PreviewProxy {
  let p = proxies.get(deps);
  if (!p) proxies.set(deps, (p = new PreviewProxy(deps)));
  return p;
}

/**
 * Removes every preview of a sandbox (when it is destroyed), on this process at once.
 * Best effort towards the host: its forwarder goes with the sandbox anyway.
 */
export async function deleteSandboxPreviews(deps: ApiDeps, sandboxId: string): Promise<number> {
  const docs = await listSandboxPreviews(deps.store, sandboxId);
  const proxy = previewProxyOf(deps);
  for (const d of docs) {
    await previewsOf(deps.store).deleteOne({ _id: d._id });
    proxy.invalidate(d._id);
    proxy.forgetSocket(d.sandboxId, d.port);
  }
  return docs.length;
}
