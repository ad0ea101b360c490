import dns from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';

/**
 * Where webhooks may go. A receiver must be a public unicast address: loopback, private, shared
 * (CGNAT, which holds the sandboxes' own network), link-local (cloud metadata), multicast,
 * reserved, documentation and unspecified ranges are refused unless the operator's allow list
 * (WEBHOOK_ALLOWED_CIDRS) opens them. The API checks a URL when it is given (a literal address, and
 * what its name resolves to now); the worker checks again at each delivery, after resolving the
 * name, and connects to the very address it checked (a name that answers differently later, DNS
 * rebinding, gains nothing).
 */

/** Ranges no webhook goes to by default (IANA special-purpose registries, plus multicast and reserved). */
const REFUSED_V4 = [
  '0.0.0.0/8', // "this network", unspecified
  '10.0.0.0/8',
  '100.64.0.0/10', // shared address space (CGNAT); the sandboxes' network
  '127.0.0.0/8',
  '169.254.0.0/16', // link-local: cloud metadata
  '172.16.0.0/12',
  '192.0.0.0/24',
  '192.0.2.0/24',
  '192.88.99.0/24',
  '192.168.0.0/16',
  '198.18.0.0/15',
  '198.51.100.0/24',
  '203.0.113.0/24',
  '224.0.0.0/4', // multicast
  '240.0.0.0/4', // reserved, and broadcast
];
const REFUSED_V6 = [
  '::/96', // unspecified, loopback, IPv4-compatible
  '64:ff9b::/96', // NAT64: reaches IPv4 addresses through a translator
  '64:ff9b:1::/48',
  '100::/64', // discard
  '2001::/23', // IETF protocol assignments (Teredo, ORCHID, …)
  '2001:db8::/32', // documentation
  '2002::/16', // 6to4: embeds an IPv4 address
  'fc00::/7', // unique local
  'fe80::/10', // link-local
  'fec0::/10', // site-local (deprecated)
  'ff00::/8', // multicast
];

/** The ranges refused by default, as a table (listed in the docs). */
export const REFUSED_RANGES: readonly string[] = [...REFUSED_V4, ...REFUSED_V6];

function addCidr(list: net.BlockList, cidr: string): void {
  const m = /^([^/]+)\/(\d{1,3})$/.exec(cidr.trim());
  const type = m ? net.isIP(m[1]!) : 0;
  const bits = m ? Number(m[2]) : -1;
  if (!m || !type || bits > (type === 4 ? 32 : 128)) throw new Error(`not a CIDR range: ${cidr}`);
  list.addSubnet(m[1]!, bits, type === 4 ? 'ipv4' : 'ipv6');
}

/** Which addresses are refused: the default ranges, less what the operator allows. */
export interface TargetPolicy {
  refused: net.BlockList;
  allowed: net.BlockList;
  /** The allow list as given, for messages. */
  allowedText: string;
}

/**
 * The policy for an allow list: CIDR ranges separated by commas or spaces (WEBHOOK_ALLOWED_CIDRS).
 * Throws on a range that does not parse.
 */
export function targetPolicy(allowedCidrs = ''): TargetPolicy {
  const known = policies.get(allowedCidrs);
  if (known) return known;
  const refused = new net.BlockList();
  for (const c of REFUSED_RANGES) addCidr(refused, c);
  const allowed = new net.BlockList();
  const list = allowedCidrs.split(/[\s,]+/).filter(Boolean);
  for (const c of list) addCidr(allowed, c);
  const policy = { refused, allowed, allowedText: list.join(',') };
  if (policies.size < 16) policies.set(allowedCidrs, policy);
  return policy;
}
const policies = new Map<string, TargetPolicy>();

/** True when `cidrs` is a valid allow list (for the config schema). */
export function validCidrList(cidrs: string): boolean {
  try {
    targetPolicy(cidrs);
    return true;
  } catch {
    return false;
  }
}

/** The IPv4 address an IPv6 address stands for when it is IPv4-mapped (::ffff:a.b.c.d), else null. */
function mappedV4(address: string): string | null {
  const probe = new net.BlockList();
  probe.addSubnet('::ffff:0:0', 96, 'ipv6');
  if (!probe.check(address, 'ipv6')) return null;
  // The last 32 bits, whether written dotted (::ffff:127.0.0.1) or as hex groups (::ffff:7f00:1).
  const dotted = /(\d+\.\d+\.\d+\.\d+)$/.exec(address);
  if (dotted) return dotted[1]!;
  const groups = address.split(':');
  const hi = parseInt(groups[groups.length - 2] || '0', 16);
  const lo = parseInt(groups[groups.length - 1] || '0', 16);
  return [hi >> 8, hi & 255, lo >> 8, lo & 255].join('.');
}

const REFUSED_TEXT =
  'is a loopback, private, link-local, multicast, reserved or unspecified address; webhooks go to public addresses only (the operator may open ranges: WEBHOOK_ALLOWED_CIDRS)';

/**
 * Why the address `address` (an IP literal, without brackets) may not receive webhooks, or null
 * when it may. An IPv4-mapped IPv6 address is judged as the IPv4 address it maps to; anything that
 * is not an IP address is refused.
 */
export function refusedAddress(policy: TargetPolicy, address: string): string | null {
  let a = address.replace(/^\[(.*)\]$/, '$1');
  let type = net.isIP(a);
  if (type === 6) {
    const v4 = mappedV4(a);
    if (v4) [a, type] = [v4, 4];
  }
  if (!type) return `${address} is not an IP address`;
  const family = type === 4 ? 'ipv4' : 'ipv6';
  if (policy.allowed.check(a, family)) return null;
  if (policy.refused.check(a, family)) {
    return `${a} ${REFUSED_TEXT}`;
  }
  return null;
}

