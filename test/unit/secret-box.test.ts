import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { ConfigError, loadConfig, resolveSecretBox } from '../../config';
import { parseSecretsKey, SecretBox } from '../../lib/secret-box';

describe('secret box (AES-256-GCM)', () => {
  const box = new SecretBox(randomBytes(32));
  const value = `sk-${randomBytes(12).toString('hex')}`;

  it('opens what it sealed, in the same context only', () => {
    const sealed = box.seal(value, 'org/ss-1/KEY');
    expect(sealed).toMatch(/^v1:/);
    expect(sealed).not.toContain(value);
    expect(box.seal(value, 'org/ss-1/KEY')).not.toBe(sealed); // a fresh IV each time
    expect(box.open(sealed, 'org/ss-1/KEY')).toBe(value);
    expect(() => box.open(sealed, 'other/ss-1/KEY')).toThrow(/does not open/);
    expect(() => new SecretBox(randomBytes(32)).open(sealed, 'org/ss-1/KEY')).toThrow(/does not open/);
  });

  it('refuses a tampered ciphertext without naming the value', () => {
    const sealed = box.seal(value, 'c');
    const raw = Buffer.from(sealed.slice(3), 'base64');
    raw[raw.length - 1]! ^= 1;
    let message = '';
    try {
      box.open(`v1:${raw.toString('base64')}`, 'c');
    } catch (err) {
      message = (err as Error).message;
    }
    expect(message).toMatch(/does not open/);
    expect(message).not.toContain(value);
    expect(() => box.open('v2:abc', 'c')).toThrow(/unknown format/);
  });

  it('parses keys as 64 hex digits or base64 of 32 bytes', () => {
    const key = randomBytes(32);
    expect(parseSecretsKey(key.toString('hex'))?.equals(key)).toBe(true);
    expect(parseSecretsKey(key.toString('base64'))?.equals(key)).toBe(true);
    expect(parseSecretsKey('short')).toBeNull();
    expect(parseSecretsKey(randomBytes(16).toString('base64'))).toBeNull();
  });

  it('refuses a bad SECRETS_KEY, naming the variable but not the value', () => {
    expect(() => loadConfig({ SECRETS_KEY: 'not-a-key-value' })).toThrow(ConfigError);
    expect(() => loadConfig({ SECRETS_KEY: 'not-a-key-value' })).toThrow(/SECRETS_KEY/);
    try {
      loadConfig({ SECRETS_KEY: 'not-a-key-value' });
    } catch (err) {
      expect((err as Error).message).not.toContain('not-a-key-value');
    }
  });

  it('generates a key once into DATA_DIR/secrets.key (mode 0600) and reuses it; SECRETS_KEY overrides it', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sap-secrets-'));
    try {
      const first = resolveSecretBox({ DATA_DIR: dir, SECRETS_KEY: undefined });
      const file = path.join(dir, 'secrets.key');
      expect(fs.statSync(file).mode & 0o777).toBe(0o600);
      const sealed = first.seal(value, 'c');
      expect(resolveSecretBox({ DATA_DIR: dir, SECRETS_KEY: undefined }).open(sealed, 'c')).toBe(value);
      expect(fs.readdirSync(dir)).toEqual(['secrets.key']);
      const explicit = resolveSecretBox({ DATA_DIR: dir, SECRETS_KEY: randomBytes(32).toString('hex') });
      expect(() => explicit.open(sealed, 'c')).toThrow(/does not open/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
