import { createHash, randomBytes } from 'node:crypto';

const ALPHABET = '0123456789abcdefghijklmnopqrstuvwxyz';

/** A random id body: 16 lowercase alphanumerics (~82 bits). */
export function randomId(length = 16): string {
  const bytes = randomBytes(length);
  let out = '';
  for (let i = 0; i < length; i++) out += ALPHABET[bytes[i]! % 36];
  return out;
}

/** A deterministic id body from the given parts (sha256, base36-ish), for idempotency keys. */
export function derivedId(...parts: string[]): string {
  const digest = createHash('sha256').update(parts.join('\u0000')).digest();
  let out = '';
  for (let i = 0; i < 16; i++) out += ALPHABET[digest[i]! % 36];
  return out;
}

export const newId = {
  session: () => `sess_${randomId()}`,
  instance: () => `inst_${randomId()}`,
  agent: () => `agt_${randomId()}`,
  sandbox: () => `sb-${randomId()}`,
  org: () => `org_${randomId()}`,
};

/** sha256 hex of a secret, the only form in which API keys are stored. */
export function hashSecret(secret: string): string {
  return createHash('sha256').update(secret).digest('hex');
}
