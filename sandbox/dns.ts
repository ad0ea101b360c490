/**
 * The sandboxes' resolver. Each sandbox's /etc/resolv.conf names RESOLVER_ADDRESS (network.ts);
 * the network table redirects port 53 of it to this resolver, which runs in the sandbox host. It knows each sandbox by its link's address (sources are checked by the table's
 * reverse-path rule before any host service sees a packet, so a sandbox cannot speak for another) and asks `decide` what that sandbox may
 * resolve: everything, nothing, or only names of its allow list. An allowed name's IPv4 answers are
 * admitted into the sandbox's allow list in the table (`admit`) before the answer is sent, so the
 * connection that follows goes through. Everything else is answered REFUSED at once.
 *
 * What one sandbox can make the host hold is bounded (ResolverLimits): queries in flight and per
 * second per sandbox (over them a UDP query is dropped, a TCP connection is read no further until
 * it may go on), TCP connections per sandbox and in all, queries in flight per TCP connection; the
 * upstreams are asked through a fixed pool of UDP sockets shared by every sandbox (queries told apart
 * by a fresh random id), and over TCP (a truncated answer to a TCP client) through a bounded number
 * of connections. A flood from one sandbox therefore slows that sandbox only.
 */
import dgram from 'node:dgram';
import net from 'node:net';
import * as dnsPacket from 'dns-packet';
import type { Logger } from 'pino';
import { askTcp, Gate, parseUpstream, reply, UdpUpstreams, type Upstream } from './dns-upstreams';

export { parseUpstream, type Upstream };

/** What the sandbox at a source address may resolve. `null`: not a sandbox of this host. */
export type Decision = 'all' | 'none' | { names: string[] } | null;

/** The resolver's bounds: per sandbox (source address), and on the sockets the host holds for all. */
export interface ResolverLimits {
  /** Queries of one sandbox being answered at once (SANDBOX_DNS_MAX_INFLIGHT). */
  inflightPerSource: number;
  /** Queries per second of one sandbox, and its burst (SANDBOX_DNS_RATE; UDP is also limited so in the table). */
  ratePerSecond: number;
  /** UDP sockets towards the upstreams, shared by all sandboxes (SANDBOX_DNS_UPSTREAM_SOCKETS). */
  upstreamSockets: number;
  /** TCP connections towards the upstreams at once, shared by all sandboxes (SANDBOX_DNS_UPSTREAM_TCP). */
  upstreamTcp: number;
  /** TCP connections of one sandbox to the resolver (SANDBOX_DNS_TCP_PER_SANDBOX). */
  tcpPerSource: number;
  /** TCP connections to the resolver in all (SANDBOX_DNS_TCP_MAX). */
  tcpTotal: number;
  /** Queries of one TCP connection being answered at once (SANDBOX_DNS_TCP_PIPELINE). */
  tcpPipeline: number;
}

export const DEFAULT_RESOLVER_LIMITS: Readonly<ResolverLimits> = {
  inflightPerSource: 32,
  ratePerSecond: 200,
  upstreamSockets: 4,
  upstreamTcp: 16,
  tcpPerSource: 4,
  tcpTotal: 256,
  tcpPipeline: 8,
};

const LIMIT_VARS: Record<keyof ResolverLimits, string> = {
  inflightPerSource: 'SANDBOX_DNS_MAX_INFLIGHT',
  ratePerSecond: 'SANDBOX_DNS_RATE',
  upstreamSockets: 'SANDBOX_DNS_UPSTREAM_SOCKETS',
  upstreamTcp: 'SANDBOX_DNS_UPSTREAM_TCP',
  tcpPerSource: 'SANDBOX_DNS_TCP_PER_SANDBOX',
  tcpTotal: 'SANDBOX_DNS_TCP_MAX',
  tcpPipeline: 'SANDBOX_DNS_TCP_PIPELINE',
};

/** The limits the environment sets (SANDBOX_DNS_*); throws on a value that is not a whole number from 1 to 65535. */
export function resolverLimitsFromEnv(env: NodeJS.ProcessEnv): Partial<ResolverLimits> {
  const out: Partial<ResolverLimits> = {};
  for (const [key, name] of Object.entries(LIMIT_VARS) as [keyof ResolverLimits, string][]) {
    const text = env[name]?.trim();
    if (!text) continue;
    const n = Number(text);
    if (!Number.isInteger(n) || n < 1 || n > 65535) throw new Error(`${name} must be a whole number from 1 to 65535: ${text}`);
    out[key] = n;
  }
  return out;
}

