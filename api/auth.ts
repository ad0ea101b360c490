import type { Request } from 'express';
import { ApiError } from '../lib/errors';
import { hashSecret } from '../lib/ids';
import type { KeyRole, Store } from '../store';
import { grantOfKeyHash } from '../store/orgs';

/** The organisation a request acts for. */
export interface OrgContext {
  id: string;
  /**
   * The key's role: a tenant sees its organisation's resources only; an operator also the fleet's
   * views (hosts, the Temporal UI's address, /metrics, every organisation's payloads through the codec
   * endpoint). docs/threat-model.md, "The operator role".
   */
  role: KeyRole;
}

/** Resolves the organisation of a request from its `X-API-Key` (or `api_key` query, for WebSockets). */
export interface Authenticator {
  authenticate(req: Request): Promise<OrgContext>;
  /** As authenticate, then 403 forbidden unless the key is an operator's. */
  authenticateOperator(req: Request): Promise<OrgContext>;
  /** Resolves a raw key; null when unknown. */
  resolve(key: string): Promise<OrgContext | null>;
  /**
   * Watches the key of a long-lived request (a WebSocket) authenticated as `org`: calls `onRevoked`
   * once when the key no longer resolves to `org`, checked every 5 s (at most) through the key cache
   * (so within the cache's lifetime plus one check of a revocation). Returns the function that stops watching.
   */
  watch(req: Request, org: OrgContext, onRevoked: () => void): () => void;
}

/** How long a key's lookup is kept by default (API_KEY_CACHE_MS). */
export const DEFAULT_KEY_CACHE_MS = 30_000;
/** How often an open socket's key is checked again at most (a lookup in the cache; MongoDB once per cache lifetime). */
const KEY_CHECK_MS = 5_000;

/**
 * Looks keys up by their sha256 (the `_id` of api_keys), caching hits and misses for `cacheMs`
 * (API_KEY_CACHE_MS, 30 s by default) so the hot path does not touch MongoDB on every request. A
 * revoked key stops working within `cacheMs`, and the WebSockets it opened are closed within
 * `cacheMs` plus one check (5 s, or `cacheMs` when shorter; see `watch`).
 */
export function createAuthenticator(store: Store, cacheMs = DEFAULT_KEY_CACHE_MS): Authenticator {
  const checkMs = Math.min(KEY_CHECK_MS, cacheMs);
  const cache = new Map<string, { org: OrgContext | null; until: number }>();
  async function resolve(key: string): Promise<OrgContext | null> {
    const id = hashSecret(key);
    const hit = cache.get(id);
    const now = Date.now();
    if (hit && hit.until > now) return hit.org;
    const found = await grantOfKeyHash(store, id);
    const org: OrgContext | null = found ? { id: found.orgId, role: found.role } : null;
    if (cache.size > 10_000) cache.clear();
    cache.set(id, { org, until: now + cacheMs });
    return org;
  }
  async function authenticate(req: Request): Promise<OrgContext> {
    const key = keyOf(req);
    if (!key) throw new ApiError('unauthorized', 'missing API key: send it in the X-API-Key header');
    const org = await resolve(key);
    if (!org) throw new ApiError('unauthorized', 'invalid API key');
    return noteOrg(req, org);
  }
  return {
    resolve,
    watch(req, org, onRevoked) {
      const key = keyOf(req);
      let checking = false;
      const timer = setInterval(() => {
        if (checking) return;
        checking = true;
        resolve(key ?? '')
          .then((now) => {
            if (now?.id === org.id && now.role === org.role) return;
            clearInterval(timer);
            onRevoked();
          })
          // MongoDB unreachable: the key is not known to be revoked; checked again next time.
          .catch(() => undefined)
          .finally(() => (checking = false));
      }, checkMs);
      timer.unref();
      return () => clearInterval(timer);
    },
    authenticate,
    async authenticateOperator(req) {
      const org = await authenticate(req);
      if (org.role !== 'operator') throw new ApiError('forbidden', OPERATOR_ONLY);
      return org;
    },
  };
}

/** The message of a tenant's key on an operator's route. */
export const OPERATOR_ONLY = "operator only: this key is a tenant's (operator keys are made with npm run keys -- create --role operator)";

/** Names the organisation in the request's log lines (see createApp). */
function noteOrg(req: Request, org: OrgContext): OrgContext {
  if (req.res) req.res.locals.orgId = org.id;
  if (req.log) req.log = req.log.child({ orgId: org.id });
  return org;
}

/** A request's API key: its X-API-Key header, the console socket's subprotocol, or its `api_key` query. */
function keyOf(req: Request): string | undefined {
  const header = req.headers['x-api-key'];
  return (Array.isArray(header) ? header[0] : header) ?? keyOfSubprotocol(req) ?? (typeof req.query.api_key === 'string' ? req.query.api_key : undefined);
}

/** The WebSocket subprotocol the web console offers beside its key (a browser cannot set X-API-Key on a WebSocket). */
export const CONSOLE_SUBPROTOCOL = 'sap-console';
const KEY_PROTOCOL = 'sap-key.';

/**
 * The key a browser sends in `Sec-WebSocket-Protocol` as `sap-key.<base64url of the key>` (offered with
 * `sap-console`, the one the server picks), so that it is in no URL.
 */
function keyOfSubprotocol(req: Request): string | undefined {
  const header = req.headers['sec-websocket-protocol'];
  if (typeof header !== 'string') return undefined;
  const entry = header
    .split(',')
    .map((p) => p.trim())
    .find((p) => p.startsWith(KEY_PROTOCOL));
  if (!entry) return undefined;
  const key = Buffer.from(entry.slice(KEY_PROTOCOL.length), 'base64url').toString('utf8');
  return key || undefined;
}

/**
 * Picks `sap-console` when offered (the console's socket); otherwise the first protocol offered, as ws
 * does by default. express-ws's ws 7 passes an array, ws 8 a Set.
 */
export function pickSubprotocol(protocols: Iterable<string>): string | false {
  const offered = [...protocols];
  if (offered.includes(CONSOLE_SUBPROTOCOL)) return CONSOLE_SUBPROTOCOL;
  return offered[0] ?? false;
}
