import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import { Agent, AgentParams, CreateAgentBody, Cursor, Limit, UpdateAgentBody } from '../../contract/schemas';
import { conflict, invalid, notFound } from '../../lib/errors';
import { overMaximum } from '../../config/limits';
import { randomId } from '../../lib/ids';
import { AgentDoc, fromJsonText, isDuplicateKey } from '../../store';
import { pageOf } from '../cursor';
import { assertSecretStoreExists } from './secret-stores';
import { assertWebhookTarget, sealWebhook, webhookView } from '../../lib/webhooks';
import { sealAgentEnv } from '../../store/agent-env';

/** The public form of an agent. Environment values are secrets: they are never returned. */
export function agentView(a: AgentDoc): z.infer<typeof Agent> {
  return {
    id: a.id,
    display_name: a.display_name,
    core: a.core,
    channels: a.channels,
    packages: a.packages,
    secret_store: a.secret_store,
    config: fromJsonText(a.config),
    entrypoint: a.entrypoint,
    files: Object.fromEntries(a.files.map((f) => [f.path, f.content])),
    env: Object.fromEntries(Object.keys(a.env ?? {}).map((k) => [k, '[set]'])),
    snapshot: a.snapshot,
    timeoutSeconds: a.timeoutSeconds,
    memoryMB: a.memoryMB ?? null,
    cpuCount: a.cpuCount ?? null,
    diskMB: a.diskMB ?? null,
    network: a.network ?? null,
    webhook: webhookView(a.webhook),
    retryOnHostLoss: a.retryOnHostLoss ?? false,
    created_at: a.created_at.toISOString(),
    updated_at: a.updated_at.toISOString(),
  };
}

export const agentKey = (orgId: string, agentId: string): string => `${orgId}/${agentId}`;

/**
 * Agents read to start sessions, kept for a short while per store: a burst of sessions of one
 * agent reads it once. This process forgets an agent as soon as it updates or deletes it; another
 * API process may start sessions with the previous definition for up to RUN_CACHE_MS.
 */
const RUN_CACHE_MS = 2000;
const runCacheByStore = new WeakMap<ApiDeps['store'], Map<string, { agent: AgentDoc; until: number }>>();

function runCacheOf(deps: ApiDeps): Map<string, { agent: AgentDoc; until: number }> {
  let m = runCacheByStore.get(deps.store);
  if (!m) runCacheByStore.set(deps.store, (m = new Map()));
  return m;
}

/** The agent a new session runs (see RUN_CACHE_MS), or throws 404. */
export async function getAgentToRun(deps: ApiDeps, orgId: string, agentId: string): Promise<AgentDoc> {
  const cache = runCacheOf(deps);
  const key = agentKey(orgId, agentId);
  const hit = cache.get(key);
  const now = Date.now();
  if (hit && hit.until > now) return hit.agent;
  const agent = await getAgent(deps, orgId, agentId);
  if (cache.size > 1000) cache.clear();
  cache.set(key, { agent, until: now + RUN_CACHE_MS });
  return agent;
}

/** Reads an agent of the caller's organisation, or throws 404. */
export async function getAgent(deps: ApiDeps, orgId: string, agentId: string): Promise<AgentDoc> {
  const agent = await deps.store.agents.findOne({ _id: agentKey(orgId, agentId) });
  if (!agent) throw notFound(`agent ${agentId}`);
  return agent;
}

/** 400 when an agent's limits exceed the operator's maxima. */
function checkLimits(deps: ApiDeps, body: { memoryMB?: number | null; cpuCount?: number | null; diskMB?: number | null }): void {
  const over = overMaximum(deps.cfg.limits, { memoryMB: body.memoryMB ?? undefined, cpuCount: body.cpuCount ?? undefined, diskMB: body.diskMB ?? undefined }, 'body.');
  if (over) throw invalid(over);
}

