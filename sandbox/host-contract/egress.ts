/**
 * A sandbox's egress policy as the host contract carries it, and its pure checks (no nftables, no
 * resolver): the API checks a policy with these before a host applies it (see ../network.ts).
 */
import { isIP } from 'node:net';

/**
 * What a sandbox may reach: everything public, nothing, or only its allow list: IPv4 addresses and
 * CIDRs, host names (`api.example.com`) and wildcards (`*.example.com`: names under example.com).
 */
export type Egress = 'internet' | 'none' | { allow: string[] };
export interface NetworkPolicy {
  egress: Egress;
}

export function ipToInt(ip: string): number {
  return ip.split('.').reduce((a, o) => a * 256 + Number(o), 0);
}
export function intToIp(n: number): string {
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

const NAME = /^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
export const looksLikeAddress = (v: string) => /^[\d./]+$/.test(v.trim());

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

/** Validates an egress policy's allow list and returns it normalised. */
export function normaliseEgress(egress: Egress | undefined): Egress {
  if (egress === undefined || egress === 'internet' || egress === 'none') return egress ?? 'internet';
  return { allow: [...new Set(egress.allow.map((c) => normaliseAllowEntry(c, 'network.egress.allow')))] };
}
