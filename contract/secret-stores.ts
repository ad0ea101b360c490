/**
 * Secret stores and their sealed secrets (/api/secret-stores): names, bodies and views.
 */
import { z } from './zod'; // zod with .openapi()
import { MAX_ALLOWED_HOSTS, MAX_HOST_LENGTH, MAX_INJECT_INTO, normaliseAllowedHost, normaliseInjectInto } from './sealed';

/** Store names: what agents' `secret_store` and sandboxes' `secretStore` hold. `ss-…` is kept for ids. */
export const SecretStoreName = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$/, 'must be 1-100 letters, digits, _ . - and start with a letter or digit')
  .refine((n) => !n.startsWith('ss-'), 'must not start with "ss-" (the form of store ids)');

/** Secret names become environment variable names in the sandbox. */
export const SecretName = z
  .string()
  .max(200)
  .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');

/** Hosts a sealed secret may be sent to (docs/sealed-secrets.md): names and `*.wildcards`, normalised; never widens a sandbox's egress policy. */
export const AllowedHosts = (what: string) =>
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
export const InjectInto = z
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

export const CreateSecretStoreBody = z
  .object({
    name: SecretStoreName,
    egressAllowlist: AllowedHosts("Hosts the store's secrets without allowedHosts of their own may be sent to: they are sealed too"),
  })
  .openapi('CreateSecretStore');

export const SetSecretBody = z
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

export const SecretEntryView = z
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

export const StoreParams = z.object({
  id: z.string().min(1).max(100).describe('The store id (ss-…) or its name'),
});

export const EntryParams = StoreParams.extend({ name: SecretName });
