/**
 * The sealed-secrets proxy's framing rules (docs/threat-model.md, "The sealed-secrets proxy's
 * framing"): which requests it forwards at all, and the headers it never forwards.
 */
import type * as http from 'node:http';

/** Headers that tell a front end where a request is for or came from: never forwarded (the proxy checked the request's own Host only). */
export const FORWARDED = new Set([
  'forwarded',
  'x-forwarded-for',
  'x-forwarded-host',
  'x-forwarded-proto',
  'x-forwarded-port',
  'x-forwarded-server',
  'x-forwarded-prefix',
  'x-original-host',
  'x-original-url',
  'x-rewrite-url',
  'x-host',
  'x-real-ip',
  'x-http-method-override',
  'x-http-method',
  'x-method-override',
]);

/**
 * What the proxy checks is what it forwards (docs/threat-model.md, "The sealed-secrets proxy's
 * framing"): an origin-form target, one Host naming the TLS server name (and the connection's port,
 * if any), a body framed by one content-length or by `transfer-encoding: chunked` alone. Anything
 * else could make an upstream front end see another host or another request than the one checked:
 * refused, with the same 403 as a placeholder toward the wrong host. Else the name it is for.
 */
export function framingFault(
  req: Pick<http.IncomingMessage, 'url' | 'method' | 'rawHeaders' | 'headers'>,
  secure: boolean,
  sni: string | null,
): { name: string } | { fault: string } {
  const url = req.url ?? '';
  if (!url.startsWith('/') || url.startsWith('//')) return { fault: 'the request target must be a path (origin-form), not a URL or an authority' };
  if (req.method === 'CONNECT') return { fault: 'CONNECT is not forwarded' };
  let hosts = 0;
  let lengths = 0;
  let encodings = 0;
  const raw = req.rawHeaders;
  for (let i = 0; i < raw.length; i += 2) {
    const lower = raw[i]!.toLowerCase();
    if (lower === 'host') hosts++;
    else if (lower === 'content-length') lengths++;
    else if (lower === 'transfer-encoding') encodings++;
  }
  if (hosts !== 1) return { fault: `a request needs exactly one Host header (it has ${hosts})` };
  const host = (req.headers.host ?? '').toLowerCase();
  const m = /^([a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?)\.?(?::(\d{1,5}))?$/.exec(host);
  if (!m) return { fault: `the Host header is not a host name: ${host.slice(0, 100)}` };
  if (m[2] !== undefined && Number(m[2]) !== (secure ? 443 : 80))
    return { fault: `the Host header names port ${m[2]}, not the connection's (${secure ? 443 : 80})` };
  const name = m[1]!;
  if (sni !== null && sni !== name) return { fault: `the Host header (${name.slice(0, 100)}) is not the TLS server name (${sni})` };
  if (lengths > 1) return { fault: 'a request has at most one content-length' };
  if (encodings > 1 || (encodings === 1 && (req.headers['transfer-encoding'] ?? '').trim().toLowerCase() !== 'chunked')) {
    return { fault: 'transfer-encoding may only be "chunked"' };
  }
  if (encodings === 1 && lengths === 1) return { fault: 'a request has a content-length or is chunked, not both' };
  return { name };
}
