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

/** A secret as the control plane hands it to the host at create: the host makes its placeholder. */
export interface SealedSecretSpec {
  /** The environment variable that holds the placeholder. */
  name: string;
  value: string;
  /** Normalised host names and wildcards the value may be sent to (never empty). */
  allowedHosts: string[];
}

/** Envs and sealed secrets of a store, minus the sealed ones a more specific env replaces. */
export function withoutOverridden(sealed: SealedSecretSpec[], ...envs: (Record<string, string> | undefined)[]): SealedSecretSpec[] {
  return sealed.filter((s) => !envs.some((e) => e && Object.prototype.hasOwnProperty.call(e, s.name)));
}
