import type { z } from 'zod';
import type { CreateAgentBody, UpdateAgentBody } from '../../contract/schemas';
import { conflict, invalid, notFound } from '../../contract/errors';
import { overMaximum } from '../../config/limits';
import { randomId } from '../../lib/ids';
import { assertWebhookTarget, sealWebhook } from '../webhooks/webhook-rules';
import { isDuplicateKey, type AgentDoc } from '../../store';
import { sealAgentEnv } from '../../store/agent-env';
import { agentKey, deleteAgent, findAgent, insertAgent, listAgents, updateAgent } from '../../store/agents';
import type { ServiceDeps } from '../deps';
import type { SecretStoreService } from '../orgs/secret-stores';

export { agentKey } from '../../store/agents';

/**
 * Agents read to start sessions, kept for a short while per store: a burst of sessions of one
 * agent reads it once. This process forgets an agent as soon as it updates or deletes it; another
 * API process may start sessions with the previous definition for up to RUN_CACHE_MS.
 */
const RUN_CACHE_MS = 2000;
const runCacheByStore = new WeakMap<ServiceDeps['store'], Map<string, { agent: AgentDoc; until: number }>>();

function runCacheOf(store: ServiceDeps['store']): Map<string, { agent: AgentDoc; until: number }> {
  let m = runCacheByStore.get(store);
  if (!m) runCacheByStore.set(store, (m = new Map()));
  return m;
}

/** Reads an agent of the organisation, or throws 404. */
export async function getAgent(deps: Pick<ServiceDeps, 'store'>, orgId: string, agentId: string): Promise<AgentDoc> {
  const agent = await findAgent(deps.store, orgId, agentId);
  if (!agent) throw notFound(`agent ${agentId}`);
  return agent;
}

/** The agents of an organisation: their definitions, and the one a new session runs. */
export interface AgentService {
  /** Reads an agent, or throws 404. */
  get(orgId: string, agentId: string): Promise<AgentDoc>;
  /** The agent a new session runs (read at most once per RUN_CACHE_MS), or throws 404. */
  getToRun(orgId: string, agentId: string): Promise<AgentDoc>;
  list(orgId: string, limit: number, cursor: string | undefined): Promise<{ page: AgentDoc[]; next_cursor: string | null }>;
  /** Registers an agent; 400 over the operator's limits or for an unknown secret store, 409 when its id is taken. */
  create(orgId: string, body: z.infer<typeof CreateAgentBody>): Promise<AgentDoc>;
  /** Updates an agent (running sessions keep their definition); 404 when there is none. */
  update(orgId: string, agentId: string, body: z.infer<typeof UpdateAgentBody>): Promise<AgentDoc>;
  /** Deletes an agent that has no running workflow (409 otherwise) and returns it. */
  remove(orgId: string, agentId: string): Promise<AgentDoc>;
}

