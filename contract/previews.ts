/**
 * A sandbox's preview URLs (/api/sandboxes/{id}/preview): bodies and views.
 */
import { z } from './zod'; // zod with .openapi()

export const Port = z.coerce.number().int('must be an integer').min(1, 'must be 1 to 65535').max(65535, 'must be 1 to 65535');

export const DomainName = z
  .string()
  .toLowerCase()
  .max(200)
  .regex(/^(?=.{1,200}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+$/, 'must be a domain name such as preview.example.com');

export const CreatePreviewBody = z
  .object({
    port: z.number({ message: 'must be an integer' }).int('must be an integer').min(1, 'must be 1 to 65535').max(65535, 'must be 1 to 65535'),
    domain: DomainName.optional().describe('Serve on <sandbox id>-p<port>.<domain> instead of PREVIEW_DOMAIN (point a wildcard DNS record at this server)'),
    authConfig: z
      .object({
        type: z.literal('bearer').optional(),
        token: z.string().min(16, 'must be at least 16 characters').max(512).optional(),
      })
      .strict()
      .optional()
      .describe('{} or absent: public. { "type": "bearer" }: a token is generated and returned once; or bring your own "token" (≥ 16 chars).'),
  })
  .strict()
  .openapi('CreatePreviewURL');

export const Preview = z
  .object({
    id: z.string(),
    sandboxId: z.string(),
    orgId: z.string(),
    hostname: z.string(),
    customHostname: z.string().optional(),
    port: z.number().int(),
    sslStatus: z
      .enum(['none', 'active'])
      .describe('none: served over plain HTTP by this server; active: a TLS-terminating front (PREVIEW_TLS=true) serves *.PREVIEW_DOMAIN over HTTPS'),
    authConfig: z.object({ type: z.literal('bearer').optional(), token: z.string().optional() }).describe('The token appears once, in the create response'),
    createdAt: z.string(),
  })
  .openapi('PreviewURL');
