/**
 * Sandboxes' way out: each sandbox's network namespace gets a veth pair (made by sap-sandbox-init
 * with netlink, see tools/sandbox-init/net.h), a /31 out of SANDBOX_NET_CIDR per id slot, and the
 * host forwards and masquerades for it through an nftables table of its own (`inet sap`). The table
 * also holds every policy: the host itself, link-local, other sandboxes and private ranges are always
 * refused (TCP reset, ICMP admin-prohibited: never a silent drop); a sandbox's own policy is an
 * element in a set, so the default (`internet`) costs nothing per sandbox and the others one `nft`.
 * IPv6 is refused entirely (the sandbox has no IPv6 address or route; the table rejects what is left).
 */
import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { isIP } from 'node:net';
import type { Logger } from 'pino';

/** What a sandbox may reach: everything public, nothing, or only the listed IPv4 CIDRs. */
export type Egress = 'internet' | 'none' | { allow: string[] };
export interface NetworkPolicy {
  egress: Egress;
}

/** A sandbox's link: host interface, host end (the gateway) and sandbox end, each a /31. */
export interface SandboxLink {
  ifname: string;
  gateway: string;
  address: string;
  prefix: number;
}

export const DEFAULT_NET_CIDR = '100.127.0.0/16';
const TABLE = 'sap';
/** Host interfaces of sandboxes: `sap<slot>`. */
const IF_PREFIX = 'sap';

/** Refused whatever the policy, unless the operator allows them (SANDBOX_EGRESS_ALLOW_CIDRS). */
const ALWAYS_REFUSED = [
  '0.0.0.0/8', '10.0.0.0/8', '100.64.0.0/10', '127.0.0.0/8', '169.254.0.0/16', '172.16.0.0/12',
  '192.0.0.0/24', '192.168.0.0/16', '224.0.0.0/3',
];

function ipToInt(ip: string): number {
  return ip.split('.').reduce((a, o) => a * 256 + Number(o), 0);
}
function intToIp(n: number): string {
  return [24, 16, 8, 0].map((s) => Math.floor(n / 2 ** s) % 256).join('.');
}

/** A normalised IPv4 CIDR ("a.b.c.d/n", host bits cleared), or throws with `what` in the message. */
export function parseCidr(text: string, what: string): { base: number; bits: number; text: string } {
  const m = /^(\d{1,3}(?:\.\d{1,3}){3})(?:\/(\d{1,2}))?$/.exec(text.trim());
  const bits = m ? Number(m[2] ?? 32) : -1;
  if (!m || isIP(m[1]!) !== 4 || bits < 0 || bits > 32) throw new Error(`${what}: not an IPv4 address or CIDR: ${text}`);
  const size = 2 ** (32 - bits);
  const base = Math.floor(ipToInt(m[1]!) / size) * size;
  return { base, bits, text: `${intToIp(base)}/${bits}` };
}

/** IPv4 name servers of the host's resolver configuration that a sandbox can reach (not loopback). */
export async function hostNameservers(): Promise<string[]> {
  for (const file of ['/etc/resolv.conf', '/run/systemd/resolve/resolv.conf']) {
    const text = await fsp.readFile(file, 'utf8').catch(() => '');
    const found = [...text.matchAll(/^\s*nameserver\s+(\S+)/gm)].map((m) => m[1]!).filter((a) => isIP(a) === 4 && !a.startsWith('127.'));
    if (found.length) return found.slice(0, 3);
  }
  return [];
}

function run(cmd: string, args: string[], input?: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = execFile(cmd, args, (err, _out, stderr) => (err ? reject(new Error(`${cmd} ${args.join(' ')}: ${stderr.trim() || err.message}`)) : resolve()));
    if (input !== undefined) child.stdin!.end(input);
  });
}

