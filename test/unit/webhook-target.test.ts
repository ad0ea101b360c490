/**
 * Where webhooks may go (services/webhooks/webhook-target.ts), as an attacker who names the receiver would try:
 * every spelling of loopback, private, link-local (cloud metadata), multicast and unspecified
 * addresses, names that resolve to them, and a resolver that answers differently the second time.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { loadConfig } from '../../config';
import { postChecked, refusedAddress, refusedUrl, targetPolicy, urlHost, WebhookTargetRefused, type LookupAll } from '../../services/webhooks/webhook-target';

const DEFAULT = targetPolicy(loadConfig({}).WEBHOOK_ALLOWED_CIDRS);

const REFUSED_URLS = [
  'http://127.0.0.1/',
  'http://127.0.0.2:8080/x',
  'http://0x7f000002/',
  'http://2130706434/',
  'http://0177.0.0.1/',
  'http://127.1/',
  'http://0/',
  'http://0.0.0.0/',
  'http://[::]/',
  'http://[::1]/',
  'http://[0:0:0:0:0:0:0:1]/',
  'http://[::ffff:127.0.0.2]/',
  'http://[::ffff:7f00:2]/',
  'http://[::ffff:169.254.169.254]/',
  'http://[::127.0.0.1]/',
  'http://[64:ff9b::a9fe:a9fe]/',
  'http://169.254.169.254/latest/meta-data/',
  'http://[fe80::1]/',
  'http://[fd00:ec2::254]/',
  'http://10.0.0.1/',
  'http://172.16.0.1/',
  'http://172.31.255.255/',
  'http://192.168.1.1/',
  'http://100.64.0.1/',
  'http://100.112.0.1/',
  'http://224.0.0.1/',
  'http://[ff02::1]/',
  'http://255.255.255.255/',
  'http://240.0.0.1/',
  'http://198.18.0.1/',
  'http://[2002:7f00:1::]/',
];

describe('webhook target policy', () => {
  it('refuses, with the default settings, every spelling of a loopback, private, link-local, multicast, reserved or unspecified address', () => {
    const passed = REFUSED_URLS.filter((u) => refusedAddress(DEFAULT, urlHost(u)) === null);
    expect(passed).toEqual([]);
  });

  it('lets public addresses through', () => {
    for (const a of ['8.8.8.8', '1.1.1.1', '93.184.216.34', '2606:4700:4700::1111', '::ffff:8.8.8.8', '172.32.0.1', '100.128.0.1'])
      expect([a, refusedAddress(DEFAULT, a)]).toEqual([a, null]);
  });

  it('opens only the ranges of the allow list (WEBHOOK_ALLOWED_CIDRS), whatever the spelling', () => {
    const p = targetPolicy('127.0.0.2/32, 10.1.2.0/24 fd00:1::/64');
    for (const u of ['http://127.0.0.2/', 'http://0x7f000002/', 'http://[::ffff:127.0.0.2]/', 'http://10.1.2.200/', 'http://[fd00:1::5]/'])
      expect([u, refusedAddress(p, urlHost(u))]).toEqual([u, null]);
    for (const u of ['http://127.0.0.1/', 'http://127.0.0.3/', 'http://[::1]/', 'http://10.1.3.1/', 'http://169.254.169.254/', 'http://[fd00:2::5]/'])
      expect(refusedAddress(p, urlHost(u))).not.toBeNull();
  });

  it('has the documented defaults: nothing allowed, 10 s per exchange, 4 KiB of answer, a 10 GiB storage quota', () => {
    const c = loadConfig({});
    expect([c.WEBHOOK_ALLOWED_CIDRS, c.WEBHOOK_TIMEOUT_MS, c.WEBHOOK_ANSWER_MAX_BYTES, c.WEBHOOK_RESOLVE_TIMEOUT_MS, c.ORG_STORAGE_QUOTA_MB]).toEqual([
      '',
      10_000,
      4096,
      2_000,
      10_240,
    ]);
    expect(() => loadConfig({ ORG_STORAGE_QUOTA_MB: '-1' })).toThrow(/ORG_STORAGE_QUOTA_MB/);
  });

  it('refuses a bad allow list at start, naming the variable', () => {
    for (const bad of ['10.0.0.0/33', 'localhost/8', '10.0.0.0', 'fd00::/129'])
      expect(() => loadConfig({ WEBHOOK_ALLOWED_CIDRS: bad })).toThrow(/WEBHOOK_ALLOWED_CIDRS/);
    expect(loadConfig({ WEBHOOK_ALLOWED_CIDRS: '10.0.0.0/8,fd00::/8' }).WEBHOOK_ALLOWED_CIDRS).toBe('10.0.0.0/8,fd00::/8');
  });

  it('refuses at create a name that resolves to a refused address, even beside a public one; a name that does not resolve (or not in time) is left to the delivery', async () => {
    const lookup =
      (answers: Record<string, string[]>): LookupAll =>
      async (host) => {
        const a = answers[host];
        if (!a) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
        return a.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
      };
    const dns = lookup({
      'meta.example': ['169.254.169.254'],
      'mixed.example': ['93.184.216.34', '10.0.0.7'],
      'six.example': ['::1'],
      'ok.example': ['93.184.216.34'],
    });
    expect(await refusedUrl(DEFAULT, 'http://meta.example/', 1000, dns)).toMatch(
      /meta\.example resolves to an address that is a loopback, private, link-local/,
    );
    expect(await refusedUrl(DEFAULT, 'http://mixed.example/', 1000, dns)).toMatch(/^mixed\.example resolves to an address that/);
    expect(await refusedUrl(DEFAULT, 'https://six.example/', 1000, dns)).toMatch(/^six\.example resolves/);
    // What the name resolves to is not told.
    expect(await refusedUrl(DEFAULT, 'http://meta.example/', 1000, dns)).not.toContain('169.254');
    expect(await refusedUrl(DEFAULT, 'http://ok.example/', 1000, dns)).toBeNull();
    expect(await refusedUrl(DEFAULT, 'http://nowhere.example/', 1000, dns)).toBeNull();
    expect(await refusedUrl(DEFAULT, 'http://slow.example/', 50, () => new Promise(() => undefined))).toBeNull();
  });
});

describe('webhook delivery (postChecked)', () => {
  /** A receiver on 127.0.0.3 that records each request and answers with `answer`. */
  async function receiver(
    answer: (req: http.IncomingMessage, res: http.ServerResponse) => void,
  ): Promise<{ url: (host: string) => string; hits: () => number; close: () => Promise<void> }> {
    let hits = 0;
    const server = http.createServer((req, res) => {
      hits++;
      req.resume();
      req.on('end', () => answer(req, res));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.3', r));
    const port = (server.address() as AddressInfo).port;
    return {
      url: (host) => `http://${host}:${port}/hook?x=1`,
      hits: () => hits,
      close: () => {
        server.closeAllConnections();
        return new Promise((r) => server.close(() => r()));
      },
    };
  }
  const opts = { headers: { 'content-type': 'application/json' }, body: '{"event":"x"}', timeoutMs: 5_000, maxAnswerBytes: 4096 };

  it('connects to the address it checked, resolving the name once: a resolver that answers a private address the second time gains nothing', async () => {
    const r = await receiver((_req, res) => res.writeHead(204).end());
    try {
      const calls: string[] = [];
      // First answer: an address the policy allows (the receiver); any later one: cloud metadata.
      const rebinding: LookupAll = async (host) => {
        calls.push(host);
        return [{ address: calls.length === 1 ? '127.0.0.3' : '169.254.169.254', family: 4 }];
      };
      const allow = targetPolicy('127.0.0.3/32');
      // hook.invalid cannot be resolved by the system: reaching the receiver proves the checked address was used.
      await expect(postChecked(allow, r.url('hook.invalid'), { ...opts, lookup: rebinding })).resolves.toMatchObject({ status: 204 });
      expect([calls, r.hits()]).toEqual([['hook.invalid'], 1]);
      // The next attempt resolves anew, is answered the metadata address, and is refused before connecting.
      await expect(postChecked(allow, r.url('hook.invalid'), { ...opts, lookup: rebinding })).rejects.toBeInstanceOf(WebhookTargetRefused);
      expect(r.hits()).toBe(1);
    } finally {
      await r.close();
    }
  });

  it('refuses, without connecting, a loopback receiver under the default policy, by address or by name', async () => {
    const r = await receiver((_req, res) => res.writeHead(200).end());
    try {
      await expect(postChecked(DEFAULT, r.url('127.0.0.3'), opts)).rejects.toBeInstanceOf(WebhookTargetRefused);
      const toLoopback: LookupAll = async () => [
        { address: '93.184.216.34', family: 4 },
        { address: '127.0.0.3', family: 4 },
      ];
      await expect(postChecked(DEFAULT, r.url('hook.invalid'), { ...opts, lookup: toLoopback })).rejects.toBeInstanceOf(WebhookTargetRefused);
      expect(r.hits()).toBe(0);
    } finally {
      await r.close();
    }
  });

  it('reads at most maxAnswerBytes of an endless answer, then closes the connection', async () => {
    let written = 0;
    let closed!: () => void;
    const wasClosed = new Promise<void>((r) => (closed = r));
    const r = await receiver((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      const chunk = Buffer.alloc(64 * 1024, 'x');
      const pump = (): void => {
        while (!res.destroyed) {
          written += chunk.length;
          if (!res.write(chunk)) break;
        }
      };
      res.on('drain', pump);
      res.on('close', () => closed());
      pump();
    });
    try {
      const got = await postChecked(targetPolicy('127.0.0.3/32'), r.url('127.0.0.3'), opts);
      expect([got.status, got.answer.length]).toEqual([200, 4096]);
      await wasClosed;
      expect(written).toBeGreaterThan(4096);
    } finally {
      await r.close();
    }
  });

  it('ends an exchange that trickles past timeoutMs, and does not follow redirects', async () => {
    let timer: NodeJS.Timeout | undefined;
    const slow = await receiver((_req, res) => {
      res.writeHead(200);
      timer = setInterval(() => res.write('.'), 20);
      res.on('close', () => clearInterval(timer));
    });
    const target = await receiver((_req, res) => res.writeHead(200).end());
    const redirect = await receiver((_req, res) => res.writeHead(307, { location: target.url('127.0.0.3') }).end());
    try {
      const allow = targetPolicy('127.0.0.3/32');
      await expect(postChecked(allow, slow.url('127.0.0.3'), { ...opts, timeoutMs: 300 })).rejects.toMatchObject({ name: 'TimeoutError' });
      await expect(postChecked(allow, redirect.url('127.0.0.3'), opts)).resolves.toMatchObject({ status: 307 });
      expect(target.hits()).toBe(0);
    } finally {
      clearInterval(timer);
      await Promise.all([slow.close(), target.close(), redirect.close()]);
    }
  });
});
