import type { Store } from './index';
import type { SecretBox } from '../lib/secret-box';
import type { SealedSecretSpec } from '../contract/sealed';

/**
 * A named secret store of an organisation. `_id` is `<orgId>/<name>` so a name is unique per
 * organisation and the lookup by name (what agents and sandboxes hold) is an `_id` read; `id`
 * (`ss-…`) is the stable handle that OpenComputer's client puts in paths.
 */
export interface SecretStoreDoc {
  _id: string;
  orgId: string;
  id: string;
  name: string;
  /** Hosts its secrets without their own `allowedHosts` may be sent to (sealed secrets, docs/sealed-secrets.md); absent or empty: none. */
  egressAllowlist?: string[];
  createdAt: Date;
  updatedAt: Date;
}

/**
 * One secret of a store. `_id` is `<storeId>/<NAME>`, so setting a secret is one upsert.
 * `value` is sealed (lib/secret-box.ts) with the context `<orgId>/<storeId>/<NAME>`.
 */
export interface SecretEntryDoc {
  _id: string;
  orgId: string;
  storeId: string;
  name: string;
  value: string;
  /** Hosts the value may be sent to: the secret is sealed (a placeholder in the sandbox). Absent or empty: plain. */
  allowedHosts?: string[];
  /** Where the proxy may put the value when sealed (header names, `body`). Absent: DEFAULT_INJECT_INTO. */
  injectInto?: string[];
  createdAt: Date;
  updatedAt: Date;
}

export const secretStoresOf = (store: Store) => store.db.collection<SecretStoreDoc>('secret_stores');
export const secretEntriesOf = (store: Store) => store.db.collection<SecretEntryDoc>('secret_entries');

/**
 * The store every agent names unless told otherwise (the agent field's default). It need not
 * exist: an agent naming it while it does not exist gets no secrets.
 */
export const DEFAULT_SECRET_STORE = 'default';

export const secretStoreKey = (orgId: string, name: string): string => `${orgId}/${name}`;
export const sealContext = (orgId: string, storeId: string, name: string): string => `${orgId}/${storeId}/${name}`;

/** The organisation's store by its id (`ss-…`) or its name; null when it has none such. */
export async function findSecretStore(store: Store, orgId: string, idOrName: string): Promise<SecretStoreDoc | null> {
  if (/^ss-/.test(idOrName)) return secretStoresOf(store).findOne({ orgId, id: idOrName });
  return secretStoresOf(store).findOne({ _id: secretStoreKey(orgId, idOrName) });
}

/** A store an agent or sandbox names does not exist (any more). */
export class SecretStoreMissing extends Error {
  override name = 'SecretStoreMissing';
  constructor(readonly storeName: string) {
    super(`secret store ${storeName} does not exist`);
  }
}

/** A store's secret does not open with this process's key (SECRETS_KEY changed, or differs between processes). */
export class SecretUnreadable extends Error {
  override name = 'SecretUnreadable';
  constructor(storeName: string, secretName: string) {
    super(`secret ${secretName} of secret store ${storeName} does not open with this SECRETS_KEY; set it again, or give every process the key it was set with`);
  }
}

/** True when naming `name` needs no existing store: none at all, or the implicit default. */
export const needsNoStore = (name: string | undefined | null): boolean => !name || name === DEFAULT_SECRET_STORE;

/**
 * What a sandbox gets from the store `name`: `env`, each plain secret's name and opened value, and
 * `sealed`, each secret with allowed hosts (its own, else the store's `egressAllowlist`) with its
 * opened value, which the host keeps and the sandbox sees as a placeholder (docs/sealed-secrets.md).
 * Read when the sandbox is created, so a secret set or deleted later reaches new sandboxes only.
 * No name (or the default store, absent) gives none; another absent store throws SecretStoreMissing.
 */
export async function storeSecretsOf(
  store: Store,
  box: SecretBox,
  orgId: string,
  name: string | undefined | null,
): Promise<{ env: Record<string, string>; sealed: SealedSecretSpec[] }> {
  const env: Record<string, string> = {};
  const sealed: SealedSecretSpec[] = [];
  if (!name) return { env, sealed };
  const doc = await secretStoresOf(store).findOne({ _id: secretStoreKey(orgId, name) });
  if (!doc) {
    if (name === DEFAULT_SECRET_STORE) return { env, sealed };
    throw new SecretStoreMissing(name);
  }
  const entries = await secretEntriesOf(store).find({ storeId: doc.id }).toArray();
  for (const e of entries) {
    if (e.orgId !== orgId) continue;
    let value: string;
    try {
      value = box.open(e.value, sealContext(orgId, doc.id, e.name));
    } catch {
      throw new SecretUnreadable(name, e.name);
    }
    const hosts = e.allowedHosts?.length ? e.allowedHosts : (doc.egressAllowlist ?? []);
    if (hosts.length) sealed.push({ name: e.name, value, allowedHosts: hosts, ...(e.injectInto?.length ? { injectInto: e.injectInto } : {}) });
    else env[e.name] = value;
  }
  return { env, sealed };
}

