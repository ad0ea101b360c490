import dgram from 'node:dgram';
import * as dnsPacket from 'dns-packet';

/**
 * The upstream name server of the test stack's sandbox resolver (SANDBOX_DNS is set to
 * SAP_TEST_DNS_UPSTREAM by the global setup): answers the A records a test gives it and NXDOMAIN
 * for every other name; names under a suffix given to `silence` are recorded but never answered (an
 * upstream that keeps the resolver waiting). UDP only, on loopback. `close()` it in afterAll.
 */
export class FakeDns {
  private readonly records = new Map<string, string>();
  private readonly silent: string[] = [];
  private sock: dgram.Socket | null = null;
  /** Every name asked, in order (so a test can tell that a refused name never left the host). */
  readonly asked: string[] = [];

  set(name: string, address: string): this {
    this.records.set(name.toLowerCase(), address);
    return this;
  }

  /** Never answers names ending in `suffix` (they are still recorded in `asked`). */
  silence(suffix: string): this {
    this.silent.push(suffix.toLowerCase());
    return this;
  }

  async listen(hostPort = process.env.SAP_TEST_DNS_UPSTREAM): Promise<this> {
    if (!hostPort) throw new Error('SAP_TEST_DNS_UPSTREAM is not set (is the global setup running?)');
    const [host, port] = hostPort.split(':');
    const sock = dgram.createSocket('udp4');
    sock.on('message', (msg, rinfo) => {
      let q: dnsPacket.Packet;
      try {
        q = dnsPacket.decode(msg);
      } catch {
        return;
      }
      const question = q.questions?.[0];
      if (!question) return;
      this.asked.push(question.name);
      if (this.silent.some((s) => question.name.toLowerCase().endsWith(s))) return;
      const address = question.type === 'A' ? this.records.get(question.name.toLowerCase()) : undefined;
      const known = this.records.has(question.name.toLowerCase());
      const reply = dnsPacket.encode({
        id: q.id,
        type: 'response',
        flags: dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE | (known ? 0 : 3),
        questions: q.questions,
        answers: address ? [{ type: 'A', name: question.name, ttl: 30, data: address }] : [],
      });
      sock.send(reply, rinfo.port, rinfo.address);
    });
    await new Promise<void>((resolve, reject) => {
      sock.once('error', reject);
      sock.bind(Number(port), host, () => resolve());
    });
    this.sock = sock;
    return this;
  }

  async close(): Promise<void> {
    const sock = this.sock;
    this.sock = null;
    if (sock) await new Promise<void>((r) => sock.close(() => r()));
  }
}
