import { DEFAULT_INJECT_INTO, hostAllowed, normaliseAllowedHost, normaliseInjectInto, withoutOverridden } from '../../contract/sealed';
import net from 'node:net';
import tls from 'node:tls';
import { BodyScan, ValueScan } from '../../sandbox/seal/body';
import { framingFault } from '../../sandbox/seal/framing';
import { clientHelloName } from '../../sandbox/seal/sni';
import { swapPlaceholders, type SealedEntry } from '../../sandbox/seal/proxy';

const P1 = `osb_sealed_${'a'.repeat(32)}`;
const P2 = `osb_sealed_${'b'.repeat(32)}`;
const entries = new Map<string, SealedEntry>([
  [P1, { placeholder: P1, name: 'ANTHROPIC_API_KEY', hosts: ['api.anthropic.com'], box: 'k1' }],
  [P2, { placeholder: P2, name: 'GH_TOKEN', hosts: ['*.github.com'], box: 'k2' }],
]);
const opened: string[] = [];
const open = (e: SealedEntry) => (opened.push(e.name), `value-of-${e.box}`);
const swap = (text: string, host: string, where = 'authorization') => swapPlaceholders(text, host, (p) => entries.get(p), open, where);

describe('sealed secrets: allowed hosts', () => {
  it('normalises names and wildcards; refuses addresses, bare and single-label patterns, junk', () => {
    expect(normaliseAllowedHost(' API.Anthropic.com. ')).toBe('api.anthropic.com');
    expect(normaliseAllowedHost('*.GitHub.com')).toBe('*.github.com');
    for (const bad of ['*', '*.com', 'localhost', '10.0.0.1', '*.10.0.0.1', 'a b.com', 'a..b', '-a.com', 'x'.repeat(254), '', 'exa_mple.com', 'http://a.com']) {
      expect(() => normaliseAllowedHost(bad)).toThrow();
    }
  });

  it('matches exact names and proper subdomains of wildcards only', () => {
    expect(hostAllowed(['api.anthropic.com'], 'API.anthropic.com.')).toBe(true);
    expect(hostAllowed(['api.anthropic.com'], 'anthropic.com')).toBe(false);
    expect(hostAllowed(['api.anthropic.com'], 'api.anthropic.com.evil.test')).toBe(false);
    expect(hostAllowed(['api.anthropic.com'], 'evilapi.anthropic.com')).toBe(false);
    expect(hostAllowed(['*.github.com'], 'api.github.com')).toBe(true);
    expect(hostAllowed(['*.github.com'], 'a.b.github.com')).toBe(true);
    expect(hostAllowed(['*.github.com'], 'github.com')).toBe(false);
    expect(hostAllowed(['*.github.com'], 'evilgithub.com')).toBe(false);
    expect(hostAllowed(['*.github.com'], '.github.com')).toBe(false);
  });

  it('a more specific env replaces a sealed secret of the same name', () => {
    const specs = [
      { name: 'A', value: 'x', allowedHosts: ['a.test'] },
      { name: 'B', value: 'y', allowedHosts: ['b.test'] },
    ];
    expect(withoutOverridden(specs, { B: 'mine' }, undefined).map((s) => s.name)).toEqual(['A']);
  });
});

describe('sealed secrets: swapping placeholders', () => {
  beforeEach(() => (opened.length = 0));

  it('puts the value in toward an allowed host, every occurrence', () => {
    expect(swap(`Bearer ${P1}`, 'api.anthropic.com')).toEqual({ text: 'Bearer value-of-k1' });
    expect(swap(`${P2},${P2}`, 'api.github.com')).toEqual({ text: 'value-of-k2,value-of-k2' });
    expect(swap('no placeholder here', 'api.anthropic.com')).toEqual({ text: 'no placeholder here' });
  });

  it('refuses, naming the secret, toward any other host, and opens nothing', () => {
    expect(swap(`Bearer ${P1}`, 'api.github.com')).toEqual({ refused: 'ANTHROPIC_API_KEY' });
    // One allowed and one not in the same header: refused as a whole.
    expect(swap(`${P2} ${P1}`, 'api.github.com')).toEqual({ refused: 'ANTHROPIC_API_KEY' });
    expect(opened.filter((n) => n === 'ANTHROPIC_API_KEY')).toEqual([]);
  });

  it("refuses a placeholder that is not the sandbox's (another sandbox's, or mangled)", () => {
    expect(swap(`osb_sealed_${'c'.repeat(32)}`, 'api.anthropic.com')).toEqual({ refused: null });
    expect(swap(`${P1.slice(0, -1)}`, 'api.anthropic.com')).toEqual({ refused: null });
    expect(swap(`${P1}X`, 'api.anthropic.com')).toEqual({ refused: null });
    expect(opened).toEqual([]);
  });
});

