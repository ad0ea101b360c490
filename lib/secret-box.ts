import { createCipheriv, createDecipheriv, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

/** Format tag of a sealed value: bump it if the layout below changes. */
const VERSION = 'v1';
const IV_BYTES = 12;
const TAG_BYTES = 16;

/**
 * Encrypts and decrypts secret values with AES-256-GCM. A sealed value is
 * `v1:<base64 of iv | tag | ciphertext>`. The caller passes a context (for example
 * `<orgId>/<storeId>/<NAME>`) that is authenticated but not stored: a ciphertext copied into
 * another store, organisation or name fails to open instead of yielding the value there.
 */
export class SecretBox {
  readonly #key: Buffer;

  constructor(key: Buffer) {
    if (key.length !== 32) throw new Error('a secrets key must be 32 bytes');
    this.#key = Buffer.from(key);
  }

  seal(plain: string, context: string): string {
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv('aes-256-gcm', this.#key, iv);
    cipher.setAAD(Buffer.from(context, 'utf8'));
    const body = Buffer.concat([cipher.update(plain, 'utf8'), cipher.final()]);
    return `${VERSION}:${Buffer.concat([iv, cipher.getAuthTag(), body]).toString('base64')}`;
  }

  /** A 32-byte key of its own for `purpose`, derived from this key (HMAC-SHA256): e.g. the payload codec's master. */
  derive(purpose: string): Buffer {
    return createHmac('sha256', this.#key).update(`derive:${purpose}`).digest();
  }

  /** HMAC-SHA256 of `data` under a key of its own for `purpose` (derived from this key), base64url. */
  sign(data: string, purpose: string): string {
    const key = createHmac('sha256', this.#key).update(`sign:${purpose}`).digest();
    return createHmac('sha256', key).update(data, 'utf8').digest('base64url');
  }

  /** Whether `signature` is sign(data, purpose) (constant-time). */
  verify(data: string, purpose: string, signature: string): boolean {
    const want = Buffer.from(this.sign(data, purpose), 'utf8');
    const got = Buffer.from(signature, 'utf8');
    return got.length === want.length && timingSafeEqual(got, want);
  }

  /** The plain value; throws (without the value or the ciphertext in the message) if it does not open. */
  open(sealed: string, context: string): string {
    const [version, b64] = sealed.split(':', 2);
    if (version !== VERSION || !b64) throw new Error('sealed secret: unknown format');
    const raw = Buffer.from(b64, 'base64');
    if (raw.length < IV_BYTES + TAG_BYTES) throw new Error('sealed secret: too short');
    const decipher = createDecipheriv('aes-256-gcm', this.#key, raw.subarray(0, IV_BYTES));
    decipher.setAAD(Buffer.from(context, 'utf8'));
    decipher.setAuthTag(raw.subarray(IV_BYTES, IV_BYTES + TAG_BYTES));
    try {
      return Buffer.concat([decipher.update(raw.subarray(IV_BYTES + TAG_BYTES)), decipher.final()]).toString('utf8');
    } catch {
      throw new Error('sealed secret: does not open with this key (was SECRETS_KEY changed?)');
    }
  }
}

/** Parses SECRETS_KEY: 64 hex digits, or base64 of 32 bytes. Null when it is neither. */
export function parseSecretsKey(text: string): Buffer | null {
  const t = text.trim();
  if (/^[0-9a-fA-F]{64}$/.test(t)) return Buffer.from(t, 'hex');
  if (/^[A-Za-z0-9+/_-]{43}=?$/.test(t)) {
    const b = Buffer.from(t.replace(/-/g, '+').replace(/_/g, '/'), 'base64');
    if (b.length === 32) return b;
  }
  return null;
}
