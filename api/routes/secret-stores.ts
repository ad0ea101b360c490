import { z } from 'zod';
import type { RouteTable } from '../http';
import '../http';
import type { SecretStoreService } from '../../services/orgs/secret-stores';
import { secretEntryView as entryView, secretStoreView as storeView } from '../../services/views';
import { CreateSecretStoreBody, SetSecretBody, SecretStoreView, SecretEntryView, StoreParams, EntryParams } from '../../contract/secret-stores';

/** /api/secret-stores: named stores of write-only secrets (OpenComputer's SecretStore routes). */
export function registerSecretStoreRoutes(t: RouteTable, stores: SecretStoreService): void {
  t.add({
    method: 'post',
    path: '/api/secret-stores',
    tag: 'secret-stores',
    summary: 'Create a secret store (its name is unique in the organisation)',
    body: CreateSecretStoreBody,
    responses: { 201: { description: 'The store', schema: SecretStoreView } },
    errors: [409],
    handler: async ({ body, org, res }) => {
      const doc = await stores.create(org.id, body.name, body.egressAllowlist ?? []);
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
      const docs = await stores.list(org.id);
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
      res.json(storeView(await stores.get(org.id, params.id)));
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
      const doc = await stores.remove(org.id, params.id);
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
      const entries = await stores.listEntries(org.id, params.id);
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
      const entry = await stores.setEntry(org.id, params.id, params.name, body.value, body.allowedHosts ?? [], body.injectInto);
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
      const entry = await stores.deleteEntry(org.id, params.id, params.name);
      res.json(entryView(entry));
    },
  });
}
