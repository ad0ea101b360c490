import { z } from 'zod';
import type { RouteTable } from '../http';
import { AgentParams } from '../../contract/schemas';
import type { InstanceService } from '../../services/instances/instances';
import { instanceView } from '../../services/views';
import { InstanceParams, StatusEnum, InstanceView } from '../../contract/instances';

/** /v1/agents/{agentId}/instances: create (provisioned in the background by `inst_<id>`), list, read, destroy. */
export function registerInstanceRoutes(t: RouteTable, instances: InstanceService): void {
  t.add({
    method: 'post',
    path: '/v1/agents/:agentId/instances',
    tag: 'instances',
    summary: "Create an instance: a persistent sandbox of the agent, provisioned in the background (from the agent's snapshot, patches applied)",
    params: AgentParams,
    body: z.object({ metadata: z.record(z.string().min(1).max(256), z.unknown()).default({}) }),
    responses: { 201: { description: 'The instance, status creating', schema: InstanceView } },
    errors: [503],
    handler: async ({ params, body, org, res }) => {
      const doc = await instances.create(org.id, params.agentId, body.metadata);
      res.status(201).json(instanceView(doc));
    },
  });

  t.add({
    method: 'get',
    path: '/v1/agents/:agentId/instances',
    tag: 'instances',
    summary:
      "List the agent's instances, newest first. Filter by metadata with `metadata.<key>=<value>` (e.g. `?metadata.userId=42`; all must match; " +
      'values compare as strings) and by `status`.',
    params: AgentParams,
    query: z.object({ status: StatusEnum.optional(), limit: z.coerce.number().int().min(1).max(1000).default(100) }).catchall(z.string().max(1024)),
    responses: { 200: { description: 'Instances', schema: z.object({ instances: z.array(InstanceView) }) } },
    handler: async ({ params, query, org, res }) => {
      const { status, limit, ...filters } = query;
      const docs = await instances.list(org.id, params.agentId, { status, limit }, filters);
      res.json({ instances: docs.map(instanceView) });
    },
  });

  t.add({
    method: 'get',
    path: '/v1/agents/:agentId/instances/:id',
    tag: 'instances',
    summary: 'Get an instance',
    params: InstanceParams,
    responses: { 200: { description: 'The instance', schema: InstanceView } },
    handler: async ({ params, org, res }) => {
      res.json(instanceView(await instances.get(org.id, params.agentId, params.id)));
    },
  });

  t.add({
    method: 'delete',
    path: '/v1/agents/:agentId/instances/:id',
    tag: 'instances',
    summary: 'Destroy an instance: its workflow is signalled, destroys the sandbox and records it stopped (waits up to 15 s for that)',
    params: InstanceParams,
    responses: { 200: { description: 'The instance after it ended (status stopped, or still running if the destroy takes longer)', schema: InstanceView } },
    handler: async ({ params, org, res }) => {
      res.json(instanceView(await instances.destroy(org.id, params.agentId, params.id)));
    },
  });
}
