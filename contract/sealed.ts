/**
 * Sealed secrets (docs/sealed-secrets.md): a store secret with `allowedHosts` reaches a sandbox as a
 * placeholder; the sandbox host's egress proxy puts the value into requests to those hosts only.
 * Pure: the shapes and the matching rules shared by the control plane, the host and the tests.
 */

/** The prefix of every placeholder (OpenComputer's shape). */
export const PLACEHOLDER_PREFIX = 'osb_sealed_';
/** A placeholder: the prefix and 32 random base-62-ish characters (hex here: 128 bits). */
export const PLACEHOLDER_PATTERN = /osb_sealed_[0-9a-f]{32}/g;
/** Any text that starts like a placeholder (a mangled or foreign one is refused, never forwarded). */
export const PLACEHOLDER_LIKE = /osb_sealed_[A-Za-z0-9]*/g;

/** Bounds: entries per secret (or store list), and each entry's length. */
export const MAX_ALLOWED_HOSTS = 32;
export const MAX_HOST_LENGTH = 253;
/** Sealed secrets one sandbox may hold (a store has few; each costs the proxy a map entry). */
export const MAX_SEALED_PER_SANDBOX = 256;

const LABEL = '[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?';
const HOST = new RegExp(`^(\\*\\.)?(${LABEL}\\.)*${LABEL}$`);

/**
 * One `allowedHosts` entry, normalised (lower case, no trailing dot): a host name or `*.wildcard`.
 * Addresses are refused: TLS names the host, and the proxy knows a destination only by its name.
 */
export function normaliseAllowedHost(text: string): string {
  const name = text.trim().toLowerCase().replace(/\.$/, '');
  if (name.length === 0 || name.length > MAX_HOST_LENGTH || !HOST.test(name)) throw new Error(`not a host name or *.wildcard: ${text.slice(0, 100)}`);
  if (/^[\d.]+$/.test(name.replace(/^\*\./, ''))) throw new Error(`an address is not a host name (TLS names hosts): ${text.slice(0, 100)}`);
  if (!name.replace(/^\*\./, '').includes('.')) throw new Error(`a single label matches too much, name the domain: ${text.slice(0, 100)}`);
  return name;
}

/** `*.example.com` matches names under example.com (not example.com itself); other entries match exactly. */
export function hostAllowed(patterns: readonly string[], host: string): boolean {
  const n = host.toLowerCase().replace(/\.$/, '');
  return patterns.some((p) => (p.startsWith('*.') ? n.length > p.length - 1 && n.endsWith(p.slice(1)) : n === p));
}

/**
 * Where a sealed secret's value may be put (`injectInto`): request header names (lower case) and
 * `body`. A secret without its own list gets this one: the usual places of API keys, never a body
 * (an answer that echoes a body, or a conversation that quotes the environment, would carry it).
 */
export const DEFAULT_INJECT_INTO: readonly string[] = ['authorization', 'x-api-key', 'api-key', 'x-goog-api-key', 'x-auth-token'];
/** The body as an `injectInto` entry. */
export const INJECT_BODY = 'body';
export const MAX_INJECT_INTO = 16;
/** Headers a value may never be put into: the proxy drops or writes them itself (framing, routing, hop-by-hop). */
const NEVER_INJECT = new Set([
  'host',
  'content-length',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authorization',
  'te',
  'trailer',
  'upgrade',
  'forwarded',
  'x-forwarded-for',
  'x-forwarded-host',
  'x-forwarded-proto',
  'x-forwarded-port',
  'x-real-ip',
]);

/** One `injectInto` entry, normalised: a header name (an HTTP token, lower-cased) or `body`. */
export function normaliseInjectInto(text: string): string {
  const t = text.trim().toLowerCase();
  if (t === INJECT_BODY) return t;
  if (!/^[!#$%&'*+.^_`|~0-9a-z-]{1,100}$/.test(t)) throw new Error(`not a header name or "body": ${text.slice(0, 100)}`);
  if (NEVER_INJECT.has(t)) throw new Error(`a value is never put into ${t}: the proxy writes or drops that header`);
  return t;
}

/** A secret as the control plane hands it to the host at create: the host makes its placeholder. */
export interface SealedSecretSpec {
  /** The environment variable that holds the placeholder. */
  name: string;
  value: string;
  /** Normalised host names and wildcards the value may be sent to (never empty). */
  allowedHosts: string[];
  /** Where in a request the value may be put (normalised `injectInto`); absent: DEFAULT_INJECT_INTO. */
  injectInto?: string[];
}

/** Envs and sealed secrets of a store, minus the sealed ones a more specific env replaces. */
export function withoutOverridden(sealed: SealedSecretSpec[], ...envs: (Record<string, string> | undefined)[]): SealedSecretSpec[] {
  return sealed.filter((s) => !envs.some((e) => e && Object.prototype.hasOwnProperty.call(e, s.name)));
}