export interface ResolverOptions {
  port: number;
  /** The address it listens on (network.ts: the host's sandbox-facing service address); default 0.0.0.0. */
  address?: string;
  upstreams: () => Upstream[];
  decide: (source: string) => Decision;
  /** Lets `source` reach `addresses` for `ttlSeconds` (called before the answer goes out). */
  admit: (source: string, addresses: string[], ttlSeconds: number) => Promise<void>;
  /** Sealed secrets (seal/proxy.ts): whether `name`'s answers for `source` go to the egress proxy, and steering them there. */
  sealed?: {
    wants: (source: string, name: string) => boolean;
    admit: (source: string, name: string, addresses: string[], ttlSeconds: number) => Promise<void>;
  };
  /** Default: DEFAULT_RESOLVER_LIMITS. */
  limits?: ResolverLimits;
  /** How long an upstream has to answer (default 2 s). */
  upstreamTimeoutMs?: number;
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
/** The TC bit: the answer did not fit in a datagram. */
const TRUNCATED = 0x0200;
/** How often the per-sandbox counters of idle sandboxes are dropped. */
const SWEEP_MS = 10_000;

/** What the resolver counts for one source address. */
interface SourceState {
  inflight: number;
  /** Token bucket of the query rate: tokens now, and when it was last filled (ms). */
  tokens: number;
  filled: number;
  tcp: number;
  /** TCP connections waiting for one of this source's queries in flight to end. */
  waiting: Set<() => void>;
}

export class SandboxResolver {
  private udp: dgram.Socket | null = null;
  private tcp: net.Server | null = null;
  /** Refusals logged per source in the current minute (the log is rate-limited per sandbox). */
  private readonly logged = new Map<string, number>();
  private logWindow = 0;
  private readonly limits: ResolverLimits;
  private readonly sources = new Map<string, SourceState>();
  private sweeper: NodeJS.Timeout | null = null;
  private readonly upstreamUdp: UdpUpstreams;
  private readonly upstreamTcp: Gate;

  constructor(private readonly o: ResolverOptions) {
    this.limits = o.limits ?? DEFAULT_RESOLVER_LIMITS;
    this.upstreamUdp = new UdpUpstreams(this.limits.upstreamSockets, o.upstreamTimeoutMs ?? UPSTREAM_TIMEOUT_MS, o.log);
    this.upstreamTcp = new Gate(this.limits.upstreamTcp);
  }

  async start(): Promise<void> {
    const udp = dgram.createSocket('udp4');
    udp.on('message', (msg, rinfo) => {
      const source = rinfo.address;
      if (this.o.decide(source) === null || this.take(source) !== 0) return;
      void this.answer(msg, source, false)
        .catch(() => null)
        .then((reply) => {
          if (reply && this.udp === udp) udp.send(reply, rinfo.port, rinfo.address);
        })
        .finally(() => this.release(source));
    });
    const tcp = net.createServer((sock) => this.serveTcp(sock));
    tcp.maxConnections = this.limits.tcpTotal;
    const listen = (bind: (cb: () => void) => void, emitter: NodeJS.EventEmitter) =>
      new Promise<void>((resolve, reject) => {
        emitter.once('error', reject);
        bind(() => {
          emitter.off('error', reject);
          resolve();
        });
      });
    try {
      await listen((cb) => udp.bind(this.o.port, this.o.address ?? '0.0.0.0', cb), udp);
      await listen((cb) => tcp.listen(this.o.port, this.o.address ?? '0.0.0.0', cb), tcp);
    } catch (err) {
      udp.close();
      tcp.close();
      throw new Error(`the sandboxes' resolver cannot listen on port ${this.o.port} (SANDBOX_DNS_PORT): ${(err as Error).message}`);
    }
    udp.on('error', (err) => this.o.log.warn({ err: err.message }, 'sandbox resolver: udp error'));
    tcp.on('error', (err) => this.o.log.warn({ err: err.message }, 'sandbox resolver: tcp error'));
    this.udp = udp;
    this.tcp = tcp;
    this.sweeper = setInterval(() => this.sweep(), SWEEP_MS).unref();
  }

  async close(): Promise<void> {
    const udp = this.udp;
    const tcp = this.tcp;
    this.udp = null;
    this.tcp = null;
    if (this.sweeper) clearInterval(this.sweeper);
    this.sweeper = null;
    this.upstreamUdp.close();
    await Promise.all([udp ? new Promise<void>((r) => udp.close(() => r())) : undefined, tcp ? new Promise<void>((r) => tcp.close(() => r())) : undefined]);
  }

  private state(source: string): SourceState {
    let st = this.sources.get(source);
    if (!st) {
      st = { inflight: 0, tokens: this.limits.ratePerSecond, filled: Date.now(), tcp: 0, waiting: new Set() };
      this.sources.set(source, st);
    }
    return st;
  }