/** /v1/agents: create, list, read, update, delete. */
export function registerAgentRoutes(t: RouteTable, deps: ApiDeps): void {
  t.add({
    method: 'post',
    path: '/v1/agents',
    tag: 'agents',
    summary: 'Register an agent',
    body: CreateAgentBody,
    responses: { 201: { description: 'The agent', schema: Agent } },
    errors: [409],
    handler: async ({ body, org, res }) => {
      checkLimits(deps, body);
      if (body.webhook) await assertWebhookTarget(deps.cfg, body.webhook.url, 'body.webhook.url');
      await assertSecretStoreExists(deps, org.id, body.secret_store, 'body.secret_store');
      const id = body.id ?? `agt_${randomId()}`;
      const now = new Date();
      const doc: AgentDoc = {
        _id: agentKey(org.id, id),
        orgId: org.id,
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
        env: sealAgentEnv(deps.secrets, org.id, id, body.env),
        envSealed: true,
        snapshot: body.snapshot,
        timeoutSeconds: body.timeoutSeconds,
        ...(body.memoryMB !== undefined ? { memoryMB: body.memoryMB } : {}),
        ...(body.cpuCount !== undefined ? { cpuCount: body.cpuCount } : {}),
        ...(body.diskMB !== undefined ? { diskMB: body.diskMB } : {}),
        ...(body.network !== undefined ? { network: body.network } : {}),
        ...(body.retryOnHostLoss ? { retryOnHostLoss: true } : {}),
        ...(body.webhook !== undefined ? { webhook: sealWebhook(deps.secrets, org.id, body.webhook) } : {}),
        created_at: now,
        updated_at: now,
      };
      try {
        await deps.store.agents.insertOne(doc);
      } catch (err) {
        if (isDuplicateKey(err)) throw conflict(`agent ${id} already exists`);
        throw err;
      }
      res.status(201).json(agentView(doc));
    },
  });

  t.add({
    method: 'get',
    path: '/v1/agents',
    tag: 'agents',
    summary: 'List agents, newest first',
    query: z.object({ limit: Limit, cursor: Cursor.optional() }),
    responses: { 200: { description: 'A page of agents', schema: z.object({ agents: z.array(Agent), next_cursor: z.string().nullable() }) } },
    handler: async ({ query, org, res }) => {
      const { page, next_cursor } = await pageOf(deps.store.agents, { orgId: org.id }, query.limit, query.cursor);
      res.json({ agents: page.map(agentView), next_cursor });
    },
  });

  t.add({
    method: 'get',
    path: '/v1/agents/:agentId',
    tag: 'agents',
    summary: 'Get an agent',
    params: AgentParams,
    responses: { 200: { description: 'The agent', schema: Agent } },
    handler: async ({ params, org, res }) => {
      res.json(agentView(await getAgent(deps, org.id, params.agentId)));
    },
  });

  t.add({
    method: 'patch',
    path: '/v1/agents/:agentId',
    tag: 'agents',
    summary: 'Update an agent; running sessions keep the definition they started with',
    params: AgentParams,
    body: UpdateAgentBody,
    responses: { 200: { description: 'The updated agent', schema: Agent } },
    handler: async ({ params, body, org, res }) => {
      checkLimits(deps, body);
      if (body.webhook) await assertWebhookTarget(deps.cfg, body.webhook.url, 'body.webhook.url');
      if (body.secret_store !== undefined) await assertSecretStoreExists(deps, org.id, body.secret_store, 'body.secret_store');
      const _id = agentKey(org.id, params.agentId);
      runCacheOf(deps).delete(_id);
      const set: Record<string, unknown> = { updated_at: new Date() };
      for (const [k, v] of Object.entries(body)) if (v !== undefined) set[k] = v;
      if (body.config !== undefined) set.config = body.config === null ? null : JSON.stringify(body.config);
      if (body.files !== undefined) set.files = Object.entries(body.files).map(([path, content]) => ({ path, content }));
      if (body.env !== undefined) Object.assign(set, { env: sealAgentEnv(deps.secrets, org.id, params.agentId, body.env), envSealed: true });
      if (body.webhook !== undefined) set.webhook = body.webhook === null ? null : sealWebhook(deps.secrets, org.id, body.webhook);
      const updated = await deps.store.agents.findOneAndUpdate({ _id }, { $set: set }, { returnDocument: 'after' });
      runCacheOf(deps).delete(_id);
      if (!updated) throw notFound(`agent ${params.agentId}`);
      res.json(agentView(updated));
    },
  });

  t.add({
    method: 'delete',
    path: '/v1/agents/:agentId',
    tag: 'agents',
    summary: 'Delete an agent that has no running session',
    params: AgentParams,
    responses: { 200: { description: 'The deleted agent', schema: Agent } },
    errors: [409],
    handler: async ({ params, org, res }) => {
      const agent = await getAgent(deps, org.id, params.agentId);
      // Sessions, batches and instances of the agent are workflows carrying its AgentId: ask
      // Temporal's visibility for running ones rather than scanning MongoDB.
      const { count } = await deps.temporal.workflow.count(
        `AgentId = '${params.agentId}' AND OrgId = '${org.id}' AND ExecutionStatus = 'Running'`,
      );
      if (count > 0) throw conflict(`agent ${params.agentId} has ${count} running session(s) or instance(s); end them first`);
      await deps.store.agents.deleteOne({ _id: agent._id });
      runCacheOf(deps).delete(agent._id);
      res.json(agentView(agent));
    },
  });
}
