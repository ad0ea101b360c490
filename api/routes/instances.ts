import { z } from 'zod';
import { WorkflowExecutionAlreadyStartedError, WorkflowNotFoundError } from '@temporalio/client';
import { WorkflowIdReusePolicy } from '@temporalio/common';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import { AgentParams } from '../../contract/schemas';
import { ApiError, invalid, notFound } from '../../lib/errors';
import { randomId } from '../../lib/ids';
import { fromJsonText, runSpecOf } from '../../store';
import { InstanceDoc, instancesOf, metaPairsOf } from '../../store/instances';
import { destroyInstanceSignal, type InstanceWorkflowArgs } from '../../workflows/instance';
import { AGENT_ID, ORG_ID } from '../../workflows/search-attributes';
import { getAgent } from './agents';
import { snapshotRefOf } from './snapshots';

const InstanceId = z.string().regex(/^inst_[a-z0-9]{1,64}$/, 'must be an instance id (inst_…)');
const InstanceParams = AgentParams.extend({ id: InstanceId });
const StatusEnum = z.enum(['creating', 'running', 'failed', 'stopped']);

export const InstanceView = z
  .object({
    id: z.string(),
    agent_id: z.string(),
    status: StatusEnum,
    metadata: z.record(z.string(), z.unknown()),
    sandbox_id: z.string().nullable(),
    snapshot_id: z.string().nullable(),
    error: z.string().nullable(),
    created_at: z.string(),
    updated_at: z.string(),
  })
  .openapi('Instance');

/** The public form of an instance (2.2), plus its sandbox, snapshot and failure reason. */
export function instanceView(i: InstanceDoc): z.infer<typeof InstanceView> {
  return {
    id: i._id,
    agent_id: i.agent_id,
    status: i.status,
    metadata: fromJsonText(i.metadata) ?? {},
    sandbox_id: i.sandbox_id,
    snapshot_id: i.snapshot_id,
    error: i.error,
    created_at: i.created_at.toISOString(),
    updated_at: i.updated_at.toISOString(),
  };
}

async function getInstance(deps: ApiDeps, orgId: string, agentId: string, id: string): Promise<InstanceDoc> {
  const doc = await instancesOf(deps.store).findOne({ _id: id });
  if (!doc || doc.orgId !== orgId || doc.agent_id !== agentId) throw notFound(`instance ${id}`);
  return doc;
}

/** /v1/agents/{agentId}/instances: create (provisioned in the background by `inst_<id>`), list, read, destroy. */
export function registerInstanceRoutes(t: RouteTable, deps: ApiDeps): void {
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
      const agent = await getAgent(deps, org.id, params.agentId);
      const run = runSpecOf(agent, deps.secrets);
      if (agent.snapshot) run.snapshotRef = await snapshotRefOf(deps, org.id, agent.snapshot);
      const now = new Date();
      const doc: InstanceDoc = {
        _id: `inst_${randomId()}`,
        orgId: org.id,
        agent_id: agent.id,
        status: 'creating',
        metadata: JSON.stringify(body.metadata),
        metaPairs: metaPairsOf(body.metadata),
        sandbox_id: null,
        snapshot_id: run.snapshotRef?.snapshotId ?? null,
        error: null,
        created_at: now,
        updated_at: now,
      };
      await instancesOf(deps.store).insertOne(doc);
      const args: InstanceWorkflowArgs = { instanceId: doc._id, orgId: org.id, agentId: agent.id, run };
      try {
        await deps.temporal.workflow.start('instanceWorkflow', {
          taskQueue: deps.cfg.TASK_QUEUE,
          workflowId: doc._id,
          args: [args],
          workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
          typedSearchAttributes: [
            { key: AGENT_ID, value: agent.id },
            { key: ORG_ID, value: org.id },
          ],
        });
      } catch (err) {
        if (!(err instanceof WorkflowExecutionAlreadyStartedError)) {
          await instancesOf(deps.store).deleteOne({ _id: doc._id });
          throw new ApiError('unavailable', `could not start the instance workflow: ${(err as Error).message}`);
        }
      }
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
      await getAgent(deps, org.id, params.agentId);
      const pairs: string[] = [];
      for (const [k, v] of Object.entries(query)) {
        if (k === 'status' || k === 'limit') continue;
        const m = /^metadata\.(.{1,256})$/.exec(k);
        if (!m) throw invalid(`query.${k}: unknown parameter (filter metadata with metadata.<key>=<value>)`);
        pairs.push(`${m[1]}=${String(v)}`);
      }
      const filter: Record<string, unknown> = { orgId: org.id, agent_id: params.agentId };
      if (pairs.length) filter.metaPairs = { $all: pairs };
      if (query.status) filter.status = query.status;
      const docs = await instancesOf(deps.store).find(filter).sort({ created_at: -1, _id: -1 }).limit(query.limit).toArray();
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
      res.json(instanceView(await getInstance(deps, org.id, params.agentId, params.id)));
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
      const doc = await getInstance(deps, org.id, params.agentId, params.id);
      if (doc.status === 'stopped' || doc.status === 'failed') {
        res.json(instanceView(doc));
        return;
      }
      const handle = deps.temporal.workflow.getHandle(doc._id);
      try {
        await handle.signal(destroyInstanceSignal);
        await Promise.race([handle.result().catch(() => undefined), new Promise((r) => setTimeout(r, 15_000).unref())]);
      } catch (err) {
        if (!(err instanceof WorkflowNotFoundError)) throw err;
        // Its workflow has ended (or never started): nothing owns a sandbox any more.
        await instancesOf(deps.store).updateOne({ _id: doc._id }, { $set: { status: 'stopped', updated_at: new Date() } });
      }
      res.json(instanceView((await instancesOf(deps.store).findOne({ _id: doc._id })) ?? doc));
    },
  });
}
