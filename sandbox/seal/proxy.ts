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
import { Transform } from 'node:stream';
import * as tls from 'node:tls';
import * as zlib from 'node:zlib';
import type { Logger } from 'pino';
import { DEFAULT_INJECT_INTO, hostAllowed, INJECT_BODY, PLACEHOLDER_LIKE, PLACEHOLDER_PREFIX } from '../../contract/sealed';
import { BODY_HOLD_MAX, BodyScan, pumpBody, readBody, ValueScan } from './body';
import { FORWARDED, framingFault } from './framing';
import { clientHelloName, MAX_HELLO_BYTES } from './sni';
import type { SealCa } from './ca';

/** A sealed secret as the host keeps it: the value sealed with the host's key, opened per request. */
export interface SealedEntry {
  placeholder: string;
  name: string;
  hosts: string[];
  /** Where the value may be put: header names (lower case) and `body`; absent: DEFAULT_INJECT_INTO. */
  inject?: string[];
  /** The value sealed with the host's env key (context: sealedContext). */
  box: string;
}

/** Whether `e`'s value may be put into `where` (a header name in lower case, or `body`). */
export const injects = (e: SealedEntry, where: string): boolean => (e.inject?.length ? e.inject : DEFAULT_INJECT_INTO).includes(where);

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
  /** The address it listens on (network.ts: the host's sandbox-facing service address); default 0.0.0.0. */
  address?: string;
  ca: SealCa;
  /** Extra roots for upstream TLS (PEM texts), on top of the host's: SANDBOX_SEAL_TRUST_FILE. */
  extraTrust: string[];
  /**
   * Whether the proxy may connect to `ip` for the sandbox at `source`: its own egress policy, the
   * table's refused ranges, and never one of the host's own addresses (the proxy runs on the host,
   * outside the sandboxes' input chain).
   */
  reachable: (source: string, ip: string) => boolean;
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

/**
 * Replaces the placeholders in `text`, the value of header `where`: the value when the secret allows
 * `host` and goes into that header; unchanged when it allows the host but goes elsewhere (a useless
 * string there); else the refusal.
 */
