import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import type { PreviewDoc } from '../../services/previews';
import { sandboxServicesOf } from '../../services/sandbox-services';
import { SandboxParams } from '../sandbox-schemas';

const Port = z.coerce.number().int('must be an integer').min(1, 'must be 1 to 65535').max(65535, 'must be 1 to 65535');
const DomainName = z
  .string()
  .toLowerCase()
  .max(200)
  .regex(/^(?=.{1,200}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+$/, 'must be a domain name such as preview.example.com');

const CreatePreviewBody = z
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

const Preview = z
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

/** The public form of a preview; `token` only right after creation. */
function previewView(deps: ApiDeps, p: PreviewDoc, token?: string): z.infer<typeof Preview> {
  return {
    id: p.id,
    sandboxId: p.sandboxId,
    orgId: p.orgId,
    hostname: p.hostname,
    ...(p.domain ? { customHostname: p.hostname } : {}),
    port: p.port,
    sslStatus: deps.cfg.PREVIEW_TLS && !p.domain ? 'active' : 'none',
    authConfig: p.auth ? { type: 'bearer', ...(token ? { token } : {}) } : {},
    createdAt: p.createdAt.toISOString(),
  };
}

/** /api/sandboxes/:id/preview: expose a sandbox port at a hostname (served by the preview proxy). */
export function registerPreviewRoutes(t: RouteTable, deps: ApiDeps): void {
  const { previews, sandboxes } = sandboxServicesOf(deps);

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/preview',
    tag: 'previews',
    summary: 'Expose a sandbox port at <sandbox id>-p<port>.<PREVIEW_DOMAIN or domain>',
    params: SandboxParams,
    body: CreatePreviewBody,
    responses: { 201: { description: 'The preview URL (with the bearer token, once)', schema: Preview } },
    errors: [409, 502],
    handler: async ({ params, body, org, res }) => {
      const { doc, token } = await previews.create(await sandboxes.get(org.id, params.id), body);
      res.status(201).json(previewView(deps, doc, token));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/preview',
    tag: 'previews',
    summary: "The sandbox's preview URLs, by port (a JSON array; tokens are never shown again)",
    params: SandboxParams,
    responses: { 200: { description: 'The preview URLs', schema: z.array(Preview) } },
    handler: async ({ params, org, res }) => {
      res.json((await previews.list(await sandboxes.get(org.id, params.id))).map((p) => previewView(deps, p)));
    },
  });

  t.add({
    method: 'delete',
    path: '/api/sandboxes/:id/preview/:port',
    tag: 'previews',
    summary: 'Remove the preview URLs of a port; its hostname answers 404 from then on',
    params: SandboxParams.extend({ port: Port }),
    responses: { 204: { description: 'Deleted' } },
    handler: async ({ params, org, res }) => {
      await previews.removePort(await sandboxes.get(org.id, params.id), params.port);
      res.status(204).end();
    },
  });
}
