import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import { conflict, invalid, notFound } from '../../lib/errors';
import { randomId } from '../../lib/ids';
import { isDuplicateKey } from '../../store';
import {
  findSecretStore,
  needsNoStore,
  sealContext,
  secretEntriesOf,
  SecretEntryDoc,
  secretStoreKey,
  secretStoresOf,
  SecretStoreDoc,
} from '../../store/secrets';

/** 409 while an agent names the store. */
export async function assertStoreUnused(deps: ApiDeps, doc: SecretStoreDoc): Promise<void> {
  const users = await deps.store.agents.find({ orgId: doc.orgId, secret_store: doc.name }, { projection: { id: 1 } }).limit(5).toArray();
  if (users.length > 0) {
    throw conflict(`secret store ${doc.name} is named by agent(s) ${users.map((a) => a.id).join(', ')}${users.length === 5 ? ' and more' : ''}; point them at another store first`);
  }
}

/** Deletes a store and its secrets (the caller has checked it is unused). */
export async function removeSecretStore(deps: ApiDeps, doc: SecretStoreDoc): Promise<void> {
  await secretStoresOf(deps.store).deleteOne({ _id: doc._id });
  await secretEntriesOf(deps.store).deleteMany({ storeId: doc.id });
}

/** Store names: what agents' `secret_store` and sandboxes' `secretStore` hold. `ss-…` is kept for ids. */
export const SecretStoreName = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$/, 'must be 1-100 letters, digits, _ . - and start with a letter or digit')
  .refine((n) => !n.startsWith('ss-'), 'must not start with "ss-" (the form of store ids)');

/** Secret names become environment variable names in the sandbox. */
const SecretName = z
  .string()
  .max(200)
  .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');

/** Egress is not enforced per secret or store yet: a list given anyway is refused, not silently ignored. */
const NotYet = (field: string) =>
  z
    .array(z.string())
    .max(0, `${field} is not supported yet: egress rules do not depend on secret stores`)
    .optional();

const CreateSecretStoreBody = z.object({ name: SecretStoreName, egressAllowlist: NotYet('egressAllowlist') }).openapi('CreateSecretStore');
const SetSecretBody = z
  .object({
    value: z
      .string()
      .min(1, 'must not be empty')
      .max(32768)
      .refine((v) => !v.includes('\0'), 'must not contain NUL characters')
      .describe('Write-only: never returned, never logged'),
    allowedHosts: NotYet('allowedHosts'),
  })
  .openapi('SetSecret');

export const SecretStoreView = z
  .object({ id: z.string(), name: z.string(), createdAt: z.string(), updatedAt: z.string() })
  .openapi('SecretStore');
const SecretEntryView = z
  .object({ storeId: z.string(), name: z.string(), createdAt: z.string(), updatedAt: z.string() })
  .describe('A secret without its value (values are never returned)')
  .openapi('SecretEntry');

const StoreParams = z.object({
  id: z.string().min(1).max(100).describe('The store id (ss-…) or its name'),
});
const EntryParams = StoreParams.extend({ name: SecretName });

const storeView = (d: SecretStoreDoc): z.infer<typeof SecretStoreView> => ({
  id: d.id,
  name: d.name,
  createdAt: d.createdAt.toISOString(),
  updatedAt: d.updatedAt.toISOString(),
});
const entryView = (e: SecretEntryDoc): z.infer<typeof SecretEntryView> => ({
  storeId: e.storeId,
  name: e.name,
  createdAt: e.createdAt.toISOString(),
  updatedAt: e.updatedAt.toISOString(),
});

async function getStore(deps: ApiDeps, orgId: string, idOrName: string): Promise<SecretStoreDoc> {
  const doc = await findSecretStore(deps.store, orgId, idOrName);
  if (!doc) throw notFound(`secret store ${idOrName}`);
  return doc;
}

/**
 * 400 unless `name` is a store of the organisation (or needs none: empty, or the implicit
 * `default`). For the agent's `secret_store` and the sandbox's `secretStore`.
 */
export async function assertSecretStoreExists(deps: ApiDeps, orgId: string, name: string | undefined, field: string): Promise<void> {
  if (needsNoStore(name)) return;
  const doc = await secretStoresOf(deps.store).findOne({ _id: secretStoreKey(orgId, name!) }, { projection: { _id: 1 } });
  if (!doc) throw invalid(`${field}: no secret store named ${name}; create it with POST /api/secret-stores`);
}