describe('sealed secrets: the proxy forwards only requests it can check (framing)', () => {
  const H = 'api.anthropic.com';
  /** A request as Node's parser gives it: raw headers in order, the first of each name in headers. */
  const req = (url: string, raw: string[], method = 'GET') => {
    const headers: Record<string, string> = {};
    for (let i = 0; i < raw.length; i += 2) headers[raw[i]!.toLowerCase()] ??= raw[i + 1]!;
    return { url, method, rawHeaders: raw, headers };
  };
  const fault = (url: string, raw: string[], method = 'GET', secure = true) => framingFault(req(url, raw, method), secure, secure ? H : null);

  it("accepts an origin-form request with one Host naming the server (a port only if it is the connection's)", () => {
    expect(fault('/v1/messages?x=1', ['Host', H])).toEqual({ name: H });
    expect(fault('/', ['host', `${H.toUpperCase()}.:443`])).toEqual({ name: H });
    expect(fault('/', ['Host', `${H}:80`], 'GET', false)).toEqual({ name: H });
    expect(fault('/', ['Host', H, 'Transfer-Encoding', 'chunked'], 'POST')).toEqual({ name: H });
    expect(fault('/', ['Host', H, 'Content-Length', '5'], 'POST')).toEqual({ name: H });
  });

  it('refuses absolute and authority targets, Host counts other than one, other names and ports, ambiguous framing', () => {
    const bad: [string, string[], string?][] = [
      [`https://other.test/x`, ['Host', H]],
      [`http://other.test:80/x`, ['Host', H]],
      [`https://${H}/x`, ['Host', H]],
      ['//other.test/x', ['Host', H]],
      ['*', ['Host', H], 'OPTIONS'],
      [`${H}:443`, ['Host', H], 'CONNECT'],
      ['/', []],
      ['/', ['Host', H, 'Host', 'other.test']],
      ['/', ['Host', 'other.test']],
      ['/', ['Host', `${H}:8443`]],
      ['/', ['Host', `user@${H}`]],
      ['/', ['Host', '']],
      ['/', ['Host', H, 'Content-Length', '1', 'Content-Length', '1'], 'POST'],
      ['/', ['Host', H, 'Transfer-Encoding', 'gzip, chunked'], 'POST'],
      ['/', ['Host', H, 'Transfer-Encoding', 'chunked', 'Transfer-Encoding', 'chunked'], 'POST'],
      ['/', ['Host', H, 'Transfer-Encoding', 'chunked', 'Content-Length', '3'], 'POST'],
    ];
    for (const [url, raw, method] of bad) expect(fault(url, raw, method)).toHaveProperty('fault');
  });
});

describe('sealed secrets: where a value goes (injectInto)', () => {
  beforeEach(() => (opened.length = 0));

  it('normalises header names and "body"; refuses framing, routing and hop-by-hop headers and junk', () => {
    expect(normaliseInjectInto(' X-Api-Key ')).toBe('x-api-key');
    expect(normaliseInjectInto('BODY')).toBe('body');
    for (const bad of ['host', 'Content-Length', 'transfer-encoding', 'x-forwarded-host', 'forwarded', 'connection', 'a b', '', 'x:y', 'x'.repeat(101)]) {
      expect(() => normaliseInjectInto(bad)).toThrow();
    }
    expect(DEFAULT_INJECT_INTO).toEqual(expect.arrayContaining(['authorization', 'x-api-key']));
    expect(DEFAULT_INJECT_INTO).not.toContain('body');
  });

  it('swaps only in the headers the secret names (default: the auth headers); elsewhere the placeholder goes as it is', () => {
    expect(swap(`Bearer ${P1}`, 'api.anthropic.com', 'x-debug')).toEqual({ text: `Bearer ${P1}` });
    expect(swap(P1, 'api.anthropic.com', 'x-api-key')).toEqual({ text: 'value-of-k1' });
    const custom: SealedEntry = { placeholder: P1, name: 'K', hosts: ['api.anthropic.com'], inject: ['x-custom'], box: 'k9' };
    const one = (where: string) => swapPlaceholders(P1, 'api.anthropic.com', () => custom, open, where);
    expect(one('x-custom')).toEqual({ text: 'value-of-k9' });
    expect(one('authorization')).toEqual({ text: P1 });
    // Toward a host it is not for it still refuses, wherever it is.
    expect(swap(P1, 'api.github.com', 'x-debug')).toEqual({ refused: 'ANTHROPIC_API_KEY' });
    expect(opened).toEqual(['ANTHROPIC_API_KEY', 'K']);
  });
});

