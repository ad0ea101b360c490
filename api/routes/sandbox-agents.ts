import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import type { SandboxServices } from '../../services/sandboxes/sandbox-services';
import { KillBody, SandboxParams } from '../../contract/sandboxes';
import { CreateAgentSessionBody, AgentSessionParams, AgentSessionView } from '../../contract/exec';

/*
 * Sandbox agent sessions: an agent runner started inside the sandbox as an exec session, speaking
 * JSON lines (see sandbox/runners/agent.ts). Clients attach with the exec WebSocket at
 * /api/sandboxes/{id}/exec/{as-…}. The runner is /opt/sap/agent.cjs, which the API writes into the
 * sandbox: by default it runs the Claude Agent SDK; AGENT_RUNNER (a JSON argv array, or a command
 * line split on spaces) or the request's `runner` runs another program through it instead.
 */

/** /api/sandboxes/:id/agent: start, list, read, kill. */
export function registerSandboxAgentRoutes(t: RouteTable, deps: ApiDeps, sandbox: SandboxServices): void {
  const svc = sandbox.agents;

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/agent',
    tag: 'agent',
    summary: 'Start an agent runner in the sandbox; attach with the exec WebSocket at /api/sandboxes/{id}/exec/{sessionID}',
    params: SandboxParams,
    body: CreateAgentSessionBody,
    responses: { 201: { description: 'The running agent session', schema: AgentSessionView } },
    errors: [409, 502, 503],
    handler: async ({ params, body, org, res }) => {
      res.status(201).json(await svc.start(org.id, params.id, body));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/agent',
    tag: 'agent',
    summary: "List the sandbox's agent sessions, newest first",
    params: SandboxParams,
    responses: { 200: { description: 'Agent sessions', schema: z.array(AgentSessionView) } },
    handler: async ({ params, org, res }) => {
      res.json(await svc.list(org.id, params.id));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/agent/:sessionID',
    tag: 'agent',
    summary: 'Get an agent session',
    params: AgentSessionParams,
    responses: { 200: { description: 'The agent session', schema: AgentSessionView } },
    handler: async ({ params, org, res }) => {
      res.json(await svc.get(org.id, params.id, params.sessionID));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/agent/:sessionID/kill',
    tag: 'agent',
    summary: "Signal an agent session's runner (default SIGKILL); answers once it exited (or after 2 s)",
    params: AgentSessionParams,
    body: KillBody,
    responses: { 200: { description: 'The agent session', schema: AgentSessionView } },
    handler: async ({ params, body, org, res }) => {
      res.json(await svc.kill(org.id, params.id, params.sessionID, body.signal));
    },
  });
}