export interface NetworkOptions {
  /** The pool of sandbox links (SANDBOX_NET_CIDR). */
  cidr?: string;
  /** Destinations the operator allows although they are in a refused range (SANDBOX_EGRESS_ALLOW_CIDRS). */
  allowCidrs?: string[];
  /** Name servers written to sandboxes' /etc/resolv.conf (SANDBOX_DNS); default: the host's. */
  nameservers?: string[];
  log: Logger;
}

/** Validates an egress policy's allow list (IPv4 CIDRs) and returns it normalised. */
export function normaliseEgress(egress: Egress | undefined): Egress {
  if (egress === undefined || egress === 'internet' || egress === 'none') return egress ?? 'internet';
  return { allow: [...new Set(egress.allow.map((c) => parseCidr(c, 'network.egress.allow').text))] };
}

/** `network` of a create (API and sandbox host): the policy's shape; CIDRs are checked by normaliseEgress. */
export function networkSchema(zod: typeof import('zod').z) {
  const cidr = zod.string().refine(
    (v) => {
      try {
        parseCidr(v, '');
        return true;
      } catch {
        return false;
      }
    },
    { message: 'must be an IPv4 address or CIDR (a.b.c.d/n)' },
  );
  return zod.object({
    egress: zod.union([zod.enum(['internet', 'none']), zod.object({ allow: zod.array(cidr).max(256) }).strict()]).default('internet'),
  }).strict();
}

export class SandboxNetwork {
  private readonly pool: { base: number; bits: number; text: string };
  private readonly allowCidrs: string[];
  private nameservers: string[];
  /** Sandbox addresses with a policy other than `internet` in the table (so that destroy removes it). */
  private readonly restricted = new Map<string, Egress>();
  private readonly log: Logger;

  constructor(opts: NetworkOptions) {
    this.pool = parseCidr(opts.cidr ?? DEFAULT_NET_CIDR, 'SANDBOX_NET_CIDR');
    if (this.pool.bits > 30) throw new Error(`SANDBOX_NET_CIDR is too small: ${opts.cidr}`);
    this.allowCidrs = (opts.allowCidrs ?? []).map((c) => parseCidr(c, 'SANDBOX_EGRESS_ALLOW_CIDRS').text);
    this.nameservers = opts.nameservers ?? [];
    this.log = opts.log;
  }

  static fromEnv(env: NodeJS.ProcessEnv, log: Logger): SandboxNetwork | null {
    if (/^(off|0|false|no)$/i.test(env.SANDBOX_NETWORK ?? '')) return null;
    const list = (v: string | undefined) => (v ?? '').split(',').map((s) => s.trim()).filter(Boolean);
    return new SandboxNetwork({
      cidr: env.SANDBOX_NET_CIDR || undefined,
      allowCidrs: list(env.SANDBOX_EGRESS_ALLOW_CIDRS),
      ...(env.SANDBOX_DNS !== undefined ? { nameservers: list(env.SANDBOX_DNS) } : {}),
      log,
    });
  }

  /** Name servers for sandboxes' /etc/resolv.conf. */
  get dns(): string[] {
    return this.nameservers;
  }

  /** How many sandbox links the pool holds. */
  get capacity(): number {
    return 2 ** (32 - this.pool.bits) / 2;
  }

  /** The link of id slot `slot`: the slot's /31 in the pool. */
  linkFor(slot: number): SandboxLink {
    const gw = this.pool.base + slot * 2;
    if (!Number.isInteger(slot) || slot < 0 || slot * 2 + 2 > 2 ** (32 - this.pool.bits)) {
      throw new Error(`sandbox network pool ${this.pool.text} has no room for slot ${slot}`);
    }
    return { ifname: `${IF_PREFIX}${slot}`, gateway: intToIp(gw), address: intToIp(gw + 1), prefix: 31 };
  }

