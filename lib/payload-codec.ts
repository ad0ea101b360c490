import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';
import type { Payload, PayloadCodec, SerializationContext } from '@temporalio/common';
import type { SecretBox } from './secret-box';

/**
 * Temporal's payload codec with a data key per organisation (docs/threat-model.md, "Payloads per
 * organisation"). Installed on the API's client and on the workers (not in the workflow isolate: codecs
 * run outside it), so Temporal's history holds session inputs, results and activity arguments as
 * AES-256-GCM ciphertext, and the Temporal UI shows them only through the API's codec endpoint
 * (`POST /codec/decode`) to a caller holding that organisation's key.
 *
 * Which organisation: Temporal gives a codec no caller, only the workflow or activity a payload
 * belongs to (its serialization context). So:
 * 1. a JSON object with a string `orgId` field (every workflow's arguments, most activities') is that
 *    organisation's, and teaches the codec its workflow's organisation;
 * 2. any other payload of a workflow the codec has met (by its id: encrypted payloads name their
 *    organisation, so decoding a workflow's history teaches it too) is that organisation's;
 * 3. else `orgOfWorkflow` (MongoDB: the session, batch or instance of that id) when given;
 * 4. else the platform's key (`_platform`): operators only.
 * JSON scalars (a string, a number, null) stay as they are: the workflows' summaries (user metadata)
 * and ids, readable in the UI without a codec.
 *
 * An encrypted payload: metadata `encoding: binary/encrypted`, `encryption-key-id` (the key's id),
 * `encryption-org` (the organisation); data `iv(12) | tag(16) | ciphertext` of the original payload
 * (its metadata and data, as JSON), authenticated with `<keyId>/<org>` so that a payload relabelled
 * to another organisation or key does not open.
 *
 * Keys: the data key of (keyId, org) is HKDF-SHA256 of the master (SECRETS_KEY) with that pair, so no
 * key is stored and one organisation's data key says nothing of another's. `keyId` (PAYLOAD_KEY_ID) is
 * the key new payloads get; every id stays readable while the master is the same (rotation:
 * docs/threat-model.md).
 */
export const ENCRYPTED_ENCODING = 'binary/encrypted';
export const KEY_ID_META = 'encryption-key-id';
export const ORG_META = 'encryption-org';
/** The organisation of payloads no organisation owns (readable by operators only). */
export const PLATFORM_ORG = '_platform';

const IV = 12;
const TAG = 16;
const utf8 = (s: string) => new TextEncoder().encode(s);
const text = (b: Uint8Array | null | undefined) => (b ? Buffer.from(b).toString('utf8') : '');

/** How many workflows' organisations the codec remembers (oldest forgotten first). */
const REMEMBERED = 50_000;

export interface OrgPayloadCodecOptions {
  /** The master key (SECRETS_KEY, 32 bytes). */
  master: Buffer;
  /** The id of the data keys new payloads get (PAYLOAD_KEY_ID). */
  keyId: string;
  /** The organisation of a workflow the codec has not met (rule 3); null when unknown. */
  orgOfWorkflow?: (workflowId: string) => Promise<string | null>;
  /** false: encode passes payloads through (PAYLOAD_ENCRYPTION=off); decode still opens encrypted ones. Default true. */
  encrypt?: boolean;
}

export class OrgPayloadCodec implements PayloadCodec {
  readonly #master: Buffer;
  readonly #keys = new Map<string, Buffer>();
  readonly #orgs = new Map<string, string>();
  readonly keyId: string;
  readonly encrypts: boolean;
  readonly #orgOfWorkflow?: (workflowId: string) => Promise<string | null>;

  constructor(opts: OrgPayloadCodecOptions) {
    if (opts.master.length !== 32) throw new Error('the payload master key must be 32 bytes');
    if (!/^[\w.-]{1,32}$/.test(opts.keyId)) throw new Error('a payload key id is 1-32 letters, digits, _ . -');
    this.#master = Buffer.from(opts.master);
    this.keyId = opts.keyId;
    this.encrypts = opts.encrypt ?? true;
    this.#orgOfWorkflow = opts.orgOfWorkflow;
  }

