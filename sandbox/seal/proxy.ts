/**
 * The sealed-secrets egress proxy (docs/sealed-secrets.md). It runs in the sandbox host's process and
 * sees only connections the table redirected to it: TCP 80/443 from a sandbox with sealed secrets to
 * an address its resolver answered for a name one of those secrets is for (network.ts, dns.ts).
 * The destination is known by name: the TLS SNI (or the Host header on port 80), which must be a
 * name the sandbox resolved through its resolver (that answer is the address the proxy connects to,
 * so the proxy reaches only what the sandbox's policy let it resolve; refused ranges stay refused).
 * TLS is terminated with a leaf of the host's CA (ca.ts); request headers are searched for
 * placeholders: one that belongs to the sandbox and whose secret allows the host is replaced by the
 * value, opened for that request only; any other (another secret's, another sandbox's, a mangled
 * one) refuses the request with 403, logged (rate-limited) with the sandbox, host and secret name.
 * Upstream TLS is verified against the host's roots (plus SANDBOX_SEAL_TRUST_FILE); answers are
 * piped chunk by chunk (server-sent events are never held back); both sides keep connections alive.
 */
import * as http from 'node:http';
import * as https from 'node:https';
import * as net from 'node:net';
import * as tls from 'node:tls';
import type { Logger } from 'pino';
import { hostAllowed, PLACEHOLDER_LIKE, PLACEHOLDER_PREFIX } from '../../contract/sealed';
import { BODY_HOLD_MAX, BodyScan, pumpBody, readBody } from './body';
import { clientHelloName, MAX_HELLO_BYTES } from './sni';
import type { SealCa } from './ca';

/** A sealed secret as the host keeps it: the value sealed with the host's key, opened per request. */
export interface SealedEntry {
  placeholder: string;
  name: string;
  hosts: string[];
  /** The value sealed with the host's env key (context: sealedContext). */
  box: string;
}

export const sealedContext = (sandboxId: string, placeholder: string) => `sealed:${sandboxId}:${placeholder}`;

interface Sealed {
  id: string;
  byPlaceholder: Map<string, SealedEntry>;
  /** Every host pattern of the sandbox's secrets: what its resolver steers to the proxy. */
  hosts: string[];
  open: (e: SealedEntry) => string;
  conns: number;
  logged: { at: number; n: number };
}

export interface SealProxyOptions {
  port: number;
  ca: SealCa;
  /** Extra roots for upstream TLS (PEM texts), on top of the host's: SANDBOX_SEAL_TRUST_FILE. */
  extraTrust: string[];
  /** Addresses the sandboxes may never reach (the table's refused ranges, minus the operator's allowed ones). */
  refused: (ip: string) => boolean;
  /** Steers the sandbox's connections to `addresses` to the proxy for `ttlSeconds`. */
  steer: (source: string, addresses: string[], ttlSeconds: number) => Promise<void>;
  log: Logger;
  /** Connections one sandbox may hold open through the proxy. */
  maxConnsPerSandbox?: number;
}

const EMPTY = Buffer.alloc(0);
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade']);
const MIN_ROUTE_SECONDS = 300;
interface Route {
  ips: string[];
  until: number;
}
const MAX_NAMES_PER_SANDBOX = 1024;

/** Replaces the placeholders in `text`: the value when the secret allows `host`, else the refusal. */
export function swapPlaceholders(
  text: string,
  host: string,
  lookup: (placeholder: string) => SealedEntry | undefined,
  open: (e: SealedEntry) => string,
): { text: string } | { refused: string | null } {
  let refused: { name: string | null } | null = null;
  const out = text.replace(PLACEHOLDER_LIKE, (m) => {
    const e = lookup(m);
    if (!e || !hostAllowed(e.hosts, host)) {
      refused ??= { name: e?.name ?? null };
      return m;
    }
    return open(e);
  });
  return refused ? { refused: (refused as { name: string | null }).name } : { text: out };
}

export class SealProxy {
  private readonly sandboxes = new Map<string, Sealed>();
  /** Per sandbox address: name → its resolver's answer (addresses, until when). */
  private readonly routes = new Map<string, Map<string, Route>>();
  /** Per sandbox address: other names its resolver answered (not sealed): where a connection for one, steered here because it shares an address with a sealed host, passes through. */
  private readonly others = new Map<string, Map<string, Route>>();
  private readonly server: net.Server;
  private readonly http: http.Server;
  private readonly httpAgent = new http.Agent({ keepAlive: true, maxFreeSockets: 64 });
  private readonly httpsAgent: https.Agent;
  private readonly meta = new WeakMap<net.Socket, { source: string; tls: boolean }>();
  private readonly maxConns: number;