/** /api/secret-stores: named stores of write-only secrets (OpenComputer's SecretStore routes). */
export function registerSecretStoreRoutes(t: RouteTable, deps: ApiDeps): void {
  t.add({
    method: 'post',
    path: '/api/secret-stores',
    tag: 'secret-stores',
    summary: 'Create a secret store (its name is unique in the organisation)',
    body: CreateSecretStoreBody,
    responses: { 201: { description: 'The store', schema: SecretStoreView } },
    errors: [409],
    handler: async ({ body, org, res }) => {
      const now = new Date();
      const doc: SecretStoreDoc = { _id: secretStoreKey(org.id, body.name), orgId: org.id, id: `ss-${randomId()}`, name: body.name, createdAt: now, updatedAt: now };
      try {
        await secretStoresOf(deps.store).insertOne(doc);
      } catch (err) {
        if (isDuplicateKey(err)) throw conflict(`secret store ${body.name} already exists`);
        throw err;
      }
      res.status(201).json(storeView(doc));
    },
  });

  t.add({
    method: 'get',
    path: '/api/secret-stores',
    tag: 'secret-stores',
    summary: "List the organisation's secret stores, by name",
    responses: { 200: { description: 'Stores (no secrets)', schema: z.array(SecretStoreView) } },
    handler: async ({ org, res }) => {
      const docs = await secretStoresOf(deps.store).find({ orgId: org.id }).sort({ name: 1 }).limit(1000).toArray();
      res.json(docs.map(storeView));
    },
  });

  t.add({
    method: 'get',
    path: '/api/secret-stores/:id',
    tag: 'secret-stores',
    summary: 'Get a secret store',
    params: StoreParams,
    responses: { 200: { description: 'The store', schema: SecretStoreView } },
    handler: async ({ params, org, res }) => {
      res.json(storeView(await getStore(deps, org.id, params.id)));
    },
  });

  t.add({
    method: 'delete',
    path: '/api/secret-stores/:id',
    tag: 'secret-stores',
    summary: 'Delete a secret store and its secrets; refused (409) while an agent names it. Running sandboxes keep their environment.',
    params: StoreParams,
    responses: { 200: { description: 'The deleted store', schema: SecretStoreView } },
    errors: [409],
    handler: async ({ params, org, res }) => {
      const doc = await getStore(deps, org.id, params.id);
      await assertStoreUnused(deps, doc);
      await removeSecretStore(deps, doc);
      res.json(storeView(doc));
    },
  });

  t.add({
    method: 'get',
    path: '/api/secret-stores/:id/secrets',
    tag: 'secret-stores',
    summary: "List a store's secrets: names and times, never values",
    params: StoreParams,
    responses: { 200: { description: 'Secrets without values', schema: z.array(SecretEntryView) } },
    handler: async ({ params, org, res }) => {
      const doc = await getStore(deps, org.id, params.id);
      const entries = await secretEntriesOf(deps.store).find({ storeId: doc.id }, { projection: { value: 0 } }).sort({ name: 1 }).toArray();
      res.json(entries.map(entryView));
    },
  });

  t.add({
    method: 'put',
    path: '/api/secret-stores/:id/secrets/:name',
    tag: 'secret-stores',
    summary: 'Set a secret (created or replaced); sandboxes created from now on get it as the environment variable {name}',
    params: EntryParams,
    body: SetSecretBody,
    responses: { 200: { description: 'The secret, without its value', schema: SecretEntryView } },
    handler: async ({ params, body, org, res }) => {
      const doc = await getStore(deps, org.id, params.id);
      const now = new Date();
      const sealed = deps.secrets.seal(body.value, sealContext(org.id, doc.id, params.name));
      const _id = `${doc.id}/${params.name}`;
      await secretEntriesOf(deps.store).updateOne(
        { _id },
        { $set: { value: sealed, updatedAt: now }, $setOnInsert: { orgId: org.id, storeId: doc.id, name: params.name, createdAt: now } },
        { upsert: true },
      );
      await secretStoresOf(deps.store).updateOne({ _id: doc._id }, { $set: { updatedAt: now } });
      const entry = await secretEntriesOf(deps.store).findOne({ _id }, { projection: { value: 0 } });
      if (!entry) throw notFound(`secret ${params.name} in store ${params.id}`); // deleted at the same moment
      res.json(entryView(entry));
    },
  });

  t.add({
    method: 'delete',
    path: '/api/secret-stores/:id/secrets/:name',
    tag: 'secret-stores',
    summary: 'Delete a secret; sandboxes that already have it keep it, new ones do not get it',
    params: EntryParams,
    responses: { 200: { description: 'The deleted secret, without its value', schema: SecretEntryView } },
    handler: async ({ params, org, res }) => {
      const doc = await getStore(deps, org.id, params.id);
      const _id = `${doc.id}/${params.name}`;
      const entry = await secretEntriesOf(deps.store).findOne({ _id }, { projection: { value: 0 } });
      if (!entry || (await secretEntriesOf(deps.store).deleteOne({ _id })).deletedCount === 0) throw notFound(`secret ${params.name} in store ${params.id}`);
      await secretStoresOf(deps.store).updateOne({ _id: doc._id }, { $set: { updatedAt: new Date() } });
      res.json(entryView(entry));
    },
  });
}
