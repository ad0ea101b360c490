import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import { sandboxServicesOf } from '../../services/sandbox-services';
import { KillBody, SandboxParams } from '../sandbox-schemas';

/*
 * Sandbox agent sessions: an agent runner started inside the sandbox as an exec session, speaking
 * JSON lines (see sandbox/runners/agent.ts). Clients attach with the exec WebSocket at
 * /api/sandboxes/{id}/exec/{as-…}. The runner is /opt/sap/agent.cjs, which the API writes into the
 * sandbox: by default it runs the Claude Agent SDK; AGENT_RUNNER (a JSON argv array, or a command
 * line split on spaces) or the request's `runner` runs another program through it instead.
 */

const McpServer = z
  .object({
    command: z.string().min(1).max(4096).optional(),
    args: z.array(z.string().max(32768)).max(256).optional(),
    env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name'), z.string().max(32768)).optional(),
    type: z.enum(['stdio', 'http', 'sse']).optional(),
    url: z.url().max(4096).optional(),
    headers: z.record(z.string().max(256), z.string().max(8192)).optional(),
  })
  .refine((s) => Boolean(s.command) !== Boolean(s.url), { message: 'needs exactly one of command (stdio) or url (http, sse)' });

export const CreateAgentBody = z
  .object({
    prompt: z
      .string()
      .max(1024 * 1024)
      .optional(),
    model: z.string().min(1).max(200).optional(),
    systemPrompt: z
      .string()
      .max(1024 * 1024)
      .optional(),
    allowedTools: z.array(z.string().min(1).max(200)).max(500).optional(),
    permissionMode: z.enum(['default', 'acceptEdits', 'bypassPermissions', 'plan']).optional(),
    maxTurns: z.number().int().positive().max(10_000).optional(),
    cwd: z.string().startsWith('/', 'must be an absolute path').max(4096).optional(),
    mcpServers: z.record(z.string().regex(/^[\w.-]{1,64}$/, 'must be a server name (letters, digits, _ . -)'), McpServer).optional(),
    resume: z.string().min(1).max(200).optional(),
    runner: z
      .array(z.string().max(32768))
      .min(1)
      .max(256)
      .optional()
      .describe('Program (argv) to run instead of the default runner; it must speak the same JSON-lines protocol'),
  })
  .openapi('CreateSandboxAgentSession');

export const AgentSessionParams = SandboxParams.extend({
  sessionID: z.string().regex(/^as-[a-z0-9]{1,64}$/, 'must be an agent session id (as-…)'),
});

export const AgentSessionView = z
  .object({
    sessionID: z.string(),
    sandboxID: z.string(),
    running: z.boolean(),
    startedAt: z.string(),
    agentSessionID: z.string(),
    exitCode: z.number().int().nullable(),
    exitedAt: z.string().nullable(),
  })
  .openapi('SandboxAgentSession');

/** /api/sandboxes/:id/agent: start, list, read, kill. */
export function registerSandboxAgentRoutes(t: RouteTable, deps: ApiDeps): void {
  const svc = sandboxServicesOf(deps).agents;

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/agent',
    tag: 'agent',
    summary: 'Start an agent runner in the sandbox; attach with the exec WebSocket at /api/sandboxes/{id}/exec/{sessionID}',
    params: SandboxParams,
    body: CreateAgentBody,
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
