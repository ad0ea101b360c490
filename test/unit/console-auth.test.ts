import type { Request } from 'express';
import { createAuthenticator, pickSubprotocol } from '../../api/auth';
import { createKeyService } from '../../services/orgs/api-keys';
import { hashSecret } from '../../lib/ids';
import type { Store } from '../../store';

/** A store whose api_keys hold one key of organisation `org-a` (all orgOfKeyHash reads). */
function storeWithKey(key: string): Store {
  const keys = new Map([[hashSecret(key), { _id: hashSecret(key), orgId: 'org-a' }]]);
  const apiKeys = { findOne: async (q: { _id: string }) => keys.get(q._id) ?? null };
  return { apiKeys, db: { collection: () => apiKeys } } as unknown as Store;
}

const req = (headers: Record<string, string>, query: Record<string, string> = {}) =>
  ({ method: 'GET', headers: { upgrade: 'websocket', ...headers }, query }) as unknown as Request;
/** A plain HTTP request (no Upgrade). */
const httpReq = (headers: Record<string, string>, query: Record<string, string> = {}) => ({ method: 'GET', headers, query }) as unknown as Request;
const b64 = (s: string) => Buffer.from(s).toString('base64url');

describe('the console WebSocket key (Sec-WebSocket-Protocol)', () => {
  it('picks sap-console when offered, else the first protocol that is not a key (ws 7 passes an array, ws 8 a Set)', () => {
    expect(pickSubprotocol(['sap-console', `sap-key.${b64('k')}`])).toBe('sap-console');
    expect(pickSubprotocol(new Set([`sap-key.${b64('k')}`, 'sap-console']))).toBe('sap-console');
    expect(pickSubprotocol(['other', 'more'])).toBe('other');
    expect(pickSubprotocol([`sap-key.${b64('k')}`, 'other'])).toBe('other');
    expect(pickSubprotocol([])).toBe(false);
  });

  it('never selects (so never echoes) a key: a handshake that offers only sap-key.<key> gets no protocol back', () => {
    expect(pickSubprotocol([`sap-key.${b64('the-right-key')}`])).toBe(false);
    expect(pickSubprotocol(new Set([`sap-key.${b64('a')}`, `sap-key.${b64('b')}`]))).toBe(false);
  });

  it('refuses a handshake that offers the key alone, without sap-console, saying what to offer', async () => {
    const auth = createAuthenticator(createKeyService(storeWithKey('the-right-key')));
    await expect(auth.authenticate(req({ 'sec-websocket-protocol': `sap-key.${b64('the-right-key')}` }))).rejects.toMatchObject({
      type: 'unauthorized',
      message: expect.stringContaining('must offer sap-console beside it'),
    });
  });

  it('authenticates the key carried as sap-key.<base64url>, and refuses a wrong or empty one', async () => {
    const auth = createAuthenticator(createKeyService(storeWithKey('the-right-key')));
    await expect(auth.authenticate(req({ 'sec-websocket-protocol': `sap-console, sap-key.${b64('the-right-key')}` }))).resolves.toEqual({
      id: 'org-a',
      role: 'tenant',
    });
    await expect(auth.authenticate(req({ 'sec-websocket-protocol': `sap-console, sap-key.${b64('wrong')}` }))).rejects.toMatchObject({ type: 'unauthorized' });
    await expect(auth.authenticate(req({ 'sec-websocket-protocol': 'sap-console, sap-key.' }))).rejects.toMatchObject({ type: 'unauthorized' });
    // The header wins over the subprotocol.
    await expect(
      auth.authenticate(req({ 'x-api-key': 'wrong', 'sec-websocket-protocol': `sap-console, sap-key.${b64('the-right-key')}` })),
    ).rejects.toMatchObject({ type: 'unauthorized' });
  });
});