/** The host name of an http(s) URL, without IPv6 brackets; the URL parser has already turned 0x7f000001, 2130706433, 127.1 into dotted form. */
export function urlHost(url: string): string {
  return new URL(url).hostname.replace(/^\[(.*)\]$/, '$1');
}

/** dns.lookup's shape, with every address: what a test may replace. */
export type LookupAll = (host: string) => Promise<Array<{ address: string; family: number }>>;

export const systemLookup: LookupAll = (host) => dns.promises.lookup(host, { all: true, verbatim: true });

/** A refusal of a webhook target (its message names the address, never more of the network). */
export class WebhookTargetRefused extends Error {
  override name = 'WebhookTargetRefused';
}

/**
 * Resolves `host` and checks every address it resolves to: all must be allowed. Returns them, in
 * the resolver's order. Throws WebhookTargetRefused when one is refused, and the resolver's error
 * when the name does not resolve.
 */
export async function resolveChecked(
  policy: TargetPolicy,
  host: string,
  lookup: LookupAll = systemLookup,
): Promise<Array<{ address: string; family: number }>> {
  if (net.isIP(host)) {
    const why = refusedAddress(policy, host);
    if (why) throw new WebhookTargetRefused(why);
    return [{ address: host, family: net.isIP(host) }];
  }
  const addrs = await lookup(host);
  if (!addrs.length) throw Object.assign(new Error(`${host} resolves to no address`), { code: 'ENOTFOUND' });
  // The message does not say which address: it would tell a caller what the operator's resolver answers.
  for (const a of addrs) if (refusedAddress(policy, a.address)) throw new WebhookTargetRefused(`${host} resolves to an address that ${REFUSED_TEXT}`);
  return addrs;
}

/**
 * Checks a webhook URL when it is given: its literal address, or what its name resolves to within
 * `timeoutMs`. A name that does not resolve now (or not in time) passes: each delivery checks again.
 * Returns why the URL is refused, or null.
 */
export async function refusedUrl(policy: TargetPolicy, url: string, timeoutMs: number, lookup: LookupAll = systemLookup): Promise<string | null> {
  const host = urlHost(url);
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<null>((resolve) => (timer = setTimeout(() => resolve(null), timeoutMs)));
  try {
    return await Promise.race([resolveChecked(policy, host, lookup).then(() => null), late]);
  } catch (err) {
    return err instanceof WebhookTargetRefused ? err.message : null;
  } finally {
    clearTimeout(timer);
  }
}

/** What a delivery sends and how far it goes. */
export interface PostOptions {
  headers: Record<string, string>;
  body: string;
  /** The whole exchange (resolving, connecting, sending, the answer's head and the part of its body read) ends within this. */
  timeoutMs: number;
  /** At most this much of the answer's body is read; the connection is then closed. */
  maxAnswerBytes: number;
  lookup?: LookupAll;
}

/**
 * POSTs `body` to `url` after checking, as resolveChecked does, every address its host resolves
 * to, and connects to the first of those checked addresses (never resolving the name again).
 * Redirects are not followed. Reads at most `maxAnswerBytes` of the answer. Resolves with the
 * answer's status; rejects with WebhookTargetRefused for a refused address, or with the network's
 * error (or a TimeoutError past `timeoutMs`).
 */
export function postChecked(policy: TargetPolicy, url: string, opts: PostOptions): Promise<{ status: number; answer: Buffer }> {
  const u = new URL(url);
  const host = urlHost(url);
  const mod = u.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    let settled = false;
    let req: http.ClientRequest | undefined;
    const done = (err: Error | null, value?: { status: number; answer: Buffer }): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      req?.destroy();
      if (err) reject(err);
      else resolve(value!);
    };
    const timer = setTimeout(() => done(Object.assign(new Error('the webhook exchange timed out'), { name: 'TimeoutError' })), opts.timeoutMs);
    resolveChecked(policy, host, opts.lookup).then(
      (addrs) => {
        if (settled) return;
        const first = addrs[0]!;
        // net.connect asks this for the name's address: the one checked above, whatever DNS says now.
        const pinned = (_h: string, o: { all?: boolean }, cb: (...a: unknown[]) => void): void => {
          if (o?.all) cb(null, [{ address: first.address, family: first.family }]);
          else cb(null, first.address, first.family);
        };
        req = mod.request(
          {
            method: 'POST',
            protocol: u.protocol,
            hostname: host,
            port: u.port || undefined,
            path: `${u.pathname}${u.search}`,
            headers: { ...opts.headers, 'content-length': String(Buffer.byteLength(opts.body)) },
            lookup: pinned as unknown as net.LookupFunction,
            agent: false,
            ...(mod === https && !net.isIP(host) ? { servername: host } : {}),
          },
          (res) => {
            const chunks: Buffer[] = [];
            let size = 0;
            const finish = (): void => done(null, { status: res.statusCode ?? 0, answer: Buffer.concat(chunks) });
            res.on('data', (c: Buffer) => {
              const room = opts.maxAnswerBytes - size;
              if (room > 0) chunks.push(c.subarray(0, room));
              size += c.length;
              if (size >= opts.maxAnswerBytes) finish();
            });
            res.on('end', finish);
            res.on('error', (e) => done(e));
          },
        );
        req.on('error', (e) => done(e));
        req.end(opts.body);
      },
      (e: Error) => done(e),
    );
  });
}
