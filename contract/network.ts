/**
 * The network policy of a sandbox as the public API and the sandbox host accept it: its shape
 * (`networkSchema`) and the normalisation of allow-list entries. Pure: the runtime that enforces a
 * policy is sandbox/network.ts.
 */
import type { z as Zod } from 'zod';

/**
 * What a sandbox may reach: everything public, nothing, or only its allow list: IPv4 addresses and
 * CIDRs, host names (`api.example.com`) and wildcards (`*.example.com`: names under example.com).
 */
export type Egress = 'internet' | 'none' | { allow: string[] };

/** One IPv4 octet in decimal, without leading zeros (what node:net's isIP accepts). */
const OCTET = '(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9][0-9]|[0-9])';
const IPV4 = new RegExp(`^(?:${OCTET}\\.){3}${OCTET}$`);
/** True for a dotted-decimal IPv4 address. */
export const isIPv4 = (text: string): boolean => IPV4.test(text);

/** The 32-bit number of a dotted IPv4 address. */
function ipToInt(ip: string): number {
  return ip.split('.').reduce((a, o) => a * 256 + Number(o), 0);
}
/** The dotted IPv4 address of a 32-bit number. */
export function intToIp(n: number): string {
  return [24, 16, 8, 0].map((s) => Math.floor(n / 2 ** s) % 256).join('.');
}

/** A normalised IPv4 CIDR ("a.b.c.d/n", host bits cleared), or throws with `what` in the message. */
export function parseCidr(text: string, what: string): { base: number; bits: number; text: string } {
  const m = /^(\d{1,3}(?:\.\d{1,3}){3})(?:\/(\d{1,2}))?$/.exec(text.trim());
  const bits = m ? Number(m[2] ?? 32) : -1;
  if (!m || !isIPv4(m[1]!) || bits < 0 || bits > 32) throw new Error(`${what}: not an IPv4 address or CIDR: ${text}`);
  const size = 2 ** (32 - bits);
  const base = Math.floor(ipToInt(m[1]!) / size) * size;
  return { base, bits, text: `${intToIp(base)}/${bits}` };
}

const NAME = /^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
const looksLikeAddress = (v: string) => /^[\d./]+$/.test(v.trim());

/** One allow-list entry, normalised: a CIDR (`a.b.c.d/n`) or a lower-case host name or wildcard. */
export function normaliseAllowEntry(text: string, what: string): string {
  if (looksLikeAddress(text)) return parseCidr(text, what).text;
  const name = text.trim().toLowerCase().replace(/\.$/, '');
  if (name.length > 253 || !NAME.test(name)) throw new Error(`${what}: not an IPv4 address, CIDR, host name or *.wildcard: ${text}`);
  return name;
}

/** The CIDRs and the names of an allow list. */
export function splitAllow(allow: string[]): { cidrs: string[]; names: string[] } {
  return { cidrs: allow.filter(looksLikeAddress), names: allow.filter((v) => !looksLikeAddress(v)) };
}

/** `network` of a create (API and sandbox host): the policy's shape; entries are checked by normaliseEgress. */
export function networkSchema(zod: typeof Zod) {
  const entry = zod
    .string()
    .max(253)
    .refine(
      (v) => {
        try {
          normaliseAllowEntry(v, '');
          return true;
        } catch {
          return false;
        }
      },
      { message: 'must be an IPv4 address, a CIDR (a.b.c.d/n), a host name or a *.wildcard' },
    );
  return zod
    .object({
      egress: zod.union([zod.enum(['internet', 'none']), zod.object({ allow: zod.array(entry).max(256) }).strict()]).default('internet'),
    })
    .strict();
}

/** The network part of a sandbox's spec. */
export interface NetworkPolicy {
  egress: Egress;
}

/** Validates an egress policy's allow list and returns it normalised. */
export function normaliseEgress(egress: Egress | undefined): Egress {
  if (egress === undefined || egress === 'internet' || egress === 'none') return egress ?? 'internet';
  return { allow: [...new Set(egress.allow.map((c) => normaliseAllowEntry(c, 'network.egress.allow')))] };
}
