import type { Request } from 'express';
import { createAuthenticator } from '../../api/auth';
import { createKeyService } from '../../services/orgs/api-keys';
import { authorizeMetrics, isLoopback } from '../../api/metrics';
import { hashSecret } from '../../lib/ids';
import type { Store } from '../../store';

/** A store whose api_keys hold a tenant's key (`tenant-key`, stored before roles: no role) and an operator's (`op-key`). */
function store(): Store {
  const docs = [
    { _id: hashSecret('tenant-key'), orgId: 'org-a' },
    { _id: hashSecret('op-key'), orgId: 'ops', role: 'operator' },
  ];
  const apiKeys = { findOne: async (q: { _id: string }) => docs.find((d) => d._id === q._id) ?? null };
  return { apiKeys, db: { collection: () => apiKeys } } as unknown as Store;
}

const req = (headers: Record<string, string>, remoteAddress = '10.1.2.3') => ({ headers, query: {}, socket: { remoteAddress } }) as unknown as Request;

describe('the operator role of a key', () => {
  const auth = createAuthenticator(createKeyService(store()));

  it('is tenant for a key stored without a role, operator when stored so', async () => {
    await expect(auth.authenticate(req({ 'x-api-key': 'tenant-key' }))).resolves.toEqual({ id: 'org-a', role: 'tenant' });
    await expect(auth.authenticate(req({ 'x-api-key': 'op-key' }))).resolves.toEqual({ id: 'ops', role: 'operator' });
  });

  it("refuses a tenant's key on an operator's route with 403, a wrong key with 401", async () => {
    await expect(auth.authenticateOperator(req({ 'x-api-key': 'tenant-key' }))).rejects.toMatchObject({ type: 'forbidden', status: 403 });
    await expect(auth.authenticateOperator(req({ 'x-api-key': 'nope' }))).rejects.toMatchObject({ type: 'unauthorized' });
    await expect(auth.authenticateOperator(req({ 'x-api-key': 'op-key' }))).resolves.toEqual({ id: 'ops', role: 'operator' });
  });
});

describe('GET /metrics access', () => {
  const auth = createAuthenticator(createKeyService(store()));
  const TOKEN = 'metrics-token-0123456789';

  it('with METRICS_TOKEN: the bearer token from anywhere, nothing else (loopback included); an operator key too', async () => {
    await expect(authorizeMetrics(req({ authorization: `Bearer ${TOKEN}` }), TOKEN, auth)).resolves.toBeUndefined();
    await expect(authorizeMetrics(req({ authorization: 'Bearer wrong-token-0123456789' }), TOKEN, auth)).rejects.toMatchObject({ type: 'unauthorized' });
    await expect(authorizeMetrics(req({}, '127.0.0.1'), TOKEN, auth)).rejects.toMatchObject({ type: 'unauthorized' });
    await expect(authorizeMetrics(req({ authorization: TOKEN }), TOKEN, auth)).rejects.toMatchObject({ type: 'unauthorized' });
    await expect(authorizeMetrics(req({ 'x-api-key': 'op-key' }), TOKEN, auth)).resolves.toBeUndefined();
    await expect(authorizeMetrics(req({ 'x-api-key': 'tenant-key' }), TOKEN, auth)).rejects.toMatchObject({ type: 'forbidden' });
  });

  it('without it: loopback peers only (and operator keys), never a tenant key', async () => {
    for (const a of ['127.0.0.1', '::1', '::ffff:127.0.0.1', '127.5.6.7']) await expect(authorizeMetrics(req({}, a), undefined, auth)).resolves.toBeUndefined();
    for (const a of ['10.1.2.3', '::ffff:10.0.0.1', '::2', '128.0.0.1', undefined])
      await expect(authorizeMetrics(req({}, a as string), undefined, auth)).rejects.toMatchObject({ type: 'forbidden' });
    await expect(authorizeMetrics(req({ authorization: 'Bearer anything-at-all-here' }), undefined, auth)).rejects.toMatchObject({ type: 'forbidden' });
    await expect(authorizeMetrics(req({ 'x-api-key': 'op-key' }), undefined, auth)).resolves.toBeUndefined();
    await expect(authorizeMetrics(req({ 'x-api-key': 'tenant-key' }, '127.0.0.1'), undefined, auth)).rejects.toMatchObject({ type: 'forbidden' });
    expect(isLoopback('::ffff:127.0.0.1')).toBe(true);
    expect(isLoopback('1270.0.0.1')).toBe(false);
  });
});
