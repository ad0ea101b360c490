import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import { ApiError } from '../../contract/errors';
import { networkSchema } from '../../contract/network';
import { AllowedHostsView, CreateSandboxBody, SandboxMetricsView, SandboxParams, SandboxView, ScaleBody, ScaleView } from '../../contract/sandboxes';
import { sandboxView } from '../../services/views';
import { sseIfAsked } from '../sse';
import type { SandboxServices } from '../../services/sandboxes/sandbox-services';
import { sealedHostsOfStore } from '../../services/orgs/secret-stores';
import { IdleTimeoutSeconds } from '../../contract/sandboxes';

/** /api/sandboxes: create, list, read, kill (the OpenComputer API's shapes). */
export function registerSandboxRoutes(t: RouteTable, deps: ApiDeps, sandbox: SandboxServices): void {
  const svc = sandbox.sandboxes;
  t.add({
    method: 'post',
    path: '/api/sandboxes',
    tag: 'sandboxes',
    summary: 'Create a sandbox from the base image',
    body: CreateSandboxBody,
    responses: { 201: { description: 'The running sandbox', schema: SandboxView } },
    errors: [503, 507],
    handler: async ({ body, org, req, res }) => {
      svc.check(body);
      const stream = body.image ? sseIfAsked(req, res) : null;
      if (!stream) {
        res.status(201).json(sandboxView(deps, await svc.create(org.id, body)));
        return;
      }
      // The answer has begun (200, text/event-stream): failures become an error event.
      try {
        const doc = await svc.create(org.id, body, (e) => stream.send('build_log', e));
        stream.send('result', sandboxView(deps, doc));
      } catch (err) {
        stream.send('error', { error: (err as Error).message, type: err instanceof ApiError ? err.type : 'internal' });
      } finally {
        stream.end();
      }
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes',
    tag: 'sandboxes',
    summary: "List the organisation's running and hibernated sandboxes",
    responses: { 200: { description: 'Sandboxes, newest first', schema: z.array(SandboxView) } },
    handler: async ({ org, res }) => {
      res.json((await svc.list(org.id)).map((d) => sandboxView(deps, d)));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id',
    tag: 'sandboxes',
    summary: 'Get a sandbox',
    params: SandboxParams,
    responses: { 200: { description: 'The sandbox', schema: SandboxView } },
    handler: async ({ params, org, res }) => {
      res.json(sandboxView(deps, await svc.get(org.id, params.id)));
    },
  });

  t.add({
    method: 'put',
    path: '/api/sandboxes/:id/network',
    tag: 'sandboxes',
    summary: "Change a running sandbox's egress policy; it takes effect at once",
    params: SandboxParams,
    body: networkSchema(z),
    responses: { 200: { description: 'The sandbox with its new policy', schema: SandboxView } },
    errors: [409, 503],
    handler: async ({ params, body, org, res }) => {
      res.json(sandboxView(deps, await svc.setNetwork(org.id, params.id, body)));
    },
  });

  const resources = sandbox.resources;
  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/metrics',
    tag: 'sandboxes',
    summary: "A running sandbox's resource use now: CPU, memory, disk, network, processes (E2B's getMetrics fields too)",
    params: SandboxParams,
    responses: { 200: { description: 'Its metrics', schema: SandboxMetricsView } },
    errors: [409, 503],
    handler: async ({ params, org, res }) => {
      res.json(await resources.metrics(org.id, params.id));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/scale',
    tag: 'sandboxes',
    summary: "Resize a running sandbox's memory and CPU limits at once (OpenComputer's Sandbox.scale), within the operator's maxima and its host's room",
    params: SandboxParams,
    body: ScaleBody,
    responses: { 200: { description: 'The limits in force', schema: ScaleView } },
    errors: [409, 503],
    handler: async ({ params, body, org, res }) => {
      res.json(await resources.scale(org.id, params.id, body));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/allowed-hosts',
    tag: 'sandboxes',
    summary: "What the sandbox may reach (OpenComputer's getAllowedHosts)",
    params: SandboxParams,
    responses: { 200: { description: 'Its allow list and policy', schema: AllowedHostsView } },
    handler: async ({ params, org, res }) => {
      const doc = await svc.get(org.id, params.id);
      const network = doc.network ?? { egress: 'internet' as const };
      // The store's sealed secrets as they are now (a sandbox keeps the hosts it was created with).
      const sealed = await sealedHostsOfStore(deps, org.id, doc.secretStore);
      res.json({
        sandboxID: doc._id,
        ...(doc.secretStore ? { secretStore: doc.secretStore } : {}),
        egressAllowlist: typeof network.egress === 'object' ? network.egress.allow : [],
        perSecretAllowedHosts: sealed.perSecret,
        network,
      });
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/hibernate',
    tag: 'sandboxes',
    summary: 'Hibernate: save its files (its writable layer) and end its processes, releasing memory and cgroups; wake brings it back',
    params: SandboxParams,
    responses: { 200: { description: 'The sandbox, now hibernated', schema: SandboxView } },
    errors: [409, 503],
    handler: async ({ params, org, res }) => {
      res.json(sandboxView(deps, await svc.hibernate(org.id, params.id)));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/wake',
    tag: 'sandboxes',
    summary:
      "Wake a hibernated sandbox: same id, files, env, limits, network policy, metadata and previews; its checkpoint's on_wake patches run first, in sequence order",
    params: SandboxParams,
    body: z
      .object({
        timeout: IdleTimeoutSeconds.optional().describe('A new idle timeout in seconds (0 = none)'),
      })
      .passthrough(),
    responses: { 200: { description: 'The running sandbox', schema: SandboxView } },
    errors: [409, 503],
    handler: async ({ params, body, org, res }) => {
      res.json(sandboxView(deps, await svc.wake(org.id, params.id, body.timeout)));
    },
  });

  for (const [call, path] of [
    ['reboot', 'reboot'],
    ['powerCycle', 'power-cycle'],
  ] as const) {
    t.add({
      method: 'post',
      path: `/api/sandboxes/:id/${path}`,
      tag: 'sandboxes',
      summary: `${call === 'reboot' ? 'Reboot' : 'Power-cycle'}: every process of the sandbox ends and it starts again with the same id, files, env and previews (a hibernate and a wake, without patches)`,
      params: SandboxParams,
      responses: { 200: { description: 'The running sandbox', schema: SandboxView } },
      errors: [409, 503],
      handler: async ({ params, org, res }) => {
        res.json(sandboxView(deps, await svc.restart(org.id, params.id)));
      },
    });
  }

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/timeout',
    tag: 'sandboxes',
    summary: 'Set the idle timeout in seconds (0 = none), counted from now',
    params: SandboxParams,
    body: z
      .object({
        timeout: IdleTimeoutSeconds,
      })
      .strict(),
    responses: { 200: { description: 'The sandbox', schema: SandboxView } },
    errors: [409],
    handler: async ({ params, body, org, res }) => {
      res.json(sandboxView(deps, await svc.setIdleTimeout(org.id, params.id, body.timeout)));
    },
  });

  t.add({
    method: 'delete',
    path: '/api/sandboxes/:id',
    tag: 'sandboxes',
    summary: "Kill a sandbox: its processes are killed and its files removed (a hibernated one's saved files too)",
    params: SandboxParams,
    query: z.object({
      deleteSecretStore: z
        .enum(['true', 'false'])
        .optional()
        .describe('true: also delete the secret store it was created with (409, and nothing killed, while an agent names that store)'),
    }),
    responses: { 200: { description: 'The sandbox, now stopped', schema: SandboxView } },
    errors: [409],
    handler: async ({ params, query, org, res }) => {
      res.json(sandboxView(deps, await svc.kill(org.id, params.id, query.deleteSecretStore === 'true')));
    },
  });
}