export function createAgentService(deps: ServiceDeps, secretStores: Pick<SecretStoreService, 'assertExists'>): AgentService {
  const cache = () => runCacheOf(deps.store);

  /** 400 when an agent's limits exceed the operator's maxima. */
  const checkLimits = (body: { memoryMB?: number | null; cpuCount?: number | null; diskMB?: number | null }): void => {
    const over = overMaximum(
      deps.cfg.limits,
      { memoryMB: body.memoryMB ?? undefined, cpuCount: body.cpuCount ?? undefined, diskMB: body.diskMB ?? undefined },
      'body.',
    );
    if (over) throw invalid(over);
  };

  const service: AgentService = {
    get: (orgId, agentId) => getAgent(deps, orgId, agentId),

    async getToRun(orgId, agentId) {
      const c = cache();
      const key = agentKey(orgId, agentId);
      const hit = c.get(key);
      const now = Date.now();
      if (hit && hit.until > now) return hit.agent;
      const agent = await getAgent(deps, orgId, agentId);
      if (c.size > 1000) c.clear();
      c.set(key, { agent, until: now + RUN_CACHE_MS });
      return agent;
    },

    list: (orgId, limit, cursor) => listAgents(deps.store, orgId, limit, cursor),

    async create(orgId, body) {
      checkLimits(body);
      if (body.webhook) await assertWebhookTarget(deps.cfg, body.webhook.url, 'body.webhook.url');
      await secretStores.assertExists(orgId, body.secret_store, 'body.secret_store');
      const id = body.id ?? `agt_${randomId()}`;
      const now = new Date();
      const doc: AgentDoc = {
        _id: agentKey(orgId, id),
        orgId,
        id,
        display_name: body.display_name ?? id,
        core: body.core,
        channels: body.channels,
        packages: body.packages,
        secret_store: body.secret_store,
        config: body.config === null ? null : JSON.stringify(body.config),
        entrypoint: body.entrypoint,
        files: Object.entries(body.files).map(([path, content]) => ({ path, content })),
        // Sealed: MongoDB, and the workflows that carry it, never hold a value (store/agent-env.ts).
        env: sealAgentEnv(deps.secrets, orgId, id, body.env),
        envSealed: true,
        snapshot: body.snapshot,
        timeoutSeconds: body.timeoutSeconds,
        ...(body.memoryMB !== undefined ? { memoryMB: body.memoryMB } : {}),
        ...(body.cpuCount !== undefined ? { cpuCount: body.cpuCount } : {}),
        ...(body.diskMB !== undefined ? { diskMB: body.diskMB } : {}),
        ...(body.network !== undefined ? { network: body.network } : {}),
        ...(body.user !== undefined ? { user: body.user } : {}),
        ...(body.retryOnHostLoss ? { retryOnHostLoss: true } : {}),
        ...(body.webhook !== undefined ? { webhook: sealWebhook(deps.secrets, orgId, body.webhook) } : {}),
        created_at: now,
        updated_at: now,
      };
      try {
        await insertAgent(deps.store, doc);
      } catch (err) {
        if (isDuplicateKey(err)) throw conflict(`agent ${id} already exists`);
        throw err;
      }
      return doc;
    },

    async update(orgId, agentId, body) {
      checkLimits(body);
      if (body.webhook) await assertWebhookTarget(deps.cfg, body.webhook.url, 'body.webhook.url');
      if (body.secret_store !== undefined) await secretStores.assertExists(orgId, body.secret_store, 'body.secret_store');
      const _id = agentKey(orgId, agentId);
      cache().delete(_id);
      const set: Record<string, unknown> = { updated_at: new Date() };
      for (const [k, v] of Object.entries(body)) if (v !== undefined) set[k] = v;
      if (body.config !== undefined) set.config = body.config === null ? null : JSON.stringify(body.config);
      if (body.files !== undefined) set.files = Object.entries(body.files).map(([path, content]) => ({ path, content }));
      if (body.env !== undefined) Object.assign(set, { env: sealAgentEnv(deps.secrets, orgId, agentId, body.env), envSealed: true });
      if (body.webhook !== undefined) set.webhook = body.webhook === null ? null : sealWebhook(deps.secrets, orgId, body.webhook);
      const updated = await updateAgent(deps.store, _id, set);
      cache().delete(_id);
      if (!updated) throw notFound(`agent ${agentId}`);
      return updated;
    },

    async remove(orgId, agentId) {
      const agent = await getAgent(deps, orgId, agentId);
      // Sessions, batches and instances of the agent are workflows carrying its AgentId: ask
      // Temporal's visibility for running ones rather than scanning MongoDB.
      const { count } = await deps.temporal.workflow.count(`AgentId = '${agentId}' AND OrgId = '${orgId}' AND ExecutionStatus = 'Running'`);
      if (count > 0) throw conflict(`agent ${agentId} has ${count} running session(s) or instance(s); end them first`);
      await deleteAgent(deps.store, agent);
      cache().delete(agent._id);
      return agent;
    },
  };
  return service;
}