/** The allowed hosts of each sealed secret of the store `name` (no values): for a sandbox's allowed-hosts view. */
export async function sealedHostsOf(
  store: Store,
  orgId: string,
  name: string | null | undefined,
): Promise<{ egressAllowlist: string[]; perSecret: Record<string, string[]> }> {
  const doc = name ? await secretStoresOf(store).findOne({ _id: secretStoreKey(orgId, name) }) : null;
  if (!doc) return { egressAllowlist: [], perSecret: {} };
  const entries = await secretEntriesOf(store)
    .find({ storeId: doc.id }, { projection: { value: 0 } })
    .toArray();
  const perSecret: Record<string, string[]> = {};
  for (const e of entries) {
    const hosts = e.allowedHosts?.length ? e.allowedHosts : (doc.egressAllowlist ?? []);
    if (e.orgId === orgId && hosts.length) perSecret[e.name] = hosts;
  }
  return { egressAllowlist: doc.egressAllowlist ?? [], perSecret };
}

/** Whether the organisation has a store named `name`. */
export async function secretStoreExists(store: Store, orgId: string, name: string): Promise<boolean> {
  return (await secretStoresOf(store).findOne({ _id: secretStoreKey(orgId, name) }, { projection: { _id: 1 } })) !== null;
}

/** Stores a new secret store; throws MongoDB's duplicate-key error when its name is taken. */
export async function insertSecretStore(store: Store, doc: SecretStoreDoc): Promise<void> {
  await secretStoresOf(store).insertOne(doc);
}

/** The organisation's stores, by name (at most 1000). */
export function listSecretStores(store: Store, orgId: string): Promise<SecretStoreDoc[]> {
  return secretStoresOf(store).find({ orgId }).sort({ name: 1 }).limit(1000).toArray();
}

/** Deletes a store and its secrets. */
export async function deleteSecretStore(store: Store, doc: SecretStoreDoc): Promise<void> {
  await secretStoresOf(store).deleteOne({ _id: doc._id });
  await secretEntriesOf(store).deleteMany({ storeId: doc.id });
}

/** A store's secrets by name, without their values. */
export function listSecretEntries(store: Store, storeId: string): Promise<SecretEntryDoc[]> {
  return secretEntriesOf(store)
    .find({ storeId }, { projection: { value: 0 } })
    .sort({ name: 1 })
    .toArray();
}

/** Creates or replaces a secret (its value sealed already) and returns it without its value; null if deleted meanwhile. */
export async function putSecretEntry(
  store: Store,
  doc: SecretStoreDoc,
  name: string,
  sealed: string,
  now: Date,
  allowedHosts: string[] = [],
  injectInto?: string[],
): Promise<SecretEntryDoc | null> {
  const _id = `${doc.id}/${name}`;
  // Replacing a secret without injectInto gives it the default again (the whole secret is replaced).
  await secretEntriesOf(store).updateOne(
    { _id },
    {
      $set: { value: sealed, allowedHosts, updatedAt: now, ...(injectInto ? { injectInto } : {}) },
      ...(injectInto ? {} : { $unset: { injectInto: '' } }),
      $setOnInsert: { orgId: doc.orgId, storeId: doc.id, name, createdAt: now },
    },
    { upsert: true },
  );
  await secretStoresOf(store).updateOne({ _id: doc._id }, { $set: { updatedAt: now } });
  return secretEntriesOf(store).findOne({ _id }, { projection: { value: 0 } });
}

/** Deletes a secret and returns it without its value; null when there was none. */
export async function deleteSecretEntry(store: Store, doc: SecretStoreDoc, name: string): Promise<SecretEntryDoc | null> {
  const _id = `${doc.id}/${name}`;
  const entry = await secretEntriesOf(store).findOne({ _id }, { projection: { value: 0 } });
  if (!entry || (await secretEntriesOf(store).deleteOne({ _id })).deletedCount === 0) return null;
  await secretStoresOf(store).updateOne({ _id: doc._id }, { $set: { updatedAt: new Date() } });
  return entry;
}
