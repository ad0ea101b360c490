/**
 * The sandboxes' resolver. Each sandbox's /etc/resolv.conf names RESOLVER_ADDRESS (network.ts);
 * the network table redirects port 53 of it to this resolver, which runs in the sandbox host. It knows each sandbox by its link's address (sources are checked by the table's
 * reverse-path rule, so a sandbox cannot speak for another) and asks `decide` what that sandbox may
 * resolve: everything, nothing, or only names of its allow list. An allowed name's IPv4 answers are
 * admitted into the sandbox's allow list in the table (`admit`) before the answer is sent, so the
 * connection that follows goes through. Everything else is answered REFUSED at once.
 */
import dgram from 'node:dgram';
import net from 'node:net';
import * as dnsPacket from 'dns-packet';
import type { Logger } from 'pino';

/** An upstream name server: the host's resolvers (or SANDBOX_DNS), `addr` or `addr:port`. */
export interface Upstream {
  host: string;
  port: number;
}

export function parseUpstream(text: string): Upstream {
  const m = /^(\d{1,3}(?:\.\d{1,3}){3})(?::(\d{1,5}))?$/.exec(text.trim());
  if (!m || net.isIP(m[1]!) !== 4) throw new Error(`not an IPv4 name server (a.b.c.d or a.b.c.d:port): ${text}`);
  const port = m[2] ? Number(m[2]) : 53;
  if (port < 1 || port > 65535) throw new Error(`not a port: ${text}`);
  return { host: m[1]!, port };
}

/** What the sandbox at a source address may resolve. `null`: not a sandbox of this host. */
export type Decision = 'all' | 'none' | { names: string[] } | null;

export interface ResolverOptions {
  port: number;
  upstreams: () => Upstream[];
  decide: (source: string) => Decision;
  /** Lets `source` reach `addresses` for `ttlSeconds` (called before the answer goes out). */
  admit: (source: string, addresses: string[], ttlSeconds: number) => Promise<void>;
  log: Logger;
}

/** `*.example.com` matches names under example.com (not example.com itself); other patterns match exactly. */
export function nameMatches(patterns: string[], name: string): boolean {
  const n = name.toLowerCase().replace(/\.$/, '');
  return patterns.some((p) => (p.startsWith('*.') ? n.endsWith(p.slice(1)) && n.length > p.length - 1 : n === p));
}

const UPSTREAM_TIMEOUT_MS = 2000;
const REFUSED = 5;
const SERVFAIL = 2;

export class SandboxResolver {
  private udp: dgram.Socket | null = null;
  private tcp: net.Server | null = null;
  /** Refusals logged per source in the current minute (the log is rate-limited per sandbox). */
  private readonly logged = new Map<string, number>();
  private logWindow = 0;

  constructor(private readonly o: ResolverOptions) {}

  async start(): Promise<void> {
    const udp = dgram.createSocket('udp4');
    udp.on('message', (msg, rinfo) => {
      void this.answer(msg, rinfo.address, false).then((reply) => {
        if (reply) udp.send(reply, rinfo.port, rinfo.address);
      });
    });
    const tcp = net.createServer((sock) => this.serveTcp(sock));
    const listen = (bind: (cb: () => void) => void, emitter: NodeJS.EventEmitter) =>
      new Promise<void>((resolve, reject) => {
        emitter.once('error', reject);
        bind(() => {
          emitter.off('error', reject);
          resolve();
        });
      });
    try {
      await listen((cb) => udp.bind(this.o.port, '0.0.0.0', cb), udp);
      await listen((cb) => tcp.listen(this.o.port, '0.0.0.0', cb), tcp);
    } catch (err) {
      udp.close();
      tcp.close();
      throw new Error(`the sandboxes' resolver cannot listen on port ${this.o.port} (SANDBOX_DNS_PORT): ${(err as Error).message}`);
    }
    udp.on('error', (err) => this.o.log.warn({ err: err.message }, 'sandbox resolver: udp error'));
    tcp.on('error', (err) => this.o.log.warn({ err: err.message }, 'sandbox resolver: tcp error'));
    this.udp = udp;
    this.tcp = tcp;
  }

  async close(): Promise<void> {
    const udp = this.udp;
    const tcp = this.tcp;
    this.udp = null;
    this.tcp = null;
    await Promise.all([
      udp ? new Promise<void>((r) => udp.close(() => r())) : undefined,
      tcp ? new Promise<void>((r) => tcp.close(() => r())) : undefined,
    ]);
  }

