import { randomBytes } from 'node:crypto';
import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import { ApiError, conflict, invalid, notFound } from '../../lib/errors';
import { hashSecret, randomId } from '../../lib/ids';
import { isDuplicateKey } from '../../store';
import { listSandboxPreviews, previewsOf, type PreviewDoc } from '../../store/previews';
import { previewProxyOf, hostnameOf } from '../preview-proxy';
export { deleteSandboxPreviews } from '../preview-proxy';
import { getOrgSandbox, SandboxParams } from './sandboxes';

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
    sslStatus: z.enum(['none', 'active']).describe('none: served over plain HTTP by this server; active: a TLS-terminating front (PREVIEW_TLS=true) serves *.PREVIEW_DOMAIN over HTTPS'),
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
  const proxy = previewProxyOf(deps);

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
      const sandbox = await getOrgSandbox(deps, org.id, params.id);
      if (sandbox.status !== 'running') throw conflict(`sandbox ${sandbox._id} is ${sandbox.status}`);
      if (body.authConfig?.token && !body.authConfig.type) throw invalid('body.authConfig.type: must be "bearer" when a token is given');
      const bearer = body.authConfig?.type === 'bearer';
      const token = bearer ? (body.authConfig?.token ?? `pvt_${randomBytes(32).toString('base64url')}`) : undefined;
      const base = body.domain ?? deps.cfg.PREVIEW_DOMAIN;
      const hostname = `${sandbox._id}-p${body.port}.${base}`;
      const doc: PreviewDoc = {
        _id: hostnameOf(hostname),
        id: `pv-${randomId()}`,
        orgId: org.id,
        sandboxId: sandbox._id,
        hostId: sandbox.hostId,
        port: body.port,
        domain: body.domain ?? null,
        hostname,
        auth: token ? { type: 'bearer', tokenHash: hashSecret(token) } : null,
        createdAt: new Date(),
      };
      // The port becomes reachable only now: open its forwarder first, so a failure leaves no record.
      const host = await deps.hosts.get(sandbox.hostId);
      let forward: { socketPath: string; machine?: string };
      try {
        forward = await host.portForward(sandbox._id, body.port);
      } catch (err) {
        const e = err as { type?: string; message?: string };
        if (e.type === 'not_found' || e.type === 'conflict') throw conflict(`sandbox ${sandbox._id} is not running`);
        throw new ApiError('bad_gateway', `could not open the port on the sandbox host: ${e.message ?? String(err)}`);
      }
      try {
        await previewsOf(deps.store).insertOne(doc);
      } catch (err) {
        if (isDuplicateKey(err)) throw conflict(`port ${body.port} already has a preview at ${hostname}; delete it first`);
        throw err;
      }
      proxy.rememberSocket(sandbox._id, body.port, forward.socketPath, forward.machine, host);
      proxy.invalidate(doc._id);
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
      const sandbox = await getOrgSandbox(deps, org.id, params.id);
      res.json((await listSandboxPreviews(deps.store, sandbox._id)).map((p) => previewView(deps, p)));
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
      const sandbox = await getOrgSandbox(deps, org.id, params.id);
      const docs = (await listSandboxPreviews(deps.store, sandbox._id)).filter((p) => p.port === params.port);
      if (docs.length === 0) throw notFound(`preview of port ${params.port} on sandbox ${sandbox._id}`);
      for (const d of docs) {
        await previewsOf(deps.store).deleteOne({ _id: d._id });
        proxy.invalidate(d._id);
      }
      proxy.forgetSocket(sandbox._id, params.port);
      // Close the port's forwarder so nothing reaches it any more; the sandbox may already be gone.
      if (sandbox.status === 'running') {
        await deps.hosts
          .get(sandbox.hostId)
          .then((h) => h.closePortForward(sandbox._id, params.port))
          .catch((err: Error) => deps.logger.warn({ err, sandboxId: sandbox._id }, 'could not close the forwarded port'));
      }
      res.status(204).end();
    },
  });
}
