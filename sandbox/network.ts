/**
 * Sandboxes' way out: each sandbox's network namespace gets a veth pair (made by sap-sandbox-init
 * with netlink, see tools/sandbox-init/net.h), a /31 out of SANDBOX_NET_CIDR per id slot, and the
 * host forwards and masquerades for it through an nftables table of its own (`inet sap`). The table
 * also holds every policy: the host itself, link-local, other sandboxes and private ranges are always
 * refused (TCP reset, ICMP admin-prohibited: never a silent drop); a sandbox's own policy is an
 * element in a set, so the default (`internet`) costs nothing per sandbox and the others one `nft`.
 * IPv6 is refused entirely (the sandbox has no IPv6 address or route; the table rejects what is left).
 * Names: each sandbox's resolver is RESOLVER_ADDRESS, redirected to the host's own resolver (dns.ts),
 * which follows the policy and admits the addresses of allowed names into the table for their TTL.
 * A packet from a link whose source is not that link's sandbox address (fib reverse-path lookup, or
 * one of the host's own addresses) is dropped at prerouting, before NAT, routing or any host service:
 * a sandbox holds CAP_NET_RAW in its namespace and cannot speak for another. `none` sandboxes are not
 * redirected to the resolver and are refused its port; each sandbox's UDP queries to the resolver
 * are rate-limited in the table (SANDBOX_DNS_RATE), so a flood never fills the resolver's socket.
 */
import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { isIP } from 'node:net';
import { networkInterfaces } from 'node:os';
import type { Logger } from 'pino';
import { intToIp, normaliseAllowEntry, normaliseEgress, parseCidr, splitAllow, type Egress, type NetworkPolicy } from '../contract/network';
import type { SealProxy } from './seal/proxy';
import { DEFAULT_RESOLVER_LIMITS, parseUpstream, resolverLimitsFromEnv, SandboxResolver, type Decision, type ResolverLimits, type Upstream } from './dns';

/** A sandbox's link: host interface, host end (the gateway) and sandbox end, each a /31. */
export interface SandboxLink {
  ifname: string;
  gateway: string;
  address: string;
  prefix: number;
}

export { normaliseAllowEntry, normaliseEgress, parseCidr, splitAllow, type Egress, type NetworkPolicy };

export const DEFAULT_NET_CIDR = '100.127.0.0/16';
/** Default name of the nftables table and prefix of the links (SANDBOX_NET_NAME). */
export const DEFAULT_NET_NAME = 'sap';
/** Host interfaces of sandboxes: `sap<slot>`. */

/** Refused whatever the policy, unless the operator allows them (SANDBOX_EGRESS_ALLOW_CIDRS). */
const ALWAYS_REFUSED = [
  '0.0.0.0/8',
  '10.0.0.0/8',
  '100.64.0.0/10',
  '127.0.0.0/8',
  '169.254.0.0/16',
  '172.16.0.0/12',
  '192.0.0.0/24',
  '192.168.0.0/16',
  '224.0.0.0/3',
];

const ipToIntLocal = (ip: string): number => ip.split('.').reduce((a, o) => a * 256 + Number(o), 0);

/** Every IPv4 address on any of the host's interfaces, read again at most once a second. */
let ownAddresses: { at: number; set: Set<string> } = { at: 0, set: new Set() };
export function hostAddresses(): Set<string> {
  const now = Date.now();
  if (now - ownAddresses.at >= 1000) {
    const set = new Set<string>();
    for (const list of Object.values(networkInterfaces())) for (const a of list ?? []) if (a.family === 'IPv4') set.add(a.address);
    ownAddresses = { at: now, set };
  }
  return ownAddresses.set;
}

/** IPv4 name servers of the host's resolver configuration (the sandboxes' resolver forwards to them). */
export async function hostNameservers(): Promise<string[]> {
  for (const file of ['/etc/resolv.conf', '/run/systemd/resolve/resolv.conf']) {
    const text = await fsp.readFile(file, 'utf8').catch(() => '');
    const found = [...text.matchAll(/^\s*nameserver\s+(\S+)/gm)].map((m) => m[1]!).filter((a) => isIP(a) === 4);
    if (found.length) return found.slice(0, 3);
  }
  return [];
}

