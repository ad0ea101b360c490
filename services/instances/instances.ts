import { ApiError, invalid, notFound } from '../../contract/errors';
import { randomId } from '../../lib/ids';
import { runSpecOf } from '../sessions/run-spec';
import {
  deleteInstance,
  findInstance,
  insertInstance,
  listInstances,
  markInstanceStopped,
  metaPairsOf,
  type InstanceDoc,
  type InstanceStatus,
} from '../../store/instances';
import { snapshotRefOf } from '../checkpoints/snapshots';
import { AGENT_ID, ORG_ID, destroyInstanceSignal, type InstanceWorkflowArgs } from '../../workflows/defs';
import type { AgentService } from '../agents/agents';
import type { ServiceDeps } from '../deps';
import { endWorkflowAndWait, startWorkflowOnce } from '../workflow-control';

/** Instances: persistent sandboxes of an agent, each owned by a long-running workflow. */
export interface InstanceService {
  /** Creates an instance and starts its workflow, which provisions the sandbox in the background. */
  create(orgId: string, agentId: string, metadata: Record<string, unknown>): Promise<InstanceDoc>;
  /**
   * An agent's instances, newest first; `filters` are the query's other parameters, each
   * `metadata.<key>` (400 for anything else), all of which must match.
   */
  list(orgId: string, agentId: string, q: { status?: InstanceStatus; limit: number }, filters: Record<string, string>): Promise<InstanceDoc[]>;
  /** Reads an instance of the organisation and agent, or throws 404. */
  get(orgId: string, agentId: string, id: string): Promise<InstanceDoc>;
  /** Signals the instance's workflow to destroy its sandbox, waits up to 15 s, and returns it as it is then. */
  destroy(orgId: string, agentId: string, id: string): Promise<InstanceDoc>;
}

export function createInstanceService(deps: ServiceDeps, agents: Pick<AgentService, 'get'>): InstanceService {
  const get = async (orgId: string, agentId: string, id: string): Promise<InstanceDoc> => {
    const doc = await findInstance(deps.store, id);
    if (!doc || doc.orgId !== orgId || doc.agent_id !== agentId) throw notFound(`instance ${id}`);
    return doc;
  };
  return {
    async create(orgId, agentId, metadata) {
      const agent = await agents.get(orgId, agentId);
      const run = runSpecOf(agent, deps.secrets);
      if (agent.snapshot) run.snapshotRef = await snapshotRefOf(deps, orgId, agent.snapshot);
      const now = new Date();
      const doc: InstanceDoc = {
        _id: `inst_${randomId()}`,
        orgId,
        agent_id: agent.id,
        status: 'creating',
        metadata: JSON.stringify(metadata),
        metaPairs: metaPairsOf(metadata),
        sandbox_id: null,
        snapshot_id: run.snapshotRef?.snapshotId ?? null,
        error: null,
        created_at: now,
        updated_at: now,
      };
      await insertInstance(deps.store, doc);
      const args: InstanceWorkflowArgs = { instanceId: doc._id, orgId, agentId: agent.id, run };
      try {
        await startWorkflowOnce(deps.temporal, 'instanceWorkflow', {
          taskQueue: deps.cfg.TASK_QUEUE,
          workflowId: doc._id,
          args: [args],
          typedSearchAttributes: [
            { key: AGENT_ID, value: agent.id },
            { key: ORG_ID, value: orgId },
          ],
        });
      } catch (err) {
        await deleteInstance(deps.store, doc._id);
        throw new ApiError('unavailable', `could not start the instance workflow: ${(err as Error).message}`);
      }
      return doc;
    },

    async list(orgId, agentId, q, filters) {
      await agents.get(orgId, agentId);
      const pairs: string[] = [];
      for (const [k, v] of Object.entries(filters)) {
        const m = /^metadata\.(.{1,256})$/.exec(k);
        if (!m) throw invalid(`query.${k}: unknown parameter (filter metadata with metadata.<key>=<value>)`);
        pairs.push(`${m[1]}=${String(v)}`);
      }
      const filter: Record<string, unknown> = { orgId, agent_id: agentId };
      if (pairs.length) filter.metaPairs = { $all: pairs };
      if (q.status) filter.status = q.status;
      return listInstances(deps.store, filter, q.limit);
    },

    get,

    async destroy(orgId, agentId, id) {
      const doc = await get(orgId, agentId, id);
      if (doc.status === 'stopped' || doc.status === 'failed') return doc;
      const found = await endWorkflowAndWait(deps.temporal, doc._id, (h) => h.signal(destroyInstanceSignal));
      // Its workflow has ended (or never started): nothing owns a sandbox any more.
      if (!found) await markInstanceStopped(deps.store, doc._id);
      return (await findInstance(deps.store, doc._id)) ?? doc;
    },
  };
}
