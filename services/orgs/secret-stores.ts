import { conflict, invalid, notFound } from '../../contract/errors';
import { randomId } from '../../lib/ids';
import { isDuplicateKey } from '../../store';
import { agentsNamingStore } from '../../store/agents';
import {
  deleteSecretEntry,
  deleteSecretStore,
  findSecretStore,
  insertSecretStore,
  listSecretEntries,
  listSecretStores,
  needsNoStore,
  putSecretEntry,
  sealContext,
  secretStoreExists,
  secretStoreKey,
  sealedHostsOf,
  type SecretEntryDoc,
  type SecretStoreDoc,
} from '../../store/secrets';
import type { ServiceDeps } from '../deps';

/** 409 while an agent names the store. */
export async function assertStoreUnused(deps: Pick<ServiceDeps, 'store'>, doc: SecretStoreDoc): Promise<void> {
  const users = await agentsNamingStore(deps.store, doc.orgId, doc.name, 5);
  if (users.length > 0) {
    throw conflict(
      `secret store ${doc.name} is named by agent(s) ${users.join(', ')}${users.length === 5 ? ' and more' : ''}; point them at another store first`,
    );
  }
}

/** Deletes a store and its secrets (the caller has checked it is unused). */
export async function removeSecretStore(deps: Pick<ServiceDeps, 'store'>, doc: SecretStoreDoc): Promise<void> {
  await deleteSecretStore(deps.store, doc);
}

/** The allowed hosts of each sealed secret of the organisation's store `name`, never values (a sandbox's allowed-hosts view). */
export function sealedHostsOfStore(deps: Pick<ServiceDeps, 'store'>, orgId: string, name: string | null | undefined) {
  return sealedHostsOf(deps.store, orgId, name);
}

/** Named stores of write-only secrets, per organisation. */
export interface SecretStoreService {
  /** Creates a store; 409 when its name is taken. */
  create(orgId: string, name: string, egressAllowlist?: string[]): Promise<SecretStoreDoc>;
  list(orgId: string): Promise<SecretStoreDoc[]>;
  /** The store by id (`ss-…`) or name, or throws 404. */
  get(orgId: string, idOrName: string): Promise<SecretStoreDoc>;
  /** Deletes a store and its secrets and returns it; 409 while an agent names it. */
  remove(orgId: string, idOrName: string): Promise<SecretStoreDoc>;
  /** A store's secrets, without values. */
  listEntries(orgId: string, idOrName: string): Promise<SecretEntryDoc[]>;
  /** Sets a secret (sealed before it is stored) and returns it without its value. */
  setEntry(orgId: string, idOrName: string, name: string, value: string, allowedHosts?: string[], injectInto?: string[]): Promise<SecretEntryDoc>;
  /** Deletes a secret and returns it without its value; 404 when there is none. */
  deleteEntry(orgId: string, idOrName: string, name: string): Promise<SecretEntryDoc>;
  /**
   * 400 unless `name` is a store of the organisation (or needs none: empty, or the implicit
   * `default`). For the agent's `secret_store` and the sandbox's `secretStore`.
   */
  assertExists(orgId: string, name: string | undefined, field: string): Promise<void>;
}

export function createSecretStoreService(deps: ServiceDeps): SecretStoreService {
  const get = async (orgId: string, idOrName: string): Promise<SecretStoreDoc> => {
    const doc = await findSecretStore(deps.store, orgId, idOrName);
    if (!doc) throw notFound(`secret store ${idOrName}`);
    return doc;
  };
  return {
    async create(orgId, name, egressAllowlist = []) {
      const now = new Date();
      const doc: SecretStoreDoc = {
        _id: secretStoreKey(orgId, name),
        orgId,
        id: `ss-${randomId()}`,
        name,
        ...(egressAllowlist.length ? { egressAllowlist } : {}),
        createdAt: now,
        updatedAt: now,
      };
      try {
        await insertSecretStore(deps.store, doc);
      } catch (err) {
        if (isDuplicateKey(err)) throw conflict(`secret store ${name} already exists`);
        throw err;
      }
      return doc;
    },
    list: (orgId) => listSecretStores(deps.store, orgId),
    get,
    async remove(orgId, idOrName) {
      const doc = await get(orgId, idOrName);
      await assertStoreUnused(deps, doc);
      await removeSecretStore(deps, doc);
      return doc;
    },
    async listEntries(orgId, idOrName) {
      return listSecretEntries(deps.store, (await get(orgId, idOrName)).id);
    },
    async setEntry(orgId, idOrName, name, value, allowedHosts = [], injectInto) {
      const doc = await get(orgId, idOrName);
      const sealed = deps.secrets.seal(value, sealContext(orgId, doc.id, name));
      const entry = await putSecretEntry(deps.store, doc, name, sealed, new Date(), allowedHosts, injectInto);
      if (!entry) throw notFound(`secret ${name} in store ${idOrName}`); // deleted at the same moment
      return entry;
    },
    async deleteEntry(orgId, idOrName, name) {
      const doc = await get(orgId, idOrName);
      const entry = await deleteSecretEntry(deps.store, doc, name);
      if (!entry) throw notFound(`secret ${name} in store ${idOrName}`);
      return entry;
    },
    async assertExists(orgId, name, field) {
      if (needsNoStore(name)) return;
      if (!(await secretStoreExists(deps.store, orgId, name!)))
        throw invalid(`${field}: no secret store named ${name}; create it with POST /api/secret-stores`);
    },
  };
}
