import dgram from 'node:dgram';
import net from 'node:net';
import * as dnsPacket from 'dns-packet';
import pino from 'pino';
import { freePort } from '../../scripts/launcher';
import { resolverLimitsFromEnv, SandboxResolver, type ResolverLimits } from '../../sandbox/dns';
import { eventually } from '../helpers/env';

/*
 * The sandboxes' resolver's bounds (sandbox/dns.ts), on loopback: 127.0.0.1 and 127.0.0.2 play two
 * sandboxes. The upstream is held: it answers only names under `ok.test`, so the queries of a flood
 * stay in flight for the whole test (the upstream timeout is a minute) and every bound is exact.
 */

/** 127.0.0.1 floods over UDP, 127.0.0.3 over TCP; 127.0.0.2 and 127.0.0.1x are other sandboxes. */
const LIMITS: ResolverLimits = {
  inflightPerSource: 5,
  ratePerSecond: 10_000,
  upstreamSockets: 2,
  upstreamTcp: 2,
  tcpPerSource: 2,
  tcpTotal: 64,
  tcpPipeline: 2,
};

interface Seen {
  name: string;
  id: number;
  port: number;
}

class HeldUpstream {
  readonly seen: Seen[] = [];
  private sock = dgram.createSocket('udp4');
  port = 0;

  async listen(): Promise<void> {
    this.sock.on('message', (msg, rinfo) => {
      const q = dnsPacket.decode(msg);
      const name = q.questions![0]!.name;
      this.seen.push({ name, id: q.id!, port: rinfo.port });
      if (!name.endsWith('ok.test')) return;
      const answer = dnsPacket.encode({
        id: q.id,
        type: 'response',
        flags: dnsPacket.RECURSION_AVAILABLE,
        questions: q.questions,
        answers: [{ type: 'A', name, ttl: 30, data: '198.18.0.1' }],
      });
      this.sock.send(answer, rinfo.port, rinfo.address);
    });
    await new Promise<void>((r) => this.sock.bind(0, '127.0.0.1', r));
    this.port = this.sock.address().port;
  }

  count(suffix: string): number {
    return this.seen.filter((s) => s.name.endsWith(suffix)).length;
  }

  close(): Promise<void> {
    return new Promise((r) => this.sock.close(() => r()));
  }
}

const query = (name: string, id = 4242) => dnsPacket.encode({ id, type: 'query', flags: dnsPacket.RECURSION_DESIRED, questions: [{ type: 'A', name }] });

/** A UDP client bound to `address`; `next` resolves with the next datagram it receives. */
async function client(address: string): Promise<{ send: (b: Buffer) => void; next: () => Promise<dnsPacket.Packet>; close: () => Promise<void> }> {
  const sock = dgram.createSocket('udp4');
  await new Promise<void>((r) => sock.bind(0, address, r));
  return {
    send: (b) => sock.send(b, port, '127.0.0.1'),
    next: () => new Promise((resolve) => sock.once('message', (m) => resolve(dnsPacket.decode(m)))),
    close: () => new Promise((r) => sock.close(() => r())),
  };
}

let port = 0;
let upstream: HeldUpstream;
let resolver: SandboxResolver;
const opened: { close: () => unknown }[] = [];

beforeAll(async () => {
  upstream = new HeldUpstream();
  await upstream.listen();
  port = await freePort();
  resolver = new SandboxResolver({
    port,
    upstreams: () => [{ host: '127.0.0.1', port: upstream.port }],
    decide: (source) => (source.startsWith('127.') ? 'all' : null),
    admit: async () => undefined,
    limits: LIMITS,
    upstreamTimeoutMs: 60_000,
    log: pino({ level: 'silent' }),
  });
  await resolver.start();
});

afterAll(async () => {
  for (const o of opened) await o.close();
  await resolver.close();
  await upstream.close();
});