describe('the key in the query', () => {
  const spellings = ['api_key', 'api%5Fkey', 'api%5fkey', '%61pi_key', '%61%70%69%5F%6B%65%79'];

  it.each(spellings)('is never taken from an HTTP request (%s): a header can be sent there', async (name) => {
    const auth = createAuthenticator(createKeyService(storeWithKey('the-right-key')));
    // Express's simple query parser decodes the name: every spelling arrives as api_key.
    const query = require('node:querystring').parse(`${name}=the-right-key`) as Record<string, string>;
    expect(query.api_key).toBe('the-right-key');
    await expect(auth.authenticate(httpReq({}, query))).rejects.toMatchObject({
      type: 'unauthorized',
      message: 'missing API key: send it in the X-API-Key header',
    });
    await expect(auth.authenticate({ method: 'POST', headers: { upgrade: 'websocket' }, query } as unknown as Request)).rejects.toMatchObject({
      type: 'unauthorized',
    });
  });

  it('is taken from a WebSocket handshake (OpenComputer’s client sends ?api_key=)', async () => {
    const auth = createAuthenticator(createKeyService(storeWithKey('the-right-key')));
    await expect(auth.authenticate(req({}, { api_key: 'the-right-key' }))).resolves.toEqual({ id: 'org-a', role: 'tenant' });
    await expect(auth.authenticate(req({ upgrade: 'WebSocket' }, { api_key: 'the-right-key' }))).resolves.toEqual({ id: 'org-a', role: 'tenant' });
    await expect(auth.authenticate(req({}, { api_key: 'wrong' }))).rejects.toMatchObject({ type: 'unauthorized', message: 'invalid API key' });
  });
});

describe('watching an open socket’s key', () => {
  afterEach(() => jest.useRealTimers());

  it('calls back once the key no longer resolves to its organisation (after the cache window), and not after stop', async () => {
    jest.useFakeTimers();
    const keys = new Map([[hashSecret('k1'), { _id: hashSecret('k1'), orgId: 'org-a' }]]);
    const apiKeys = { findOne: async (q: { _id: string }) => keys.get(q._id) ?? null };
    const auth = createAuthenticator(createKeyService({ apiKeys, db: { collection: () => apiKeys } } as unknown as Store));
    const r = req({ 'sec-websocket-protocol': `sap-console, sap-key.${b64('k1')}` });
    const org = await auth.authenticate(r);
    const revoked = jest.fn();
    const stopped = jest.fn();
    auth.watch(r, org, revoked);
    const stop = auth.watch(r, org, stopped);
    await jest.advanceTimersByTimeAsync(20_000);
    expect(revoked).not.toHaveBeenCalled();
    keys.clear(); // revoked
    stop();
    await jest.advanceTimersByTimeAsync(9_000); // 29 s: the cached answer still stands
    expect(revoked).not.toHaveBeenCalled();
    await jest.advanceTimersByTimeAsync(6_000); // 35 s: looked up again, gone
    expect(revoked).toHaveBeenCalledTimes(1);
    await jest.advanceTimersByTimeAsync(30_000);
    expect(revoked).toHaveBeenCalledTimes(1);
    expect(stopped).not.toHaveBeenCalled();
  });
});

describe('the key cache’s lifetime (API_KEY_CACHE_MS)', () => {
  afterEach(() => jest.useRealTimers());

  it('keeps a lookup for the lifetime given, and an open socket learns of a revocation within it plus one check', async () => {
    jest.useFakeTimers();
    const keys = new Map([[hashSecret('k2'), { _id: hashSecret('k2'), orgId: 'org-a' }]]);
    let reads = 0;
    const apiKeys = { findOne: async (q: { _id: string }) => (reads++, keys.get(q._id) ?? null) };
    const auth = createAuthenticator(createKeyService({ apiKeys, db: { collection: () => apiKeys } } as unknown as Store), 2_000);
    const r = req({ 'x-api-key': 'k2' });
    const org = await auth.authenticate(r);
    const revoked = jest.fn();
    auth.watch(r, org, revoked);
    keys.clear(); // revoked at once
    await expect(auth.resolve('k2')).resolves.toEqual({ id: 'org-a', role: 'tenant' }); // cached
    expect(reads).toBe(1);
    await jest.advanceTimersByTimeAsync(1_900); // first check (every 2 s: the lifetime is under 5 s) not yet
    expect(revoked).not.toHaveBeenCalled();
    await jest.advanceTimersByTimeAsync(2_200); // 4.1 s: the second check finds the lookup expired
    expect(revoked).toHaveBeenCalledTimes(1);
    await expect(auth.resolve('k2')).resolves.toBeNull();
  });
});
