import type { Payload } from '@temporalio/common';
import { ApiError } from '../contract/errors';
import { OrgPayloadCodec, PLATFORM_ORG } from '../lib/payload-codec';
import type { KeyRole } from '../store';
import { grantOfKeyHash } from '../store/orgs';
import type { ServiceDeps } from './deps';

/** A payload as the Temporal UI sends it to a codec endpoint: metadata values and data in base64. */
export interface JsonPayload {
  metadata?: Record<string, string>;
  data?: string;
}

/** Who asks the codec endpoint: an API key's organisation and role. */
export interface CodecCaller {
  id: string;
  role: KeyRole;
}

const SIGN_PURPOSE = 'codec-link';
/** How long a codec link works (the UI keeps it in the browser's settings). */
export const CODEC_LINK_SECONDS = 12 * 3600;

/**
 * The Temporal UI's codec endpoint (docs/threat-model.md, "Payloads per organisation"). A payload is
 * opened only for a caller of the organisation it names; an operator's key opens the platform's
 * payloads (`_platform`, of no organisation) and its own organisation's, never a tenant's: the policy
 * is that operators see other customers' inputs as ciphertext. Anything else comes back as sent.
 */
export interface CodecService {
  decode(caller: CodecCaller, payloads: JsonPayload[]): JsonPayload[];
  /** A signed link to the endpoint for the caller's key (for the UI's codec setting), valid CODEC_LINK_SECONDS. */
  link(caller: CodecCaller, keyHash: string): { token: string; expiresAt: string };
  /** The caller of a link: 403 when forged or expired, 401 when its key has been revoked since. */
  callerOfLink(token: string): Promise<CodecCaller>;
}

const b64 = (v: string | undefined) => new Uint8Array(Buffer.from(v ?? '', 'base64'));
const toJson = (p: Payload): JsonPayload => ({
  metadata: Object.fromEntries(Object.entries(p.metadata ?? {}).map(([k, v]) => [k, Buffer.from(v ?? new Uint8Array()).toString('base64')])),
  data: Buffer.from(p.data ?? new Uint8Array()).toString('base64'),
});

/** Whether `caller` may read the payloads of `org`. */
export function mayOpen(caller: CodecCaller, org: string): boolean {
  return org === caller.id || (caller.role === 'operator' && org === PLATFORM_ORG);
}

export function createCodecService(deps: Pick<ServiceDeps, 'codec' | 'secrets' | 'store'>): CodecService {
  return {
    decode(caller, payloads) {
      return payloads.map((jp) => {
        const p: Payload = { metadata: Object.fromEntries(Object.entries(jp.metadata ?? {}).map(([k, v]) => [k, b64(v)])), data: b64(jp.data) };
        const org = OrgPayloadCodec.orgOf(p);
        if (org === null || !deps.codec || !mayOpen(caller, org)) return jp;
        try {
          return toJson(deps.codec.open(p));
        } catch {
          // Forged, or of another master key: it stays as it came.
          return jp;
        }
      });
    },
    link(caller, keyHash) {
      const e = Math.floor(Date.now() / 1000) + CODEC_LINK_SECONDS;
      const payload = Buffer.from(JSON.stringify({ o: caller.id, k: keyHash, e }), 'utf8').toString('base64url');
      return { token: `${payload}.${deps.secrets.sign(payload, SIGN_PURPOSE)}`, expiresAt: new Date(e * 1000).toISOString() };
    },
    async callerOfLink(token) {
      const [payload, sig] = token.split('.');
      if (!payload || !sig || !deps.secrets.verify(payload, SIGN_PURPOSE, sig)) throw new ApiError('forbidden', 'invalid codec link signature');
      const g = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as { o: string; k: string; e: number };
      if (g.e * 1000 < Date.now()) throw new ApiError('forbidden', 'this codec link has expired: make a new one with POST /api/codec/link');
      // The key it was made with must still be that organisation's: revoking the key ends its links.
      const grant = await grantOfKeyHash(deps.store, g.k);
      if (!grant || grant.orgId !== g.o) throw new ApiError('unauthorized', 'the key this codec link was made with has been revoked');
      return { id: grant.orgId, role: grant.role };
    },
  };
}