function run(cmd: string, args: string[], input?: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = execFile(cmd, args, (err, _out, stderr) =>
      err ? reject(new Error(`${cmd} ${args.join(' ')}: ${stderr.trim() || err.message}`)) : resolve(),
    );
    if (input !== undefined) child.stdin!.end(input);
  });
}

export interface NetworkOptions {
  /** The pool of sandbox links (SANDBOX_NET_CIDR). */
  cidr?: string;
  /** Destinations the operator allows although they are in a refused range (SANDBOX_EGRESS_ALLOW_CIDRS). */
  allowCidrs?: string[];
  /** The upstream name servers of the sandboxes' resolver (SANDBOX_DNS, `a.b.c.d[:port]`); default: the host's. */
  nameservers?: string[];
  /** The port the sandboxes' resolver listens on (SANDBOX_DNS_PORT); sandboxes reach it as port 53 of their gateway. */
  dnsPort?: number;
  /**
   * Name of this host's nftables table and prefix of its links (SANDBOX_NET_NAME, default `sap`):
   * several hosts on one machine each need their own, none a prefix of another's links
   * (`sap` links are sap<slot>; any other name's are <name>-<slot>).
   */
  name?: string;
  /** The resolver's limits per sandbox and on the host's sockets (SANDBOX_DNS_*, see dns.ts). */
  dnsLimits?: Partial<ResolverLimits>;
  log: Logger;
}

/**
 * The name server every sandbox's /etc/resolv.conf names. It exists only on the sandbox's side of
 * its link: the table redirects port 53 of it to the host's resolver before routing. One address
 * for all (not each link's gateway), so resolv.conf is the same file in every sandbox and a
 * checkpoint's content does not depend on the slot it was taken in.
 */
export const RESOLVER_ADDRESS = '169.254.53.53';
/** Default port of the sandboxes' resolver on the host (SANDBOX_DNS_PORT). */
export const DEFAULT_DNS_PORT = 10053;
/** An address an allowed name resolved to stays open for its TTL, but at least this long. */
const MIN_ADMIT_SECONDS = 300;
const MAX_ADMIT_SECONDS = 86_400;

export class SandboxNetwork {
  private readonly pool: { base: number; bits: number; text: string };
  private readonly allowCidrs: string[];
  private upstreams: Upstream[];
  private readonly configuredUpstreams: boolean;
  private readonly dnsPort: number;
  private readonly dnsLimits: ResolverLimits;
  /** Every live sandbox's address and policy (the resolver's view; `internet` ones are not in the table). */
  private readonly policies = new Map<string, Egress>();
  /** Addresses admitted for a sandbox through its resolver, with when each expires (ms). */
  private readonly admitted = new Map<string, Map<string, number>>();
  private resolver: SandboxResolver | null = null;
  private readonly log: Logger;
  /** The nftables table (`inet <table>`) and the links' name pattern. */
  private readonly table: string;
  private readonly ifPrefix: string;
  /** Sealed secrets' egress proxy (seal/proxy.ts) and its port, when the host runs one; what it was steered per sandbox. */
  private seal: { proxy: SealProxy; port: number } | null = null;
  private readonly steered = new Map<string, Map<string, number>>();
  private service: Promise<string> | null = null;

  constructor(opts: NetworkOptions) {
    const name = opts.name ?? DEFAULT_NET_NAME;
    if (!/^[a-z][a-z0-9]{0,7}$/.test(name)) throw new Error(`SANDBOX_NET_NAME must be 1-8 lower-case letters and digits, starting with a letter: ${name}`);
    this.table = name;
    this.ifPrefix = name === DEFAULT_NET_NAME ? name : `${name}-`;
    this.pool = parseCidr(opts.cidr ?? DEFAULT_NET_CIDR, 'SANDBOX_NET_CIDR');
    if (this.pool.bits > 30) throw new Error(`SANDBOX_NET_CIDR is too small: ${opts.cidr}`);
    this.allowCidrs = (opts.allowCidrs ?? []).map((c) => parseCidr(c, 'SANDBOX_EGRESS_ALLOW_CIDRS').text);
    this.configuredUpstreams = opts.nameservers !== undefined;
    this.upstreams = (opts.nameservers ?? []).map((a) => {
      try {
        return parseUpstream(a);
      } catch (err) {
        throw new Error(`SANDBOX_DNS: ${(err as Error).message}`);
      }
    });
    this.dnsPort = opts.dnsPort ?? DEFAULT_DNS_PORT;
    this.dnsLimits = { ...DEFAULT_RESOLVER_LIMITS, ...opts.dnsLimits };
    this.log = opts.log;
  }

