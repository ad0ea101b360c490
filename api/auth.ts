import type { Request } from 'express';
import { ApiError } from '../contract/errors';
import { hashSecret } from '../lib/ids';
import type { KeyRole, KeyService } from '../services/orgs/api-keys';

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

/** Resolves the organisation of a request from its `X-API-Key` (on a WebSocket handshake also its subprotocol or `api_key` query). */
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
export function createAuthenticator(keys: KeyService, cacheMs = DEFAULT_KEY_CACHE_MS): Authenticator {
  const checkMs = Math.min(KEY_CHECK_MS, cacheMs);
  const cache = new Map<string, { org: OrgContext | null; until: number }>();
  async function resolve(key: string): Promise<OrgContext | null> {
    const id = hashSecret(key);
    const hit = cache.get(id);
    const now = Date.now();
    if (hit && hit.until > now) return hit.org;
    const found = await keys.grantOf(id);
    const org: OrgContext | null = found ? { id: found.orgId, role: found.role } : null;
    if (cache.size > 10_000) cache.clear();
    cache.set(id, { org, until: now + cacheMs });
    return org;
  }
  async function authenticate(req: Request): Promise<OrgContext> {
    const key = keyOf(req);
    if (!key) throw new ApiError('unauthorized', missingKeyMessage(req));
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

/**
 * A request's API key: its X-API-Key header; on a WebSocket handshake only (a browser cannot set
 * headers on a WebSocket), the console's `sap-key.<key>` subprotocol offered beside `sap-console`,
 * or the `api_key` query (OpenComputer's client). An HTTP request's query never carries a key: a key
 * in a URL ends up in logs, histories and Referer headers.
 */
function keyOf(req: Request): string | undefined {
  const header = req.headers['x-api-key'];
  const fromHeader = Array.isArray(header) ? header[0] : header;
  if (fromHeader !== undefined) return fromHeader;
  if (!isWebSocketHandshake(req)) return undefined;
  // The query parser has decoded the parameter's name: api%5Fkey and %61pi_key arrive as api_key.
  return keyOfSubprotocol(req) ?? (typeof req.query?.api_key === 'string' ? req.query.api_key : undefined);
}

/** Why a request has no key, and how to send one. */
function missingKeyMessage(req: Request): string {
  if (!isWebSocketHandshake(req)) return 'missing API key: send it in the X-API-Key header';
  if (offeredProtocols(req).some((p) => p.startsWith(KEY_PROTOCOL)))
    return `missing API key: a WebSocket that sends its key as ${KEY_PROTOCOL}<base64url key> must offer ${CONSOLE_SUBPROTOCOL} beside it`;
  return `missing API key: send it in the X-API-Key header, the api_key query or the ${KEY_PROTOCOL}<base64url key> subprotocol (beside ${CONSOLE_SUBPROTOCOL})`;
}

/** Whether `req` is a WebSocket handshake (a GET with `Upgrade: websocket`). */
function isWebSocketHandshake(req: Request): boolean {
  return req.method === 'GET' && typeof req.headers.upgrade === 'string' && req.headers.upgrade.toLowerCase() === 'websocket';
}

/**
 * The WebSocket subprotocol clients offer beside their key (a browser cannot set X-API-Key on a
 * WebSocket): the one the server selects, so the 101 answer names it and never the key.
 */
export const CONSOLE_SUBPROTOCOL = 'sap-console';
const KEY_PROTOCOL = 'sap-key.';

/** The protocols of a Sec-WebSocket-Protocol header, trimmed. */
function offeredProtocols(req: Request): string[] {
  const header = req.headers['sec-websocket-protocol'];
  if (typeof header !== 'string') return [];
  return header.split(',').map((p) => p.trim());
}

/**
 * The key a client sends in `Sec-WebSocket-Protocol` as `sap-key.<base64url of the key>`, so that it
 * is in no URL. Read only when `sap-console` is offered beside it: that is the protocol the server
 * selects, so the 101 answer carries it and not the key. A handshake that offers the key alone (an
 * older client) carries no key and is refused as unauthorized (see pickSubprotocol: no protocol is
 * echoed to it either).
 */
function keyOfSubprotocol(req: Request): string | undefined {
  const offered = offeredProtocols(req);
  if (!offered.includes(CONSOLE_SUBPROTOCOL)) return undefined;
  const entry = offered.find((p) => p.startsWith(KEY_PROTOCOL));
  if (!entry) return undefined;
  const key = Buffer.from(entry.slice(KEY_PROTOCOL.length), 'base64url').toString('utf8');
  return key || undefined;
}

/**
 * The subprotocol the 101 answer names: `sap-console` when offered (the console's socket and clients
 * that send their key as `sap-key.<key>`); otherwise the first protocol offered that is not a key, as
 * ws does by default; none when only keys are offered. A `sap-key.` entry is never selected, so a key
 * never comes back in an answer. express-ws's ws 7 passes an array, ws 8 a Set.
 */
export function pickSubprotocol(protocols: Iterable<string>): string | false {
  const offered = [...protocols];
  if (offered.includes(CONSOLE_SUBPROTOCOL)) return CONSOLE_SUBPROTOCOL;
  return offered.find((p) => !p.startsWith(KEY_PROTOCOL)) ?? false;
}
