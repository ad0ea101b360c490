import { z } from 'zod';
import type { RouteTable } from '../http';
import { Agent, AgentParams, CreateAgentBody, Cursor, Limit, UpdateAgentBody } from '../../contract/schemas';
import type { AgentService } from '../../services/agents/agents';
import { agentView } from '../../services/views';

/** /v1/agents: create, list, read, update, delete. */
export function registerAgentRoutes(t: RouteTable, agents: AgentService): void {
  t.add({
    method: 'post',
    path: '/v1/agents',
    tag: 'agents',
    summary: 'Register an agent',
    body: CreateAgentBody,
    responses: { 201: { description: 'The agent', schema: Agent } },
    errors: [409],
    handler: async ({ body, org, res }) => {
      const doc = await agents.create(org.id, body);
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
      const { page, next_cursor } = await agents.list(org.id, query.limit, query.cursor);
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
      res.json(agentView(await agents.get(org.id, params.agentId)));
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
      const updated = await agents.update(org.id, params.agentId, body);
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
      const agent = await agents.remove(org.id, params.agentId);
      res.json(agentView(agent));
    },
  });
}
