import { randomBytes } from 'node:crypto';
import { hashSecret } from '../lib/ids';
import type { KeyRole, Store } from './index';

/** Creates the organisation if it does not exist yet. */
export async function ensureOrg(store: Store, orgId: string, name = orgId): Promise<void> {
  await store.orgs.updateOne({ _id: orgId }, { $setOnInsert: { name, createdAt: new Date(), settings: {} } }, { upsert: true });
}

/**
 * Stores `key` (hashed) as a key of `orgId` with `role` (tenant by default); storing the same key
 * again is a no-op (its role included). Only the operator's CLI (scripts/keys.ts) passes `operator`:
 * no route of the API creates keys.
 */
export async function ensureApiKey(store: Store, orgId: string, key: string, label = 'bootstrap', role: KeyRole = 'tenant'): Promise<void> {
  await ensureOrg(store, orgId);
  await store.apiKeys.updateOne(
    { _id: hashSecret(key) },
    { $setOnInsert: { orgId, label, role, prefix: key.slice(0, 4), createdAt: new Date() } },
    { upsert: true },
  );
}

/** Creates a new random key for `orgId` (tenant unless `role` says operator) and returns it; only its hash is stored. */
export async function createApiKey(store: Store, orgId: string, label: string, role: KeyRole = 'tenant'): Promise<string> {
  const key = `sap_${randomBytes(24).toString('base64url')}`;
  await ensureApiKey(store, orgId, key, label, role);
  return key;
}

/** Removes a key by the key itself. Returns whether it existed. */
export async function revokeApiKey(store: Store, key: string): Promise<boolean> {
  const r = await store.apiKeys.deleteOne({ _id: hashSecret(key) });
  return r.deletedCount === 1;
}

/** An organisation's own reservation limit per interval (GB); undefined when it has none. */
export async function orgReservationLimitGb(store: Store, orgId: string): Promise<number | undefined> {
  const org = await store.orgs.findOne({ _id: orgId });
  return org?.settings?.reservationLimitGb;
}

/** The organisation an API key (by its sha256) acts for; null when the key is unknown. */
export async function orgOfKeyHash(store: Store, keyHash: string): Promise<string | null> {
  return (await grantOfKeyHash(store, keyHash))?.orgId ?? null;
}

/** The organisation an API key (by its sha256) acts for and its role (tenant when unset); null when the key is unknown. */
export async function grantOfKeyHash(store: Store, keyHash: string): Promise<{ orgId: string; role: KeyRole } | null> {
  const doc = await store.apiKeys.findOne({ _id: keyHash });
  return doc ? { orgId: doc.orgId, role: doc.role === 'operator' ? 'operator' : 'tenant' } : null;
}

/** The API keys of an organisation (their records: hash, prefix, label, creation time). */
export function listApiKeys(store: Store, orgId: string) {
  return store.apiKeys.find({ orgId }).toArray();
}

/**
 * The organisation of a Temporal workflow by its id (a session's, batch's or instance's id; a webhook
 * delivery's `<subject id>-webhook`); null when none is stored. The payload codec's fallback
 * (lib/payload-codec.ts) for a workflow it has not met.
 */
export async function orgOfWorkflowId(store: Store, workflowId: string): Promise<string | null> {
  const id = workflowId.replace(/-webhook$/, '');
  const byId = { _id: id } as never;
  const project = { projection: { orgId: 1 } };
  const found =
    (await store.sessions.findOne(byId, project)) ??
    (await store.db.collection<{ _id: string; orgId: string }>('batches').findOne(byId, project)) ??
    (await store.db.collection<{ _id: string; orgId: string }>('instances').findOne(byId, project));
  return (found as { orgId?: string } | null)?.orgId ?? null;
}