  /**
   * Turns forwarding on and (re)loads the table, atomically, with the policies of the sandboxes
   * that are alive (`live`: address → policy). Called once at the host's start, after adoption.
   */
  async load(live: Map<string, Egress>): Promise<void> {
    if (!this.nameservers.length && process.env.SANDBOX_DNS === undefined) this.nameservers = await hostNameservers();
    await fsp.writeFile('/proc/sys/net/ipv4/ip_forward', '1\n');
    this.restricted.clear();
    const elements = { none: [] as string[], listed: [] as string[], allow: [] as string[] };
    for (const [addr, egress] of live) {
      if (egress === 'internet') continue;
      this.restricted.set(addr, egress);
      if (egress === 'none') elements.none.push(addr);
      else {
        elements.listed.push(addr);
        for (const c of egress.allow) elements.allow.push(`${addr} . ${c}`);
      }
    }
    const els = (xs: string[]) => (xs.length ? ` elements = { ${xs.join(', ')} };` : '');
    const pool = this.pool.text;
    const sb = `"${IF_PREFIX}*"`;
    const text = `table inet ${TABLE}
delete table inet ${TABLE}
table inet ${TABLE} {
  set none4 { type ipv4_addr;${els(elements.none)} }
  set listed4 { type ipv4_addr;${els(elements.listed)} }
  set allow4 { type ipv4_addr . ipv4_addr; flags interval;${els(elements.allow)} }
  set dns4 { type ipv4_addr;${els(this.nameservers)} }
  set operator4 { type ipv4_addr; flags interval;${els(this.allowCidrs)} }
  set refused4 { type ipv4_addr; flags interval; auto-merge;${els([...ALWAYS_REFUSED, pool])} }
  chain refuse {
    counter
    meta l4proto tcp reject with tcp reset
    reject with icmpx type admin-prohibited
  }
  chain input {
    type filter hook input priority -10; policy accept;
    iifname ${sb} ct state established,related accept
    iifname ${sb} goto refuse
  }
  chain from_sandbox {
    fib saddr . iif oif missing drop
    meta nfproto ipv6 goto refuse
    ct state established,related accept
    ip saddr @none4 goto refuse
    meta l4proto { tcp, udp } th dport 53 ip daddr @dns4 accept
    ip saddr @listed4 ip saddr . ip daddr != @allow4 goto refuse
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
    this.log.info({ pool, restricted: this.restricted.size, dns: this.nameservers }, 'sandbox network ready');
  }

  /** Puts the policy of the sandbox at `addr` into the table (nothing to do for `internet`). */
  async apply(addr: string, egress: Egress): Promise<void> {
    const cmds = this.removal(addr);
    if (egress === 'none') cmds.push(`add element inet ${TABLE} none4 { ${addr} }`);
    else if (egress !== 'internet') {
      cmds.push(`add element inet ${TABLE} listed4 { ${addr} }`);
      if (egress.allow.length) cmds.push(`add element inet ${TABLE} allow4 { ${egress.allow.map((c) => `${addr} . ${c}`).join(', ')} }`);
    }
    if (!cmds.length) return;
    await run('nft', ['-f', '-'], cmds.join('\n') + '\n');
    if (egress === 'internet') this.restricted.delete(addr);
    else this.restricted.set(addr, egress);
  }

  /** Removes the policy of a sandbox that is gone. */
  async release(addr: string): Promise<void> {
    const cmds = this.removal(addr);
    if (!cmds.length) return;
    await run('nft', ['-f', '-'], cmds.join('\n') + '\n');
    this.restricted.delete(addr);
  }

  private removal(addr: string): string[] {
    const old = this.restricted.get(addr);
    if (!old || old === 'internet') return [];
    if (old === 'none') return [`delete element inet ${TABLE} none4 { ${addr} }`];
    const cmds = [`delete element inet ${TABLE} listed4 { ${addr} }`];
    if (old.allow.length) cmds.push(`delete element inet ${TABLE} allow4 { ${old.allow.map((c) => `${addr} . ${c}`).join(', ')} }`);
    return cmds;
  }
}