  /** The data key of an organisation under a key id. */
  #key(keyId: string, org: string): Buffer {
    const name = `${keyId}/${org}`;
    let key = this.#keys.get(name);
    if (!key) {
      key = Buffer.from(hkdfSync('sha256', this.#master, 'sap-payload-codec', `payload:${name}`, 32));
      if (this.#keys.size > 10_000) this.#keys.clear();
      this.#keys.set(name, key);
    }
    return key;
  }

  #remember(workflowId: string | undefined, org: string): void {
    if (!workflowId || org === PLATFORM_ORG || this.#orgs.get(workflowId) === org) return;
    if (this.#orgs.size >= REMEMBERED) this.#orgs.delete(this.#orgs.keys().next().value as string);
    this.#orgs.set(workflowId, org);
  }

  async #orgOf(payload: Payload, context: SerializationContext | undefined): Promise<string | null | undefined> {
    const encoding = text(payload.metadata?.encoding);
    const workflowId = context?.workflowId;
    if (encoding === 'binary/null') return null;
    if (encoding === 'json/plain') {
      let value: unknown;
      try {
        value = JSON.parse(text(payload.data));
      } catch {
        value = undefined;
      }
      if (value === null || typeof value !== 'object') return null;
      const own = (value as { orgId?: unknown }).orgId;
      if (typeof own === 'string' && own) {
        this.#remember(workflowId, own);
        return own;
      }
    }
    if (!workflowId) return PLATFORM_ORG;
    const known = this.#orgs.get(workflowId);
    if (known) return known;
    const found = this.#orgOfWorkflow ? await this.#orgOfWorkflow(workflowId).catch(() => null) : null;
    if (found) this.#remember(workflowId, found);
    return found ?? PLATFORM_ORG;
  }

  /** Encrypts one payload for `org` under the current key id. */
  seal(payload: Payload, org: string): Payload {
    const iv = randomBytes(IV);
    const cipher = createCipheriv('aes-256-gcm', this.#key(this.keyId, org), iv);
    cipher.setAAD(utf8(`${this.keyId}/${org}`));
    const inner = JSON.stringify({
      m: Object.fromEntries(Object.entries(payload.metadata ?? {}).map(([k, v]) => [k, Buffer.from(v ?? new Uint8Array()).toString('base64')])),
      d: Buffer.from(payload.data ?? new Uint8Array()).toString('base64'),
    });
    const body = Buffer.concat([cipher.update(inner, 'utf8'), cipher.final()]);
    return {
      metadata: { encoding: utf8(ENCRYPTED_ENCODING), [KEY_ID_META]: utf8(this.keyId), [ORG_META]: utf8(org) },
      data: Buffer.concat([iv, cipher.getAuthTag(), body]),
    };
  }

  /** The organisation an encrypted payload names; null when it is not encrypted. */
  static orgOf(payload: Payload): string | null {
    return text(payload.metadata?.encoding) === ENCRYPTED_ENCODING ? text(payload.metadata?.[ORG_META]) : null;
  }

  /** The original payload; throws (naming no content) when it does not open. */
  open(payload: Payload): Payload {
    const keyId = text(payload.metadata?.[KEY_ID_META]);
    const org = text(payload.metadata?.[ORG_META]);
    const raw = Buffer.from(payload.data ?? new Uint8Array());
    if (!keyId || !org || raw.length < IV + TAG) throw new Error('encrypted payload: malformed');
    const decipher = createDecipheriv('aes-256-gcm', this.#key(keyId, org), raw.subarray(0, IV));
    decipher.setAAD(utf8(`${keyId}/${org}`));
    decipher.setAuthTag(raw.subarray(IV, IV + TAG));
    let inner: { m: Record<string, string>; d: string };
    try {
      inner = JSON.parse(Buffer.concat([decipher.update(raw.subarray(IV + TAG)), decipher.final()]).toString('utf8'));
    } catch {
      throw new Error(`encrypted payload of ${org} (key ${keyId}): does not open with this master key (was SECRETS_KEY changed?)`);
    }
    return {
      metadata: Object.fromEntries(Object.entries(inner.m).map(([k, v]) => [k, new Uint8Array(Buffer.from(v, 'base64'))])),
      data: new Uint8Array(Buffer.from(inner.d, 'base64')),
    };
  }

  async encode(payloads: Payload[], context?: SerializationContext): Promise<Payload[]> {
    if (!this.encrypts) return payloads;
    return Promise.all(
      payloads.map(async (p) => {
        if (text(p.metadata?.encoding) === ENCRYPTED_ENCODING) return p;
        const org = await this.#orgOf(p, context);
        return org ? this.seal(p, org) : p;
      }),
    );
  }

  async decode(payloads: Payload[], context?: SerializationContext): Promise<Payload[]> {
    return payloads.map((p) => {
      const org = OrgPayloadCodec.orgOf(p);
      if (org === null) return p;
      this.#remember(context?.workflowId, org);
      return this.open(p);
    });
  }
}

/**
 * The codec of a process (API or worker): its master is derived from SECRETS_KEY (`secrets`), so the
 * API and every worker holding that key agree. It encrypts only when PAYLOAD_ENCRYPTION is on, and
 * always opens what it finds encrypted (so turning encryption off keeps old histories readable).
 */
export function payloadCodecOf(
  cfg: { PAYLOAD_ENCRYPTION: 'on' | 'off'; PAYLOAD_KEY_ID: string },
  secrets: SecretBox,
  orgOfWorkflow?: (workflowId: string) => Promise<string | null>,
): OrgPayloadCodec {
  return new OrgPayloadCodec({
    master: secrets.derive('temporal-payloads'),
    keyId: cfg.PAYLOAD_KEY_ID,
    encrypt: cfg.PAYLOAD_ENCRYPTION === 'on',
    ...(orgOfWorkflow ? { orgOfWorkflow } : {}),
  });
}

/** The data converter option of Temporal's Client and Worker with the codec. */
export const dataConverterOf = (codec: PayloadCodec) => ({ dataConverter: { payloadCodecs: [codec] } });
