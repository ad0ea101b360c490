/**
 * Exec sessions, terminals and sandbox agent sessions (/api/sandboxes/{id}/exec, /pty, /agent): ids, bodies and views.
 */
import { z } from './zod'; // zod with .openapi()
import { SandboxParams } from './sandboxes';

export const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');

export const MAX_SECONDS = 30 * 24 * 3600;

export const ExecSessionParams = SandboxParams.extend({
  sessionID: z.string().regex(/^es-[a-z0-9]{1,64}$/, 'must be an exec session id (es-…)'),
});

export const CreateExecBody = z
  .object({
    cmd: z.string().min(1).max(4096),
    args: z
      .array(z.string().max(128 * 1024))
      .max(4096)
      .default([]),
    envs: z.record(EnvName, z.string().max(128 * 1024)).default({}),
    cwd: z.string().startsWith('/', 'must be an absolute path').max(4096).optional(),
    timeout: z.number().int().positive().max(MAX_SECONDS).optional().describe('Seconds before the command is killed; default none'),
    maxRunAfterDisconnect: z
      .number()
      .int()
      .min(0)
      .max(MAX_SECONDS)
      .optional()
      .describe('Seconds the command keeps running after its last client detached; default none (it keeps running)'),
  })
  .openapi('CreateExecSession');

export const RunExecBody = CreateExecBody.omit({ maxRunAfterDisconnect: true })
  .extend({
    timeout: z.number().int().positive().max(3600).default(60).describe('Seconds before the command is killed; default 60'),
    stdin: z
      .string()
      .max(1024 * 1024)
      .optional(),
  })
  .openapi('RunExec');

export const ExecSessionView = z
  .object({
    sessionID: z.string(),
    sandboxID: z.string(),
    command: z.string(),
    args: z.array(z.string()),
    running: z.boolean(),
    exitCode: z.number().int().nullable(),
    startedAt: z.string(),
    exitedAt: z.string().nullable(),
    attachedClients: z.number().int(),
    oomKilled: z
      .boolean()
      .optional()
      .describe(
        "Once exited: whether the sandbox's memory limit made the kernel kill a process of it while the command ran (present when the host reports it)",
      ),
  })
  .openapi('ExecSession');

export const RunResultView = z
  .object({
    exitCode: z.number().int(),
    stdout: z.string(),
    stderr: z.string(),
    oomKilled: z.literal(true).optional().describe("Present (true) when the sandbox's memory limit made the kernel kill a process while the command ran"),
    truncated: z
      .literal(true)
      .optional()
      .describe('Present (true) when stdout or stderr printed more than EXEC_RUN_OUTPUT_MAX_BYTES (default 1 MiB): each holds its first bytes only'),
  })
  .openapi('ExecRunResult');

export const ExecResultView = z
  .object({
    execId: z.string(),
    running: z.boolean(),
    exitCode: z.number().int().nullable(),
    timedOut: z.boolean().describe('Killed by its timeout'),
    stdout: z.string().describe('The last 1 MiB of its stdout (so far, while running)'),
    stderr: z.string(),
    truncated: z.literal(true).optional().describe('Present (true) when a stream printed more than its last 1 MiB kept here'),
    error: z.string().optional(),
  })
  .openapi('ExecResult');

export const ExecSocketParams = SandboxParams.extend({
  sessionID: z.string().regex(/^(es|as)-[a-z0-9]{1,64}$/, 'must be an exec or agent session id (es-… or as-…)'),
});

export const PtySessionParams = SandboxParams.extend({ sessionID: z.string().regex(/^pty-[a-z0-9]{1,64}$/, 'must be a terminal id (pty-…)') });

export const CreatePtyBody = z
  .object({
    cols: z.number().int().min(1).max(1000).default(80),
    rows: z.number().int().min(1).max(1000).default(24),
    envs: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name'), z.string().max(128 * 1024)).optional(),
    cwd: z.string().startsWith('/', 'must be an absolute path').max(4096).optional(),
  })
  .openapi('CreatePty');

export const PtyView = z
  .object({ sessionID: z.string(), sandboxID: z.string(), cols: z.number().int(), rows: z.number().int(), running: z.boolean(), startedAt: z.string() })
  .openapi('PtySession');

export const McpServer = z
  .object({
    command: z.string().min(1).max(4096).optional(),
    args: z.array(z.string().max(32768)).max(256).optional(),
    env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name'), z.string().max(32768)).optional(),
    type: z.enum(['stdio', 'http', 'sse']).optional(),
    url: z.url().max(4096).optional(),
    headers: z.record(z.string().max(256), z.string().max(8192)).optional(),
  })
  .refine((s) => Boolean(s.command) !== Boolean(s.url), { message: 'needs exactly one of command (stdio) or url (http, sse)' });

export const CreateAgentSessionBody = z
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
