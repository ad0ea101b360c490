/**
 * The resolver's side towards the upstream name servers (see ./dns.ts): a fixed pool of UDP sockets
 * shared by every sandbox (queries told apart by a fresh random id), TCP for truncated answers through
 * a bounded number of connections (Gate), and the REFUSED/SERVFAIL replies.
 */
import { randomInt } from 'node:crypto';
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

export function reply(q: dnsPacket.Packet, rcode: number): Buffer {
  return dnsPacket.encode({
    id: q.id,
    type: 'response',
    flags: ((q.flags ?? 0) & dnsPacket.RECURSION_DESIRED) | dnsPacket.RECURSION_AVAILABLE | rcode,
    questions: q.questions,
  });
}

/** At most `size` holders at once; the others wait their turn, first come first served. */
export class Gate {
  private active = 0;
  private readonly queue: (() => void)[] = [];
  constructor(private readonly size: number) {}

  acquire(): Promise<() => void> {
    return new Promise((resolve) => {
      const grant = () => {
        this.active += 1;
        let done = false;
        resolve(() => {
          if (done) return;
          done = true;
          this.active -= 1;
          this.queue.shift()?.();
        });
      };
      if (this.active < this.size) grant();
      else this.queue.push(grant);
    });
  }
}

export interface Pending {
  up: Upstream;
  id: number;
  name: string;
  type: string;
  resolve: (msg: Buffer) => void;
  reject: (err: Error) => void;
  timer: NodeJS.Timeout;
}

/**
 * A fixed pool of UDP sockets towards the upstreams, shared by every query: each query goes out on
 * one of them under a fresh random id (unique among the queries in flight), and an answer is taken
 * only from the upstream asked, with that id and the same question; the client's id is put back.
 */
export class UdpUpstreams {
  private readonly sockets: (dgram.Socket | null)[];
  private readonly pending = new Map<number, Pending>();
  private next = 0;
  private closed = false;

  constructor(
    size: number,
    private readonly timeoutMs: number,
    private readonly log: Logger,
  ) {
    this.sockets = new Array<dgram.Socket | null>(size).fill(null);
  }

  ask(up: Upstream, query: Buffer, question: dnsPacket.Question): Promise<Buffer> {
    if (this.closed) return Promise.reject(new Error('closed'));
    if (query.length < 12) return Promise.reject(new Error('short query'));
    if (this.pending.size >= 0xf000) return Promise.reject(new Error('too many queries in flight'));
    let id: number;
    do id = randomInt(0x10000);
    while (this.pending.has(id));
    const slot = this.next;
    this.next = (this.next + 1) % this.sockets.length;
    const sock = this.socket(slot);
    const out = Buffer.from(query);
    out.writeUInt16BE(id, 0);
    return new Promise<Buffer>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error('timeout'));
      }, this.timeoutMs);
      this.pending.set(id, { up, id: query.readUInt16BE(0), name: question.name.toLowerCase(), type: question.type, resolve, reject, timer });
      sock.send(out, up.port, up.host, (err) => {
        if (!err) return;
        clearTimeout(timer);
        this.pending.delete(id);
        reject(err);
      });
    });
  }

  close(): void {
    this.closed = true;
    for (const s of this.sockets) s?.close();
    this.sockets.fill(null);
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(new Error('closed'));
    }
    this.pending.clear();
  }

  private socket(slot: number): dgram.Socket {
    const have = this.sockets[slot];
    if (have) return have;
    const sock = dgram.createSocket('udp4');
    sock.on('message', (msg, rinfo) => this.received(msg, rinfo));
    sock.on('error', (err) => {
      this.log.warn({ err: err.message }, 'sandbox resolver: upstream socket error; it is replaced');
      if (this.sockets[slot] === sock) this.sockets[slot] = null;
      sock.close();
    });
    this.sockets[slot] = sock;
    return sock;
  }

  private received(msg: Buffer, rinfo: dgram.RemoteInfo): void {
    if (msg.length < 12) return;
    const p = this.pending.get(msg.readUInt16BE(0));
    if (!p || rinfo.address !== p.up.host || rinfo.port !== p.up.port) return;
    let q: dnsPacket.Question | undefined;
    try {
      q = dnsPacket.decode(msg).questions?.[0];
    } catch {
      return;
    }
    if (!q || q.name.toLowerCase() !== p.name || q.type !== p.type) return;
    clearTimeout(p.timer);
    this.pending.delete(msg.readUInt16BE(0));
    const answer = Buffer.from(msg);
    answer.writeUInt16BE(p.id, 0);
    p.resolve(answer);
  }
}

export function askTcp(up: Upstream, query: Buffer, timeoutMs: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const s = net.connect(up.port, up.host);
    let buf = Buffer.alloc(0);
    const timer = setTimeout(() => s.destroy(new Error('timeout')), timeoutMs);
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
      if (buf.length > 65_537) return void s.destroy(new Error('answer too long'));
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
