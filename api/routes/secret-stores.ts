import { z } from 'zod';
import type { RouteTable } from '../http';
import '../http';
import { MAX_ALLOWED_HOSTS, MAX_HOST_LENGTH, MAX_INJECT_INTO, normaliseAllowedHost, normaliseInjectInto } from '../../contract/sealed';
import type { SecretStoreService } from '../../services/secret-stores';
import { secretEntryView as entryView, secretStoreView as storeView } from '../../services/views';

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

/** Hosts a sealed secret may be sent to (docs/sealed-secrets.md): names and `*.wildcards`, normalised; never widens a sandbox's egress policy. */
const AllowedHosts = (what: string) =>
  z
    .array(z.string().max(MAX_HOST_LENGTH))
    .max(MAX_ALLOWED_HOSTS)
    .transform((hosts, ctx) => {
      const out: string[] = [];
      for (const h of hosts) {
        try {
          out.push(normaliseAllowedHost(h));
        } catch (err) {
          ctx.addIssue({ code: 'custom', message: (err as Error).message });
          return z.NEVER;
        }
      }
      return [...new Set(out)];
    })
    .optional()
    .describe(what);

/** Where a sealed secret's value may be put in a request (docs/sealed-secrets.md, "Where a value goes"). */
const InjectInto = z
  .array(z.string().max(100))
  .min(1)
  .max(MAX_INJECT_INTO)
  .transform((names, ctx) => {
    const out: string[] = [];
    for (const n of names) {
      try {
        out.push(normaliseInjectInto(n));
      } catch (err) {
        ctx.addIssue({ code: 'custom', message: (err as Error).message });
        return z.NEVER;
      }
    }
    return [...new Set(out)];
  })
  .optional()
  .describe(
    'Where the proxy may put a sealed value: request header names and/or "body". Default: authorization, x-api-key, api-key, x-goog-api-key, x-auth-token (headers only)',
  );

const CreateSecretStoreBody = z
  .object({
    name: SecretStoreName,
    egressAllowlist: AllowedHosts("Hosts the store's secrets without allowedHosts of their own may be sent to: they are sealed too"),
  })
  .openapi('CreateSecretStore');
const SetSecretBody = z
  .object({
    value: z
      .string()
      .min(1, 'must not be empty')
      .max(32768)
      .refine((v) => !v.includes('\0'), 'must not contain NUL characters')
      .describe('Write-only: never returned, never logged'),
    allowedHosts: AllowedHosts('Seals the secret: sandboxes get a placeholder, and the egress proxy sends the value to these hosts only'),
    injectInto: InjectInto,
  })
  .openapi('SetSecret');

export const SecretStoreView = z
  .object({ id: z.string(), name: z.string(), egressAllowlist: z.array(z.string()), createdAt: z.string(), updatedAt: z.string() })
  .openapi('SecretStore');
const SecretEntryView = z
  .object({
    storeId: z.string(),
    name: z.string(),
    allowedHosts: z.array(z.string()),
    injectInto: z.array(z.string()).describe('Where the proxy may put the value when it is sealed (the default when it was not set)'),
    createdAt: z.string(),
    updatedAt: z.string(),
  })
  .describe('A secret without its value (values are never returned)')
  .openapi('SecretEntry');

const StoreParams = z.object({
  id: z.string().min(1).max(100).describe('The store id (ss-…) or its name'),
});
const EntryParams = StoreParams.extend({ name: SecretName });

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