/** Another source's query is answered: the resolver has read every datagram sent before it. */
async function answeredFor(address: string, name: string): Promise<dnsPacket.Packet> {
  const c = await client(address);
  opened.push(c);
  const answer = c.next();
  c.send(query(name, 7));
  return answer;
}

describe("the sandboxes' resolver: bounds per sandbox and on the host", () => {
  it('reads its limits from SANDBOX_DNS_* and refuses values that are not whole numbers from 1', () => {
    expect(resolverLimitsFromEnv({ SANDBOX_DNS_MAX_INFLIGHT: '7', SANDBOX_DNS_TCP_PIPELINE: ' 2 ' })).toEqual({ inflightPerSource: 7, tcpPipeline: 2 });
    for (const bad of ['0', '-1', '1.5', 'many', '70000']) expect(() => resolverLimitsFromEnv({ SANDBOX_DNS_RATE: bad })).toThrow(/SANDBOX_DNS_RATE/);
  });

  it('a UDP flood from one source has at most its in-flight limit at the upstream; another source is answered meanwhile', async () => {
    const flood = await client('127.0.0.1');
    opened.push(flood);
    // Sixty: well past the limit, and few enough for the resolver's socket buffer to hold them all
    // with the other source's query behind them (on a host, the table limits each sandbox's rate).
    for (let i = 0; i < 60; i++) flood.send(query(`u${i}.udp-flood.test`, i));
    const other = await answeredFor('127.0.0.2', 'meanwhile.ok.test');
    expect(other.id).toBe(7);
    expect(other.answers?.[0]).toMatchObject({ type: 'A', data: '198.18.0.1' });
    expect(upstream.count('.udp-flood.test')).toBe(LIMITS.inflightPerSource);
  });

  it('asks the upstreams from a fixed pool of sockets, under ids of its own, and gives each client its own answer', async () => {
    const clients = await Promise.all(Array.from({ length: 12 }, (_, i) => client(`127.0.0.${10 + i}`)));
    opened.push(...clients);
    const answers = await Promise.all(
      clients.map((c, i) => {
        const next = c.next();
        c.send(query(`c${i}.pool.ok.test`, 1234));
        return next;
      }),
    );
    answers.forEach((a, i) => expect([a.id, a.questions?.[0]?.name]).toEqual([1234, `c${i}.pool.ok.test`]));
    const ports = new Set(upstream.seen.filter((s) => s.name.endsWith('.pool.ok.test')).map((s) => s.port));
    expect(ports.size).toBeLessThanOrEqual(LIMITS.upstreamSockets);
  });

  it('reads no more pipelined TCP queries than its pipeline limit, and closes connections past the per-source limit', async () => {
    const sockets: net.Socket[] = [];
    const closed: number[] = [];
    for (let c = 0; c < 4; c++) {
      const s = net.connect({ port, host: '127.0.0.1', localAddress: '127.0.0.3' });
      sockets.push(s);
      opened.push({ close: () => s.destroy() });
      s.on('error', () => undefined);
      s.on('close', () => closed.push(c));
      await new Promise<void>((resolve) => s.once('connect', () => resolve()).once('close', () => resolve()));
      const frames = Array.from({ length: 50 }, (_, i) => {
        const q = query(`t${c}-${i}.pipe.test`, i);
        const len = Buffer.alloc(2);
        len.writeUInt16BE(q.length);
        return Buffer.concat([len, q]);
      });
      if (!s.destroyed) s.write(Buffer.concat(frames));
    }
    // Two connections per source are served, each with at most its pipeline in flight (2 × 2 ≤ the source's 5).
    await eventually(async () => upstream.count('.pipe.test') >= 2 * LIMITS.tcpPipeline && closed.length >= 2, 20_000, 20);
    await answeredFor('127.0.0.2', 'marker.ok.test');
    expect(closed.sort()).toEqual([2, 3]);
    for (const c of [0, 1]) expect(upstream.seen.filter((s) => s.name.startsWith(`t${c}-`)).length).toBe(LIMITS.tcpPipeline);
  });
});
