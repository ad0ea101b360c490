import { readFileSync } from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import '../http';
import { notFound } from '../../lib/errors';
import { randomId } from '../../lib/ids';
import type { HostClient } from '../../sandbox';
import type { ExecSessionInfo } from '../../sandbox';
import { AgentSessionDoc, agentSessionsOf } from '../../store/exec';
import { fromHostError, KillBody, killAndWait, liveExec, liveExecsOf, liveFields, noteExit, rememberTarget, sandboxHost, signalName } from './exec';
import { SandboxParams } from './sandboxes';

/*
 * Sandbox agent sessions: an agent runner started inside the sandbox as an exec session, speaking
 * JSON lines (see sandbox/runners/agent.ts). Clients attach with the exec WebSocket at
 * /api/sandboxes/{id}/exec/{as-…}. The runner is /opt/sap/agent.cjs, which the API writes into the
 * sandbox: by default it runs the Claude Agent SDK; AGENT_RUNNER (a JSON argv array, or a command
 * line split on spaces) or the request's `runner` runs another program through it instead.
 */

const RUNNER_PATH = '/opt/sap/agent.cjs';
const STATE_DIR = '/opt/sap/state';

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
    prompt: z.string().max(1024 * 1024).optional(),
    model: z.string().min(1).max(200).optional(),
    systemPrompt: z.string().max(1024 * 1024).optional(),
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

type View = z.infer<typeof AgentSessionView>;

/** AGENT_RUNNER as argv: a JSON array of strings, or a command line split on white space. */
export function parseRunnerSetting(value: string | undefined): string[] | undefined {
  const v = value?.trim();
  if (!v) return undefined;
  if (v.startsWith('[')) {
    const parsed = z.array(z.string()).min(1).safeParse(JSON.parse(v));
    if (!parsed.success) throw new Error('AGENT_RUNNER: must be a JSON array of strings or a command line');
    return parsed.data;
  }
  return v.split(/\s+/);
}

let runnerSource: Buffer | undefined;
/** The compiled runner (dist/sandbox/runners/agent.js), read once. */
function runnerFile(): Buffer {
  runnerSource ??= readFileSync(path.join(__dirname, '..', '..', 'sandbox', 'runners', 'agent.js'));
  return runnerSource;
}

async function readAgentSessionId(host: HostClient, doc: AgentSessionDoc): Promise<string> {
  try {
    const buf = await host.readFile(doc.sandboxId, doc.stateFile, { maxBytes: 4096 });
    if (!buf) return '';
    const id = (JSON.parse(buf.toString('utf8')) as { agentSessionID?: unknown }).agentSessionID;
    return typeof id === 'string' ? id : '';
  } catch {
    return '';
  }
}

/** The public view, with the live fields from the host and the agent SDK's session id once known. */
async function agentView(deps: ApiDeps, host: HostClient, doc: AgentSessionDoc, info: ExecSessionInfo | null): Promise<View> {
  let agentSessionID = doc.agentSessionID;
  if (!agentSessionID) {
    agentSessionID = await readAgentSessionId(host, doc);
    if (agentSessionID) {
      agentSessionsOf(deps.store)
        .updateOne({ _id: doc._id }, { $set: { agentSessionID } })
        .catch((err: unknown) => deps.logger.warn({ err, id: doc._id }, 'could not record agentSessionID'));
    }
  }
  noteExit(deps, 'agent', doc._id, info, doc);
  const live = liveFields(info, doc);
  return {
    sessionID: doc._id,
    sandboxID: doc.sandboxId,
    running: live.running,
    startedAt: doc.startedAt.toISOString(),
    agentSessionID,
    exitCode: live.exitCode,
    exitedAt: live.exitedAt,
  };
}

async function orgAgent(deps: ApiDeps, orgId: string, sandboxId: string, id: string): Promise<AgentSessionDoc> {
  const doc = await agentSessionsOf(deps.store).findOne({ _id: id });
  if (!doc || doc.orgId !== orgId || doc.sandboxId !== sandboxId) throw notFound(`agent session ${id}`);
  return doc;
}

/** /api/sandboxes/:id/agent: start, list, read, kill. */
export function registerSandboxAgentRoutes(t: RouteTable, deps: ApiDeps): void {
  const defaultRunner = parseRunnerSetting(process.env.AGENT_RUNNER);

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
      const host = await sandboxHost(deps, org.id, params.id);
      const id = `as-${randomId()}`;
      const { runner, ...options } = body;
      const argv = runner ?? defaultRunner;
      const configFile = `${STATE_DIR}/${id}.config.json`;
      const stateFile = `${STATE_DIR}/${id}.json`;
      let info: ExecSessionInfo;
      try {
        // One after the other: the host's parent-directory creation is not safe against a concurrent write.
        await host.writeFile(params.id, RUNNER_PATH, runnerFile(), { mode: 0o755 });
        await host.writeFile(params.id, configFile, JSON.stringify(options), { mode: 0o600 });
        info = await host.createExec(params.id, {
          cmd: 'node',
          args: [RUNNER_PATH, '--config', configFile, '--state', stateFile, ...(argv ? ['--', ...argv] : [])],
          cwd: body.cwd,
        });
      } catch (err) {
        throw fromHostError(err, `sandbox ${params.id}`);
      }
      const doc: AgentSessionDoc = {
        _id: id,
        orgId: org.id,
        sandboxId: params.id,
        execId: info.sessionID,
        stateFile,
        options: JSON.stringify(options),
        agentSessionID: '',
        startedAt: new Date(info.startedAt),
        exitedAt: null,
        exitCode: null,
      };
      try {
        await agentSessionsOf(deps.store).insertOne(doc);
      } catch (err) {
        await host.killExec(params.id, info.sessionID).catch(() => undefined);
        throw err;
      }
      rememberTarget(id, { orgId: org.id, sandboxId: params.id, execId: info.sessionID, kind: 'agent' });
      const live = liveFields(info, doc);
      res.status(201).json({
        sessionID: id,
        sandboxID: params.id,
        running: live.running,
        startedAt: doc.startedAt.toISOString(),
        agentSessionID: '',
        exitCode: live.exitCode,
        exitedAt: live.exitedAt,
      } satisfies View);
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
      const host = await sandboxHost(deps, org.id, params.id);
      const [docs, byId] = await Promise.all([
        agentSessionsOf(deps.store).find({ sandboxId: params.id }).sort({ startedAt: -1 }).limit(1000).toArray(),
        liveExecsOf(host, params.id),
      ]);
      const mine = docs.filter((d) => d.orgId === org.id);
      res.json(await Promise.all(mine.map((d) => agentView(deps, host, d, byId.get(d.execId) ?? null))));
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
      const host = await sandboxHost(deps, org.id, params.id);
      const doc = await orgAgent(deps, org.id, params.id, params.sessionID);
      res.json(await agentView(deps, host, doc, await liveExec(host, params.id, doc.execId)));
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
      const host = await sandboxHost(deps, org.id, params.id);
      const doc = await orgAgent(deps, org.id, params.id, params.sessionID);
      const info = await killAndWait(host, params.id, doc.execId, signalName(body.signal));
      res.json(await agentView(deps, host, doc, info));
    },
  });
}