  static fromEnv(env: NodeJS.ProcessEnv, log: Logger): SandboxNetwork | null {
    if (/^(off|0|false|no)$/i.test(env.SANDBOX_NETWORK ?? '')) return null;
    const list = (v: string | undefined) =>
      (v ?? '')
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean);
    return new SandboxNetwork({
      cidr: env.SANDBOX_NET_CIDR || undefined,
      allowCidrs: list(env.SANDBOX_EGRESS_ALLOW_CIDRS),
      ...(env.SANDBOX_DNS !== undefined ? { nameservers: list(env.SANDBOX_DNS) } : {}),
      ...(env.SANDBOX_DNS_PORT ? { dnsPort: Number(env.SANDBOX_DNS_PORT) } : {}),
      ...(env.SANDBOX_NET_NAME ? { name: env.SANDBOX_NET_NAME } : {}),
      dnsLimits: resolverLimitsFromEnv(env),
      log,
    });
  }

  /** Puts the sealed-secrets proxy in the path (before load). */
  attachSeal(proxy: SealProxy, port: number): void {
    this.seal = { proxy, port };
  }

  /** True for an address no sandbox may reach whatever its policy (what the table refuses), unless the operator allows it. */
  refusedAddress(ip: string): boolean {
    const n = ipToIntLocal(ip);
    const inside = (c: string) => {
      const { base, bits } = parseCidr(c, 'address');
      return n >= base && n < base + 2 ** (32 - bits);
    };
    if (this.allowCidrs.some(inside)) return false;
    return [...ALWAYS_REFUSED, this.pool.text].some(inside);
  }

  /**
   * Whether the sealed-secrets proxy may connect to `ip` for the sandbox at `source` (seal/proxy.ts):
   * what the table would let that sandbox reach itself (its policy, the refused ranges), and never an
   * address of the host's own (the proxy connects from the host, where the sandbox's input chain does
   * not apply).
   */
  proxyReachable(source: string, ip: string): boolean {
    if (isIP(ip) !== 4 || this.refusedAddress(ip) || hostAddresses().has(ip)) return false;
    const egress = this.policies.get(source);
    if (egress === undefined || egress === 'none') return false;
    if (egress === 'internet') return true;
    const n = ipToIntLocal(ip);
    const { cidrs } = splitAllow(egress.allow);
    if (
      cidrs.some((c) => {
        const { base, bits } = parseCidr(c, 'address');
        return n >= base && n < base + 2 ** (32 - bits);
      })
    ) {
      return true;
    }
    return (this.admitted.get(source)?.get(ip) ?? 0) > Date.now();
  }

  /** Sends the sandbox's TCP 80/443 to `addresses` to the sealed-secrets proxy for `seconds` (one nft call). */
  async steer(addr: string, addresses: string[], seconds: number): Promise<void> {
    const now = Date.now();
    const mine = this.steered.get(addr) ?? new Map<string, number>();
    const fresh = addresses.filter((a) => (mine.get(a) ?? 0) < now + (seconds * 1000) / 2);
    if (!fresh.length) return;
    await run('nft', ['-f', '-'], `add element inet ${this.table} seal4 { ${fresh.map((a) => `${addr} . ${a} timeout ${seconds}s`).join(', ')} }\n`);
    for (const a of fresh) mine.set(a, now + seconds * 1000);
    this.steered.set(addr, mine);
  }

  /** Stops steering a sandbox that is gone (its slot's next sandbox starts on the routed path). */
  private async unsteer(addr: string): Promise<void> {
    this.seal?.proxy.release(addr);
    const mine = this.steered.get(addr);
    this.steered.delete(addr);
    const live = [...(mine ?? [])].filter(([, exp]) => exp > Date.now() + 1000).map(([a]) => `${addr} . ${a}`);
    if (!live.length) return;
    await run('nft', ['-f', '-'], `delete element inet ${this.table} seal4 { ${live.join(', ')} }\n`).catch(async () => {
      for (const el of live) await run('nft', ['delete', 'element', 'inet', this.table, 'seal4', `{ ${el} }`]).catch(() => undefined);
    });
  }

  /** The sandbox's policy as the host holds it (undefined: not a live sandbox of this host). */
  policyOf(addr: string): Egress | undefined {
    return this.policies.get(addr);
  }

  /** How many sandbox links the pool holds (its last /31 is the host's service address's). */
  get capacity(): number {
    return 2 ** (32 - this.pool.bits) / 2 - 1;
  }

  /**
   * The address the sandboxes' resolver and the sealed-secrets proxy listen on, as a second wall
   * behind the table: the pool's last address, put on the host's loopback (`ip addr replace …/32 dev
   * lo`), which the table's DNAT sends sandboxes' queries and steered connections to. It is not
   * reachable through the host's public addresses, so the two services stay closed to the world even
   * when the table is gone (flushed by hand or by another firewall tool). Where the address cannot be
   * added (no `ip`, no CAP_NET_ADMIN), they listen on 0.0.0.0 as before, behind the table alone (logged).
   */
  serviceAddress(): Promise<string> {
    this.service ??= (async () => {
      const svc = intToIp(this.pool.base + 2 ** (32 - this.pool.bits) - 1);
      try {
        await run('ip', ['addr', 'replace', `${svc}/32`, 'dev', 'lo']);
        return svc;
      } catch (err) {
        this.log.warn(
          { address: svc, err: (err as Error).message },
          "the sandboxes' service address could not be added: resolver and proxy listen on 0.0.0.0, behind the table alone",
        );
        return '0.0.0.0';
      }
    })();
    return this.service;
  }

  /** The link of id slot `slot`: the slot's /31 in the pool (never the last: the service address's). */
  linkFor(slot: number): SandboxLink {
    const gw = this.pool.base + slot * 2;
    if (!Number.isInteger(slot) || slot < 0 || slot * 2 + 2 > 2 ** (32 - this.pool.bits) - 2) {
      throw new Error(`sandbox network pool ${this.pool.text} has no room for slot ${slot}`);
    }
    return { ifname: `${this.ifPrefix}${slot}`, gateway: intToIp(gw), address: intToIp(gw + 1), prefix: 31 };
  }

  /**
   * Turns forwarding on and (re)loads the table, atomically, with the policies of the sandboxes
   * that are alive (`live`: address → policy). Called once at the host's start, after adoption.
   */
  async load(live: Map<string, Egress>): Promise<void> {
    if (!this.configuredUpstreams) this.upstreams = (await hostNameservers()).map(parseUpstream);
    await fsp.writeFile('/proc/sys/net/ipv4/ip_forward', '1\n');
    this.policies.clear();
    this.admitted.clear();
    this.steered.clear();
    const elements = { none: [] as string[], listed: [] as string[], allow: [] as string[] };
    for (const [addr, egress] of live) {
      this.policies.set(addr, egress);
      if (egress === 'internet') continue;
      if (egress === 'none') elements.none.push(addr);
      else {
        elements.listed.push(addr);
        for (const c of splitAllow(egress.allow).cidrs) elements.allow.push(`${addr} . ${c}`);
      }
    }
    const svc = await this.serviceAddress();
    // Sandboxes' queries and steered connections go to the service address when there is one, else (as before) to the link's own gateway.
    const to = (port: number) => (svc === '0.0.0.0' ? `redirect to :${port}` : `dnat ip to ${svc}:${port}`);
    if (!this.resolver) {
      const resolver = new SandboxResolver({
        port: this.dnsPort,
        address: svc,
        upstreams: () => this.upstreams,
        decide: (source) => this.decide(source),
        admit: (source, addresses, ttl) => this.admit(source, addresses, ttl),
        limits: this.dnsLimits,
        log: this.log,
        ...(this.seal ? { sealed: { wants: (src: string) => this.seal!.proxy.watches(src), admit: this.seal.proxy.admit.bind(this.seal.proxy) } } : {}),
      });
      await resolver.start();
      this.resolver = resolver;
    }
    const els = (xs: string[]) => (xs.length ? ` elements = { ${xs.join(', ')} };` : '');
    const pool = this.pool.text;
    const sb = `"${this.ifPrefix}*"`;
    const text = `table inet ${this.table}
delete table inet ${this.table}
table inet ${this.table} {
  set none4 { type ipv4_addr;${els(elements.none)} }
  set listed4 { type ipv4_addr;${els(elements.listed)} }
  set allow4 { type ipv4_addr . ipv4_addr; flags interval;${els(elements.allow)} }
  set resolved4 { type ipv4_addr . ipv4_addr; flags timeout; }
  set operator4 { type ipv4_addr; flags interval;${els(this.allowCidrs)} }
  set refused4 { type ipv4_addr; flags interval; auto-merge;${els([...ALWAYS_REFUSED, pool])} }
  # Sources of UDP queries to the resolver, each with its rate (SANDBOX_DNS_RATE); forgotten after a minute unseen.
  # Sealed secrets: (sandbox . address) pairs its resolver answered for a sealed secret's host; TCP 80/443 to them goes to the proxy.
  set seal4 { type ipv4_addr . ipv4_addr; flags timeout; }
  set dnsrate4 { type ipv4_addr; flags dynamic, timeout; timeout 60s; size 65536; }
  chain refuse {
    counter
    meta l4proto tcp reject with tcp reset
    reject with icmpx type admin-prohibited
  }
  chain antispoof {
    type filter hook prerouting priority -300; policy accept;
    iifname ${sb} meta nfproto ipv4 fib saddr . iif oif missing drop
    iifname ${sb} meta nfproto ipv4 fib saddr type local drop
  }
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    iifname ${sb} ip saddr != @none4 ip daddr ${RESOLVER_ADDRESS} meta l4proto { tcp, udp } th dport 53 ${to(this.dnsPort)}${
      this.seal ? `\n    iifname ${sb} ip saddr . ip daddr @seal4 tcp dport { 80, 443 } ${to(this.seal.port)}` : ''
    }
  }
  chain input {
    type filter hook input priority -10; policy accept;
    iifname ${sb} udp dport ${this.dnsPort} update @dnsrate4 { ip saddr limit rate over ${this.dnsLimits.ratePerSecond}/second burst ${this.dnsLimits.ratePerSecond} packets } drop
    iifname ${sb} ip saddr @none4 meta l4proto { tcp, udp } th dport ${this.dnsPort} goto refuse
    iifname ${sb} ct state established,related accept
    iifname ${sb} ip saddr != @none4 meta l4proto { tcp, udp } th dport ${this.dnsPort} ct status dnat accept${
      this.seal ? `\n    iifname ${sb} tcp dport ${this.seal.port} ct status dnat accept` : ''
    }
    iifname ${sb} goto refuse${this.seal ? `\n    tcp dport ${this.seal.port} iifname != "lo" goto refuse` : ''}
    meta l4proto { tcp, udp } th dport ${this.dnsPort} iifname != "lo" goto refuse
  }
  chain from_sandbox {
    fib saddr . iif oif missing drop
    meta nfproto ipv6 goto refuse
    ct state established,related accept
    ip saddr @none4 goto refuse
    ip saddr @listed4 ip saddr . ip daddr != @allow4 ip saddr . ip daddr != @resolved4 goto refuse
    ip daddr @operator4 accept
    ip daddr @refused4 goto refuse
    accept
  }
  chain forward {
    type filter hook forward priority -10; policy accept;
    iifname ${sb} jump from_sandbox
    oifname ${sb} ct state established,related accept
    oifname ${sb} goto refuse
  }
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr ${pool} oifname != ${sb} masquerade
  }
}
`;
    await run('nft', ['-f', '-'], text).catch((err: Error) => {
      throw new Error(`the sandboxes' network table could not be loaded (nftables is needed, run as root; SANDBOX_NETWORK=off does without): ${err.message}`);
    });
    this.log.info(
      { pool, restricted: elements.none.length + elements.listed.length, dnsPort: this.dnsPort, upstreams: this.upstreams.map((u) => `${u.host}:${u.port}`) },
      'sandbox network ready',
    );
  }

  /** Stops the resolver (the table stays: sandboxes outlive the host). */
  async close(): Promise<void> {
    await this.resolver?.close();
    this.resolver = null;
  }

  private decide(source: string): Decision {
    const egress = this.policies.get(source);
    if (egress === undefined) return null;
    if (egress === 'internet') return 'all';
    if (egress === 'none') return 'none';
    return { names: splitAllow(egress.allow).names };
  }

  /** Opens `addresses` to the sandbox at `addr` for max(TTL, 5 min) (one nft call, skipped when all are open for long enough). */
  private async admit(addr: string, addresses: string[], ttlSeconds: number): Promise<void> {
    const seconds = Math.min(MAX_ADMIT_SECONDS, Math.max(MIN_ADMIT_SECONDS, Math.ceil(ttlSeconds)));
    const now = Date.now();
    const mine = this.admitted.get(addr) ?? new Map<string, number>();
    // Still open for at least half the new period: nothing to write.
    const fresh = addresses.filter((a) => (mine.get(a) ?? 0) < now + (seconds * 1000) / 2);
    if (!fresh.length) return;
    await run('nft', ['-f', '-'], `add element inet ${this.table} resolved4 { ${fresh.map((a) => `${addr} . ${a} timeout ${seconds}s`).join(', ')} }\n`);
    // The policy may have changed while nft ran: keep the record true to the table either way.
    for (const a of fresh) mine.set(a, now + seconds * 1000);
    this.admitted.set(addr, mine);
    if (this.policies.get(addr) !== undefined && typeof this.policies.get(addr) !== 'object') await this.forget(addr);
  }

  /** Closes what the resolver opened for `addr` (a policy change, or the sandbox is gone). */
  private async forget(addr: string): Promise<void> {
    const mine = this.admitted.get(addr);
    this.admitted.delete(addr);
    if (!mine?.size) return;
    const now = Date.now();
    const live = [...mine].filter(([, exp]) => exp > now + 1000).map(([a]) => `${addr} . ${a}`);
    if (!live.length) return;
    // An element that expired meanwhile fails the whole batch: then one at a time, ignoring those.
    await run('nft', ['-f', '-'], `delete element inet ${this.table} resolved4 { ${live.join(', ')} }\n`).catch(async () => {
      for (const el of live) await run('nft', ['delete', 'element', 'inet', this.table, 'resolved4', `{ ${el} }`]).catch(() => undefined);
    });
  }

  /**
   * Puts the policy of the sandbox at `addr` into the table, replacing the one it had, in one nft
   * transaction (nothing to write for `internet` over `internet`). Used at create and for a live
   * change: addresses its resolver admitted under the old policy are closed.
   */
  async apply(addr: string, egress: Egress): Promise<void> {
    const cmds = this.removal(addr);
    if (egress === 'none') cmds.push(`add element inet ${this.table} none4 { ${addr} }`);
    else if (egress !== 'internet') {
      cmds.push(`add element inet ${this.table} listed4 { ${addr} }`);
      const { cidrs } = splitAllow(egress.allow);
      if (cidrs.length) cmds.push(`add element inet ${this.table} allow4 { ${cidrs.map((c) => `${addr} . ${c}`).join(', ')} }`);
    }
    if (cmds.length) await run('nft', ['-f', '-'], cmds.join('\n') + '\n');
    this.policies.set(addr, egress);
    await this.forget(addr);
  }

  /** Removes the policy of a sandbox that is gone. */
  async release(addr: string): Promise<void> {
    const cmds = this.removal(addr);
    if (cmds.length) await run('nft', ['-f', '-'], cmds.join('\n') + '\n');
    this.policies.delete(addr);
    await this.forget(addr);
    await this.unsteer(addr);
  }

  private removal(addr: string): string[] {
    const old = this.policies.get(addr);
    if (!old || old === 'internet') return [];
    if (old === 'none') return [`delete element inet ${this.table} none4 { ${addr} }`];
    const cmds = [`delete element inet ${this.table} listed4 { ${addr} }`];
    const { cidrs } = splitAllow(old.allow);
    if (cidrs.length) cmds.push(`delete element inet ${this.table} allow4 { ${cidrs.map((c) => `${addr} . ${c}`).join(', ')} }`);
    return cmds;
  }
}