  /**
   * Counts a query of `source` in: 0 when it may go on, -1 when the source has its most queries in
   * flight (wait for one to end), or how many ms until its rate allows the next one.
   */
  private take(source: string): number {
    const st = this.state(source);
    const now = Date.now();
    const rate = this.limits.ratePerSecond;
    st.tokens = Math.min(rate, st.tokens + ((now - st.filled) * rate) / 1000);
    st.filled = now;
    if (st.inflight >= this.limits.inflightPerSource) return -1;
    if (st.tokens < 1) return Math.max(1, Math.ceil(((1 - st.tokens) * 1000) / rate));
    st.tokens -= 1;
    st.inflight += 1;
    return 0;
  }

  private release(source: string): void {
    const st = this.sources.get(source);
    if (!st) return;
    st.inflight -= 1;
    const waiting = [...st.waiting];
    st.waiting.clear();
    for (const wake of waiting) wake();
  }

  /** Forgets the counters of sources with nothing in flight, no connection and a full bucket. */
  private sweep(): void {
    const now = Date.now();
    for (const [source, st] of this.sources) {
      const full = st.tokens + ((now - st.filled) * this.limits.ratePerSecond) / 1000 >= this.limits.ratePerSecond;
      if (st.inflight === 0 && st.tcp === 0 && st.waiting.size === 0 && full) this.sources.delete(source);
    }
  }

  /**
   * One TCP client: at most tcpPerSource connections per source; queries are read as they may be
   * answered (at most tcpPipeline of the connection and inflightPerSource of its source in flight,
   * within the source's rate, and not while answers wait to be read): otherwise the socket is paused.
   */
  private serveTcp(sock: net.Socket): void {
    const source = sock.remoteAddress?.replace(/^::ffff:/, '') ?? '';
    if (this.o.decide(source) === null) return void sock.destroy();
    const st = this.state(source);
    if (st.tcp >= this.limits.tcpPerSource) return void sock.destroy();
    st.tcp += 1;
    let buf: Buffer = Buffer.alloc(0);
    let outstanding = 0;
    let timer: NodeJS.Timeout | null = null;
    const complete = () => buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0);
    const pump = (): void => {
      if (sock.destroyed) return;
      while (complete() && outstanding < this.limits.tcpPipeline && !sock.writableNeedDrain && !timer) {
        const wait = this.take(source);
        if (wait === -1) {
          this.state(source).waiting.add(pump);
          break;
        }
        if (wait > 0) {
          timer = setTimeout(() => {
            timer = null;
            pump();
          }, wait);
          break;
        }
        const msg = Buffer.from(buf.subarray(2, 2 + buf.readUInt16BE(0)));
        buf = buf.subarray(2 + msg.length);
        outstanding += 1;
        void this.answer(msg, source, true)
          .catch(() => null)
          .then((reply) => {
            if (!reply || sock.destroyed) return;
            const len = Buffer.alloc(2);
            len.writeUInt16BE(reply.length);
            sock.write(Buffer.concat([len, reply]));
          })
          .finally(() => {
            outstanding -= 1;
            this.release(source);
            pump();
          });
      }
      // A whole query not yet taken: read no more until it is (the buffer holds at most one more read).
      if (complete()) sock.pause();
      else sock.resume();
    };
    sock.setTimeout(10_000, () => sock.destroy());
    sock.on('error', () => sock.destroy());
    sock.on('drain', pump);
    sock.on('data', (d: Buffer) => {
      buf = buf.length ? Buffer.concat([buf, d]) : d;
      pump();
    });
    sock.on('close', () => {
      if (timer) clearTimeout(timer);
      timer = null;
      buf = Buffer.alloc(0);
      const now = this.sources.get(source);
      if (now) {
        now.tcp -= 1;
        now.waiting.delete(pump);
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
    const upstreamReply = await this.forward(query, question, overTcp);
    if (!upstreamReply) return reply(packet, SERVFAIL);
    const sealing = this.o.sealed?.wants(source, question.name) === true;
    if (restricted || sealing) {
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
          if (restricted) await this.o.admit(source, [...new Set(a.map((r) => r.data))], ttl);
          if (sealing) await this.o.sealed!.admit(source, question.name, [...new Set(a.map((r) => r.data))], ttl);
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

  /**
   * Asks the upstreams in turn over UDP; a truncated answer to a TCP client is asked again over TCP
   * (through the bounded gate). Null when none answered.
   */
  private async forward(query: Buffer, question: dnsPacket.Question, overTcp: boolean): Promise<Buffer | null> {
    for (const up of this.o.upstreams()) {
      let r = await this.upstreamUdp.ask(up, query, question).catch(() => null);
      if (r && overTcp && r.readUInt16BE(2) & TRUNCATED) {
        const release = await this.upstreamTcp.acquire();
        try {
          r = await askTcp(up, query, this.o.upstreamTimeoutMs ?? UPSTREAM_TIMEOUT_MS).catch(() => r);
        } finally {
          release();
        }
      }
      if (r) return r;
    }
    return null;
  }
}