describe('sealed secrets: values in answers', () => {
  const V1 = 'sk-ant-0123456789abcdef';
  const V2 = 'sk-ant-0123456789abcdef-longer';
  const pairs = [
    { value: V1, placeholder: P1 },
    { value: V2, placeholder: P2 },
  ];
  const through = (text: string, cuts: number[]) => {
    const scan = new ValueScan(pairs);
    const out: Buffer[] = [];
    let from = 0;
    for (const c of [...cuts, text.length]) {
      out.push(scan.push(Buffer.from(text.slice(from, c)), c === text.length));
      from = c;
    }
    return Buffer.concat(out).toString();
  };

  it('replaces every value by its placeholder, the longer one first, wherever the answer is cut', () => {
    const text = `{"echo":"${V1}","again":"x${V2}y","h":"Bearer ${V1}"}`;
    const want = `{"echo":"${P1}","again":"x${P2}y","h":"Bearer ${P1}"}`;
    for (let a = 0; a <= text.length; a++) expect(through(text, [a])).toBe(want);
    // Byte by byte.
    expect(
      through(
        text,
        Array.from({ length: text.length - 1 }, (_, i) => i + 1),
      ),
    ).toBe(want);
  });

  it('holds back only a tail that starts a value: an event stream is not delayed', () => {
    const scan = new ValueScan(pairs);
    expect(scan.push(Buffer.from('data: {"a":1}\n\n'), false).toString()).toBe('data: {"a":1}\n\n');
    expect(scan.push(Buffer.from('data: sk-an'), false).toString()).toBe('data: ');
    expect(scan.push(Buffer.from('t-nope\n\n'), false).toString()).toBe('sk-ant-nope\n\n');
  });

  it('replaces values in header text', () => {
    expect(new ValueScan(pairs).text(`Bearer ${V2}, ${V1}`)).toBe(`Bearer ${P2}, ${P1}`);
    expect(new ValueScan([]).empty).toBe(true);
  });
});

