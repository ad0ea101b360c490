import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import type { PreviewDoc } from '../../services/sandboxes/previews';
import type { SandboxServices } from '../../services/sandboxes/sandbox-services';
import { SandboxParams } from '../../contract/sandboxes';
import { Port, CreatePreviewBody, Preview } from '../../contract/previews';

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
export function registerPreviewRoutes(t: RouteTable, deps: ApiDeps, sandbox: SandboxServices): void {
  const { previews, sandboxes } = sandbox;

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