  private serveTcp(sock: net.Socket): void {
    let buf = Buffer.alloc(0);
    sock.setTimeout(10_000, () => sock.destroy());
    sock.on('error', () => sock.destroy());
    sock.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      if (buf.length > 65_537) return void sock.destroy();
      while (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
        const msg = buf.subarray(2, 2 + buf.readUInt16BE(0));
        buf = buf.subarray(2 + msg.length);
        void this.answer(Buffer.from(msg), sock.remoteAddress?.replace(/^::ffff:/, '') ?? '', true).then((reply) => {
          if (!reply || sock.destroyed) return;
          const len = Buffer.alloc(2);
          len.writeUInt16BE(reply.length);
          sock.write(Buffer.concat([len, reply]));
        });
      }
    });
  }

  /** The reply to one query from `source`, or null to stay silent (not a query, or not a sandbox). */
  private async answer(query: Buffer, source: string, overTcp: boolean): Promise<Buffer | null> {
    let packet: dnsPacket.Packet;
    try {
      packet = dnsPacket.decode(query);
    } catch {
      return null;
    }
    if (packet.type !== 'query' || !packet.questions?.length) return null;
    const decision = this.o.decide(source);
    if (decision === null) return null;
    const question = packet.questions[0]!;
    const restricted = typeof decision === 'object';
    if (decision === 'none' || (restricted && !nameMatches(decision.names, question.name))) {
      this.logRefusal(source, question.name, question.type);
      return reply(packet, REFUSED);
    }
    const upstreamReply = await this.forward(query, overTcp);
    if (!upstreamReply) return reply(packet, SERVFAIL);
    if (restricted) {
      let decoded: dnsPacket.Packet;
      try {
        decoded = dnsPacket.decode(upstreamReply);
      } catch {
        return reply(packet, SERVFAIL);
      }
      const a = (decoded.answers ?? []).filter((r): r is dnsPacket.StringAnswer => r.type === 'A');
      if (a.length) {
        const ttl = Math.min(...a.map((r) => r.ttl ?? 0));
        try {
          await this.o.admit(source, [...new Set(a.map((r) => r.data))], ttl);
        } catch (err) {
          this.o.log.warn({ sandbox: source, name: question.name, err: (err as Error).message }, 'sandbox resolver: could not admit addresses');
          return reply(packet, SERVFAIL);
        }
      }
    }
    return upstreamReply;
  }

  private logRefusal(source: string, name: string, type: string): void {
    const minute = Math.floor(Date.now() / 60_000);
    if (minute !== this.logWindow) {
      this.logWindow = minute;
      this.logged.clear();
    }
    const n = (this.logged.get(source) ?? 0) + 1;
    this.logged.set(source, n);
    if (n <= 10) this.o.log.info({ sandboxAddress: source, name, type }, 'sandbox resolver: name refused by the egress policy');
    else if (n === 11) this.o.log.info({ sandboxAddress: source }, 'sandbox resolver: more refusals this minute are not logged');
  }

  /** Asks the upstreams in turn; null when none answered. */
  private async forward(query: Buffer, overTcp: boolean): Promise<Buffer | null> {
    for (const up of this.o.upstreams()) {
      const r = await (overTcp ? askTcp(up, query) : askUdp(up, query)).catch(() => null);
      if (r) return r;
    }
    return null;
  }
}

function reply(q: dnsPacket.Packet, rcode: number): Buffer {
  return dnsPacket.encode({
    id: q.id,
    type: 'response',
    flags: ((q.flags ?? 0) & dnsPacket.RECURSION_DESIRED) | dnsPacket.RECURSION_AVAILABLE | rcode,
    questions: q.questions,
  });
}

function askUdp(up: Upstream, query: Buffer): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const s = dgram.createSocket('udp4');
    const done = (err: Error | null, msg?: Buffer) => {
      clearTimeout(timer);
      s.close();
      if (err) reject(err);
      else resolve(msg!);
    };
    const timer = setTimeout(() => done(new Error('timeout')), UPSTREAM_TIMEOUT_MS);
    s.on('error', (err) => done(err));
    s.on('message', (msg) => {
      if (msg.length >= 2 && msg.readUInt16BE(0) === query.readUInt16BE(0)) done(null, msg);
    });
    s.send(query, up.port, up.host);
  });
}

function askTcp(up: Upstream, query: Buffer): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const s = net.connect(up.port, up.host);
    let buf = Buffer.alloc(0);
    const timer = setTimeout(() => s.destroy(new Error('timeout')), UPSTREAM_TIMEOUT_MS);
    s.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    s.on('connect', () => {
      const len = Buffer.alloc(2);
      len.writeUInt16BE(query.length);
      s.write(Buffer.concat([len, query]));
    });
    s.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      if (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
        clearTimeout(timer);
        s.destroy();
        resolve(buf.subarray(2, 2 + buf.readUInt16BE(0)));
      }
    });
    s.on('close', () => {
      clearTimeout(timer);
      reject(new Error('closed'));
    });
  });
}