export function swapPlaceholders(
  text: string,
  host: string,
  lookup: (placeholder: string) => SealedEntry | undefined,
  open: (e: SealedEntry) => string,
  where: string,
): { text: string } | { refused: string | null } {
  let refused: { name: string | null } | null = null;
  const out = text.replace(PLACEHOLDER_LIKE, (m) => {
    const e = lookup(m);
    if (!e || !hostAllowed(e.hosts, host)) {
      refused ??= { name: e?.name ?? null };
      return m;
    }
    return injects(e, where) ? open(e) : m;
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
      this.server.listen(this.o.port, this.o.address ?? '0.0.0.0', () => resolve());
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
    const usable = addresses.filter((a) => net.isIPv4(a) && this.o.reachable(source, a));
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
    const ip = this.route(this.others, source, name)?.ips.find((a) => this.o.reachable(source, a));
    if (!ip) return void sock.destroy();
    const up = net.connect({ host: ip, port: 443 });
    up.setNoDelay(true);
    up.on('error', () => sock.destroy());
    up.once('close', () => sock.destroy());
    sock.once('close', () => up.destroy());
    up.write(head);
    sock.pipe(up);
    up.pipe(sock);
    sock.resume();
  }

  /** Answers with an error; `close`: the connection is closed after it (its next bytes are not trusted to be framed as read). */
  private refuse(res: http.ServerResponse, status: number, message: string, close = false): void {
    const body = JSON.stringify({ error: { type: status === 403 ? 'sealed_secret_refused' : 'sealed_proxy_error', message } });
    if (res.writableEnded) return; // answered already (a refusal, then the upstream request's end)
    if (res.headersSent) return void res.destroy();
    res
      .writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...(close ? { connection: 'close' } : {}) })
      .end(body);
  }

  /** Logs a refusal: at most 10 per sandbox a minute. Never a value or a placeholder. */
  private logRefusal(sb: Sealed, host: string, secret: string | null, fault?: string): void {
    const now = Date.now();
    if (now - sb.logged.at > 60_000) sb.logged = { at: now, n: 0 };
    if (++sb.logged.n > 10) return;
    if (fault) this.o.log.warn({ sandboxId: sb.id, host, fault }, 'sealed secrets proxy: request refused (framing)');
    else this.o.log.warn({ sandboxId: sb.id, host, secret: secret ?? '(unknown placeholder)' }, 'sealed secret refused: not for this host');
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
    const sni = meta.tls ? (((req.socket as tls.TLSSocket & { servername?: string | false }).servername || '') as string).toLowerCase() : null;
    const checked = framingFault(req, meta.tls, sni);
    if ('fault' in checked) {
      this.logRefusal(sb, sni ?? String(req.headers.host ?? '').slice(0, 100), null, checked.fault);
      // The connection is not trusted to be framed as the proxy read it: closed after the answer.
      return this.refuse(res, 403, checked.fault, true);
    }
    const name = checked.name;
    // Over plain HTTP a name sharing an address with a sealed host comes here too: forwarded the same way (placeholders refused).
    const route = this.route(this.routes, meta.source, name) ?? (meta.tls ? null : this.route(this.others, meta.source, name));
    if (!route) return this.refuse(res, 403, `${name.slice(0, 100)} was not resolved through the sandbox's resolver`);
    const ip = route.ips.find((a) => this.o.reachable(meta.source, a));
    if (!ip) return this.refuse(res, 403, `${name.slice(0, 100)}: its addresses are not reachable from this sandbox (its policy, or the host's own)`);
    // The values that may go to this host: searched for in the answer (replaced by their placeholders).
    const mine = [...sb.byPlaceholder.values()].filter((e) => hostAllowed(e.hosts, name));
    // Headers, with placeholders swapped where their secret allows it (values opened here, for this request only).
    const headers: string[] = [];
    let lengthAt = -1;
    const raw = req.rawHeaders;
    for (let i = 0; i < raw.length; i += 2) {
      const key = raw[i]!;
      const lower = key.toLowerCase();
      if (HOP_BY_HOP.has(lower) || FORWARDED.has(lower)) continue;
      const value = raw[i + 1]!;
      if (lower === 'content-length') lengthAt = headers.length + 1;
      // The answer is searched for values: it must come in a form the search can read.
      if (lower === 'accept-encoding' && mine.length) continue;
      // A value never goes out in clear: over plain HTTP any placeholder refuses the request.
      if (!meta.tls && value.includes(PLACEHOLDER_PREFIX)) {
        const secret = [...value.matchAll(PLACEHOLDER_LIKE)].map((m) => sb.byPlaceholder.get(m[0])?.name).find(Boolean) ?? null;
        return this.refuseSecret(res, sb, name, secret, false);
      }
      const swapped = swapPlaceholders(value, name, (p) => sb.byPlaceholder.get(p), sb.open, lower);
      if ('refused' in swapped) return this.refuseSecret(res, sb, name, swapped.refused, true);
      headers.push(key, swapped.text);
    }
    if (mine.length) headers.push('accept-encoding', ACCEPTED_ENCODINGS);
    // The body: searched too (body.ts); a refusal stops it before the placeholder's bytes leave.
    // A placeholder of a secret for this host that does not go into bodies stays as it is.
    const scan = new BodyScan((p) => {
      const e = sb.byPlaceholder.get(p);
      if (!meta.tls || !e || !hostAllowed(e.hosts, name)) return { refused: e?.name ?? null };
      return injects(e, INJECT_BODY) ? Buffer.from(sb.open(e), 'utf8') : Buffer.from(p, 'latin1');
    });
    const length = lengthAt < 0 ? null : Number(headers[lengthAt]);
    const chunked = req.headers['transfer-encoding'] !== undefined;
    // Framing is written again, never left out: a chunked body goes chunked (whatever the method), a body with a length with its length.
    if (chunked) headers.push('transfer-encoding', 'chunked');
    const send = (body?: Buffer) => this.upstream(req, res, ip, name, meta.tls, headers, mine, sb.open, body);
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

  /**
   * Sends the request upstream (to the address of the sandbox's own answer for `name`) and pipes the
   * answer back chunk by chunk, its headers and body searched for the values of `mine` (each
   * replaced by its placeholder; a compressed body is decompressed first, one the proxy cannot read is refused).
   */
  private upstream(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    ip: string,
    name: string,
    secure: boolean,
    headers: string[],
    mine: SealedEntry[],
    open: (e: SealedEntry) => string,
    body?: Buffer,
  ) {
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
      const values = mine.length ? new ValueScan(mine.map((e) => ({ value: open(e), placeholder: e.placeholder }))) : null;
      const status = upRes.statusCode ?? 502;
      const bodyless = req.method === 'HEAD' || status === 204 || status === 304;
      const coding = String(upRes.headers['content-encoding'] ?? 'identity')
        .trim()
        .toLowerCase();
      const decode = values && !bodyless && coding !== 'identity' ? decoderFor(coding) : null;
      if (decode === undefined) {
        upRes.destroy();
        return this.refuse(res, 502, `${name} answered with content-encoding ${coding.slice(0, 40)}, which the proxy cannot search for sealed values`);
      }
      const out: string[] = [];
      for (let i = 0; i < upRes.rawHeaders.length; i += 2) {
        const lower = upRes.rawHeaders[i]!.toLowerCase();
        if (HOP_BY_HOP.has(lower)) continue;
        // A searched body may change length (and a decoded one loses its coding): it goes chunked.
        if (values && !bodyless && (lower === 'content-length' || (decode && lower === 'content-encoding'))) continue;
        out.push(upRes.rawHeaders[i]!, values ? values.text(upRes.rawHeaders[i + 1]!) : upRes.rawHeaders[i + 1]!);
      }
      res.writeHead(status, values ? values.text(upRes.statusMessage ?? '') : upRes.statusMessage, out);
      // An event stream's headers go at once (its first event may take a while); others go with the first chunk.
      if (/event-stream/i.test(String(upRes.headers['content-type'] ?? ''))) res.flushHeaders();
      upRes.on('error', () => res.destroy());
      if (!values || bodyless) return void upRes.pipe(res);
      const source: NodeJS.ReadableStream = decode ? upRes.pipe(decode) : upRes;
      if (decode) decode.on('error', () => res.destroy());
      const search = new Transform({
        transform(chunk: Buffer, _enc, cb) {
          const b = values.push(chunk, false);
          cb(null, b.length ? b : undefined);
        },
        flush(cb) {
          const b = values.push(EMPTY, true);
          cb(null, b.length ? b : undefined);
        },
      });
      source.pipe(search).pipe(res);
    });
    up.on('error', (err) => this.refuse(res, 502, `${name}: ${err.message}`));
    res.on('close', () => {
      if (!res.writableFinished) up.destroy();
    });
    if (body) up.end(body.length ? body : undefined);
    return up;
  }
}

/** What the proxy asks for when it must search the answer: no coding (one that comes anyway is decoded when it can be, else refused). */
const ACCEPTED_ENCODINGS = 'identity';

/** A decoder for a content-encoding the proxy can search through; undefined: one it cannot. */
function decoderFor(coding: string): Transform | undefined {
  if (coding === 'gzip' || coding === 'x-gzip') return zlib.createGunzip();
  if (coding === 'deflate') return zlib.createInflate();
  if (coding === 'br') return zlib.createBrotliDecompress();
  return undefined;
}