  constructor(private readonly o: SealProxyOptions) {
    this.maxConns = o.maxConnsPerSandbox ?? 256;
    // One secure context for every upstream connection: an agent's `ca` option would be joined into
    // its pool key on every request (Node's ~150 roots: a third of the proxy's CPU) and parsed per connection.
    const secureContext = tls.createSecureContext({ ca: [...tls.rootCertificates, ...o.extraTrust] });
    this.httpsAgent = new https.Agent({ keepAlive: true, maxFreeSockets: 64, secureContext });
    this.http = http.createServer({ keepAlive: true }, (req, res) => this.onRequest(req, res));
    this.http.on('clientError', (_err, sock) => sock.destroy());
    this.server = net.createServer((sock) => this.onConnection(sock));
  }

  async start(): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.o.port, '0.0.0.0', () => resolve());
    });
  }

  async close(): Promise<void> {
    this.httpAgent.destroy();
    this.httpsAgent.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** The sealed secrets of the sandbox at `source` (its link address); replaces what it had. */
  register(source: string, id: string, entries: SealedEntry[], open: (e: SealedEntry) => string): void {
    if (!entries.length) return this.release(source);
    this.sandboxes.set(source, {
      id,
      byPlaceholder: new Map(entries.map((e) => [e.placeholder, e])),
      hosts: [...new Set(entries.flatMap((e) => e.hosts))],
      open,
      conns: this.sandboxes.get(source)?.conns ?? 0,
      logged: { at: 0, n: 0 },
    });
  }

  release(source: string): void {
    this.sandboxes.delete(source);
    this.routes.delete(source);
    this.others.delete(source);
  }

  /** Whether the resolver should show the proxy `name`'s answers for `source` (admit): every name, for a sandbox with sealed secrets. */
  watches(source: string): boolean {
    return this.sandboxes.has(source);
  }

  /** Whether the resolver should steer `name`'s answers for `source` to the proxy. */
  wants(source: string, name: string): boolean {
    const sb = this.sandboxes.get(source);
    return !!sb && hostAllowed(sb.hosts, name);
  }

  /**
   * Records the resolver's answer for `name` (before the answer goes out): a sealed name's addresses
   * are steered to the proxy; another name's are only remembered, so that a connection for it that
   * reaches the proxy (an address it shares with a sealed host) passes through to them untouched.
   */
  async admit(source: string, name: string, addresses: string[], ttlSeconds: number): Promise<void> {
    const sb = this.sandboxes.get(source);
    if (!sb) return;
    const usable = addresses.filter((a) => net.isIPv4(a) && !this.o.refused(a));
    if (!usable.length) return;
    const seconds = Math.max(MIN_ROUTE_SECONDS, Math.min(86_400, Math.ceil(ttlSeconds)));
    const key = name.toLowerCase().replace(/\.$/, '');
    const sealed = hostAllowed(sb.hosts, key);
    const table = sealed ? this.routes : this.others;
    let mine = table.get(source);
    if (!mine) table.set(source, (mine = new Map()));
    mine.delete(key);
    if (mine.size >= MAX_NAMES_PER_SANDBOX) mine.delete(mine.keys().next().value!);
    if (sealed) await this.o.steer(source, usable, seconds);
    mine.set(key, { ips: usable, until: Date.now() + seconds * 1000 });
  }

  /** Where a connection for `name` goes: the sandbox's own current answer for it. */
  private route(table: Map<string, Map<string, Route>>, source: string, name: string): Route | null {
    const r = table.get(source)?.get(name);
    return r && r.until >= Date.now() ? r : null;
  }

  private onConnection(sock: net.Socket): void {
    const source = (sock.remoteAddress ?? '').replace(/^::ffff:/, '');
    const sb = this.sandboxes.get(source);
    if (!sb || sb.conns >= this.maxConns) return void sock.destroy();
    sb.conns++;
    sock.once('close', () => sb.conns--);
    sock.on('error', () => sock.destroy());
    sock.setNoDelay(true);
    // The first bytes decide: plain HTTP; TLS for a sealed name (terminated); TLS for another name (passed through).
    let head: Buffer = EMPTY;
    sock.setTimeout(30_000, () => sock.destroy());
    const onData = (d: Buffer) => {
      head = head.length ? Buffer.concat([head, d]) : d;
      const name = clientHelloName(head);
      if (name === undefined && head.length < MAX_HELLO_BYTES) return;
      sock.removeListener('data', onData);
      sock.pause();
      sock.setTimeout(0);
      if (head[0] === 0x16 && name && !this.wants(source, name)) return this.passThrough(sock, head, source, name);
      sock.unshift(head);
      this.terminate(sock, source, head[0] === 0x16);
    };
    sock.on('data', onData);
  }

  /** Hands the connection to the HTTP server: as it is (plain HTTP), or with TLS terminated by a leaf of the host's CA. */
  private terminate(sock: net.Socket, source: string, secure: boolean): void {
    if (!secure) {
      this.meta.set(sock, { source, tls: false });
      this.http.emit('connection', sock);
      return void sock.resume();
    }
    const conn = new tls.TLSSocket(sock, {
      isServer: true,
      ALPNProtocols: ['http/1.1'],
      SNICallback: (servername, cb) => {
        if (!this.wants(source, servername)) return cb(new Error(`${servername} is not a host of a sealed secret of this sandbox`), undefined);
        this.o.ca.contextFor(servername.toLowerCase()).then(
          (ctx) => cb(null, ctx),
          (err: Error) => cb(err, undefined),
        );
      },
    });
    conn.on('error', () => conn.destroy());
    this.meta.set(conn, { source, tls: true });
    this.http.emit('connection', conn);
  }

  /**
   * A TLS connection for a name no sealed secret of the sandbox is for, steered here because its
   * address is also a sealed host's (a CDN): bytes are passed both ways untouched, to the address of
   * the sandbox's own answer for that name (nothing to swap: the proxy cannot see inside).
   */
  private passThrough(sock: net.Socket, head: Buffer, source: string, name: string): void {
    const route = this.route(this.others, source, name);
    if (!route) return void sock.destroy();
    const up = net.connect({ host: route.ips[0]!, port: 443 });
    up.setNoDelay(true);
    up.on('error', () => sock.destroy());
    up.once('close', () => sock.destroy());
    sock.once('close', () => up.destroy());
    up.write(head);
    sock.pipe(up);
    up.pipe(sock);
    sock.resume();
  }

  private refuse(res: http.ServerResponse, status: number, message: string): void {
    const body = JSON.stringify({ error: { type: status === 403 ? 'sealed_secret_refused' : 'sealed_proxy_error', message } });
    if (res.writableEnded) return; // answered already (a refusal, then the upstream request's end)
    if (res.headersSent) return void res.destroy();
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body);
  }

  /** Logs a refusal: at most 10 per sandbox a minute. Never a value or a placeholder. */
  private logRefusal(sb: Sealed, host: string, secret: string | null): void {
    const now = Date.now();
    if (now - sb.logged.at > 60_000) sb.logged = { at: now, n: 0 };
    if (++sb.logged.n <= 10) this.o.log.warn({ sandboxId: sb.id, host, secret: secret ?? '(unknown placeholder)' }, 'sealed secret refused: not for this host');
  }

  /** Refuses a request for carrying a placeholder that may not go to `host` (or not in clear); logged, rate-limited. */
  private refuseSecret(res: http.ServerResponse, sb: Sealed, host: string, secret: string | null, secure: boolean, why?: string): void {
    this.logRefusal(sb, host, secret);
    const what = `a sealed secret's placeholder${secret ? ` (${secret})` : ''}`;
    this.refuse(
      res,
      403,
      why
        ? `${what} ${why}`
        : secure
          ? `${what} may not be sent to ${host}: it is not one of its allowed hosts`
          : `${what} is only sent over HTTPS: use https://${host}`,
    );
  }

  private onRequest(req: http.IncomingMessage, res: http.ServerResponse): void {
    const meta = this.meta.get(req.socket);
    const sb = meta && this.sandboxes.get(meta.source);
    if (!meta || !sb) return this.refuse(res, 403, 'not a sandbox with sealed secrets');
    const hostHeader = (req.headers.host ?? '').toLowerCase();
    const name = hostHeader.replace(/:\d+$/, '').replace(/\.$/, '');
    const sni = meta.tls ? (((req.socket as tls.TLSSocket & { servername?: string | false }).servername || '') as string).toLowerCase() : null;
    if (sni !== null && sni !== name) return this.refuse(res, 421, `the Host header (${name.slice(0, 100)}) is not the TLS server name (${sni})`);
    // Over plain HTTP a name sharing an address with a sealed host comes here too: forwarded the same way (placeholders refused).
    const route = this.route(this.routes, meta.source, name) ?? (meta.tls ? null : this.route(this.others, meta.source, name));
    if (!route) return this.refuse(res, 403, `${name.slice(0, 100)} was not resolved through the sandbox's resolver`);
    // Headers, with placeholders swapped (values opened here, for this request only).
    const headers: string[] = [];
    let lengthAt = -1;
    const raw = req.rawHeaders;
    for (let i = 0; i < raw.length; i += 2) {
      const key = raw[i]!;
      const lower = key.toLowerCase();
      if (HOP_BY_HOP.has(lower)) continue;
      const value = raw[i + 1]!;
      if (lower === 'content-length') lengthAt = headers.length + 1;
      // A value never goes out in clear: over plain HTTP any placeholder refuses the request.
      if (!meta.tls && value.includes(PLACEHOLDER_PREFIX)) {
        const secret = [...value.matchAll(PLACEHOLDER_LIKE)].map((m) => sb.byPlaceholder.get(m[0])?.name).find(Boolean) ?? null;
        return this.refuseSecret(res, sb, name, secret, false);
      }
      const swapped = swapPlaceholders(value, name, (p) => sb.byPlaceholder.get(p), sb.open);
      if ('refused' in swapped) return this.refuseSecret(res, sb, name, swapped.refused, true);
      headers.push(key, swapped.text);
    }
    // The body: searched too (body.ts); a refusal stops it before the placeholder's bytes leave.
    const scan = new BodyScan((p) => {
      const e = sb.byPlaceholder.get(p);
      return meta.tls && e && hostAllowed(e.hosts, name) ? Buffer.from(sb.open(e), 'utf8') : { refused: e?.name ?? null };
    });
    const length = lengthAt < 0 ? null : Number(headers[lengthAt]);
    const chunked = req.headers['transfer-encoding'] !== undefined;
    const send = (body?: Buffer) => this.upstream(req, res, route.ips[0]!, name, meta.tls, headers, body);
    if (!chunked && (length === null || length === 0)) return void send(EMPTY);
    if (!chunked && length !== null && length <= BODY_HOLD_MAX) {
      // Small bodies are held whole: a swap fixes the content-length.
      return void readBody(req, length).then(
        (body) => {
          const out = scan.push(body, true);
          if (!Buffer.isBuffer(out)) return this.refuseSecret(res, sb, name, out.refused, meta.tls);
          headers[lengthAt] = String(out.length);
          send(out);
        },
        () => res.destroy(),
      );
    }
    const up = send();
    pumpBody(req, up, scan, !chunked, (secret, tooLarge) => {
      up.destroy();
      const why = tooLarge ? `is swapped in a body only when the body is chunked or at most ${BODY_HOLD_MAX} bytes long` : undefined;
      this.refuseSecret(res, sb, name, secret, meta.tls, why);
    });
  }

  /** Sends the request upstream (to the address of the sandbox's own answer for `name`) and pipes the answer back chunk by chunk. */
  private upstream(req: http.IncomingMessage, res: http.ServerResponse, ip: string, name: string, secure: boolean, headers: string[], body?: Buffer) {
    const opts: https.RequestOptions = {
      host: ip,
      port: secure ? 443 : 80,
      method: req.method,
      path: req.url,
      headers: headers as unknown as http.OutgoingHttpHeaders,
      setHost: false,
      agent: secure ? this.httpsAgent : this.httpAgent,
      ...(secure ? { servername: name } : {}),
    };
    const up = (secure ? https : http).request(opts, (upRes) => {
      if (res.writableEnded) return void upRes.destroy(); // refused meanwhile (a placeholder later in the body)
      const out: string[] = [];
      for (let i = 0; i < upRes.rawHeaders.length; i += 2) {
        if (!HOP_BY_HOP.has(upRes.rawHeaders[i]!.toLowerCase())) out.push(upRes.rawHeaders[i]!, upRes.rawHeaders[i + 1]!);
      }
      res.writeHead(upRes.statusCode ?? 502, upRes.statusMessage, out);
      // An event stream's headers go at once (its first event may take a while); others go with the first chunk.
      if (/event-stream/i.test(String(upRes.headers['content-type'] ?? ''))) res.flushHeaders();
      upRes.pipe(res);
      upRes.on('error', () => res.destroy());
    });
    up.on('error', (err) => this.refuse(res, 502, `${name}: ${err.message}`));
    res.on('close', () => {
      if (!res.writableFinished) up.destroy();
    });
    if (body) up.end(body.length ? body : undefined);
    return up;
  }
}