describe('sealed secrets: placeholders in bodies', () => {
  /** Runs `body` through a BodyScan toward `host` in the given chunks; what was forwarded, and the refusal if any. */
  const scanBody = (chunks: Buffer[], host: string) => {
    const scan = new BodyScan((p) => {
      const e = entries.get(p);
      return e && hostAllowed(e.hosts, host) ? Buffer.from(open(e)) : { refused: e?.name ?? null };
    });
    const sent: Buffer[] = [];
    for (let i = 0; i < chunks.length; i++) {
      const r = scan.push(chunks[i]!, i === chunks.length - 1);
      if (!Buffer.isBuffer(r)) return { sent: Buffer.concat(sent), refused: r.refused, delta: scan.delta };
      sent.push(r);
    }
    return { sent: Buffer.concat(sent), refused: undefined, delta: scan.delta };
  };
  const splitAt = (b: Buffer, ...at: number[]) => [0, ...at, b.length].slice(1).map((end, i, ends) => b.subarray(i ? ends[i - 1] : 0, end));
  const bytes = (n: number) => Buffer.from(Array.from({ length: n }, (_, i) => (i * 131 + 7) % 256));

  beforeEach(() => (opened.length = 0));

  it('swaps toward an allowed host wherever the chunks split the placeholder', () => {
    const body = Buffer.concat([Buffer.from('{"key":"'), Buffer.from(P1), Buffer.from('","bin":"'), bytes(300), Buffer.from('"}')]);
    const want = Buffer.from(body.toString('latin1').replace(P1, 'value-of-k1'), 'latin1');
    for (let cut = 0; cut <= body.length; cut++) {
      const r = scanBody(splitAt(body, cut), 'api.anthropic.com');
      expect(r.refused).toBeUndefined();
      expect(r.sent.equals(want)).toBe(true);
      expect(r.delta).toBe('value-of-k1'.length - P1.length);
    }
    // Byte by byte, and two placeholders side by side.
    const two = Buffer.from(`a${P2}${P2}b`);
    expect(
      scanBody(
        [...two].map((x) => Buffer.from([x])),
        'api.github.com',
      ).sent.toString(),
    ).toBe('avalue-of-k2value-of-k2b');
  });

  it('refuses a placeholder toward another host before any of its bytes are forwarded, however it is split', () => {
    const body = Buffer.concat([bytes(100), Buffer.from(`x=${P1}&y=1`), bytes(100)]);
    for (let cut = 0; cut <= body.length; cut += 3) {
      for (const chunks of [splitAt(body, cut), splitAt(body, Math.floor(cut / 2), cut)]) {
        const r = scanBody(chunks, 'api.github.com');
        expect(r.refused).toBe('ANTHROPIC_API_KEY');
        // Not even its beginning went out: the forwarded part ends before the placeholder starts.
        expect(r.sent.length).toBeLessThanOrEqual(102);
      }
    }
    // Another sandbox's placeholder (not one of these): refused, unnamed. Nothing was opened.
    expect(scanBody([Buffer.from(`osb_sealed_${'c'.repeat(32)}`)], 'api.anthropic.com').refused).toBeNull();
    expect(opened).toEqual([]);
  });

  it('passes text that only starts like a placeholder, and bodies without one, unchanged', () => {
    for (const text of ['osb_sealed_', `osb_sealed_${'A'.repeat(32)}`, `${P1.slice(0, -1)}`, 'osb_sea', 'docs: osb_sealed_<32 hex>']) {
      const body = Buffer.concat([bytes(50), Buffer.from(text)]);
      for (let cut = 0; cut <= body.length; cut++) {
        const r = scanBody(splitAt(body, cut), 'api.anthropic.com');
        expect(r.refused).toBeUndefined();
        expect(r.sent.equals(body)).toBe(true);
      }
    }
    const big = bytes(1 << 20);
    const r = scanBody(splitAt(big, 65536, 131072, 500_000), 'api.anthropic.com');
    expect(r.sent.equals(big)).toBe(true);
    expect(r.delta).toBe(0);
  });
});

describe('sealed secrets: the server name of a ClientHello (pass-through of names sharing an address)', () => {
  /** The first bytes a TLS client sends (its ClientHello), caught by a plain TCP server. */
  const helloOf = (servername?: string) =>
    new Promise<Buffer>((resolve, reject) => {
      const server = net.createServer((sock) => {
        let got = Buffer.alloc(0);
        sock.on('data', (d: Buffer) => {
          got = Buffer.concat([got, d]);
          if (got.length >= 5 && got.length >= 5 + got.readUInt16BE(3)) {
            sock.destroy();
            server.close();
            resolve(got);
          }
        });
      });
      server.listen(0, '127.0.0.1', () => {
        const c = tls.connect({ host: '127.0.0.1', port: (server.address() as net.AddressInfo).port, ...(servername ? { servername } : {}) });
        c.on('error', () => undefined);
        setTimeout(() => reject(new Error('no ClientHello')), 5000).unref();
      });
    });

  it('reads the name, waits for a whole first record, and refuses junk without throwing', async () => {
    const hello = await helloOf('CDN.Example.test');
    expect(clientHelloName(hello)).toBe('cdn.example.test');
    for (let cut = 0; cut < hello.length; cut += 7) expect(clientHelloName(hello.subarray(0, cut))).toBeUndefined();
    expect(clientHelloName(await helloOf())).toBeNull(); // no SNI (an address)
    expect(clientHelloName(Buffer.from('GET / HTTP/1.1\r\n'))).toBeNull();
    // Every single-byte corruption of a real hello: a name, null or undefined, never an exception.
    for (let i = 0; i < hello.length; i++) {
      const bad = Buffer.from(hello);
      bad[i] = bad[i]! ^ 0xff;
      expect(() => clientHelloName(bad)).not.toThrow();
    }
  });
});
