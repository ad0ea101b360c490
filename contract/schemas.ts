import { WebhookInput, WebhookView } from './webhooks';
import { z } from './zod'; // zod with .openapi()
import { MIN_MEMORY_MB } from './limits';
import { networkSchema } from './network';
import { OUTCOME_REASONS } from './errors';

/** `{ "error": { "type", "message" } }`: the body of every error answer (types and statuses: contract/errors.ts). */
export const ErrorBodySchema = z.object({ error: z.object({ type: z.string(), message: z.string() }) }).openapi('Error');

/** Agent ids: chosen by the caller or generated; safe in paths and workflow ids. */
export const AgentId = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, 'must be 1-64 letters, digits, _ . - and start with a letter or digit');

/** Runtimes an agent can name as its `core`. */
export const CORES = ['bash', 'node', 'python'] as const;

const AbsPath = z
  .string()
  .regex(/^\/[^\0]*$/, 'must be an absolute path')
  .refine((p) => !p.split('/').includes('..'), 'must not contain ..');
const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');
const JsonObject = z.record(z.string(), z.unknown());

const agentFields = {
  display_name: z.string().max(200),
  core: z.enum(CORES, { message: `must be one of ${CORES.join(', ')}` }),
  channels: z.array(z.string().max(100)).max(100),
  packages: z.array(z.string().max(200)).max(200),
  secret_store: z.string().max(200),
  config: JsonObject.nullable(),
  entrypoint: z.array(z.string().min(1).max(4096)).min(1).max(256),
  files: z.record(AbsPath, z.string()),
  env: z.record(EnvName, z.string().max(32768)),
  snapshot: z.string().min(1).max(200).nullable(),
  timeoutSeconds: z
    .number()
    .int()
    .min(1)
    .max(7 * 24 * 3600),
  // Limits of the agent's sandboxes (sessions and instances); the maxima are the operator's (checked by the routes).
  memoryMB: z.number().int().min(MIN_MEMORY_MB).describe('Memory limit of its sandboxes in MB; default SANDBOX_MEMORY_MB, at most SANDBOX_MAX_MEMORY_MB'),
  cpuCount: z.number().min(0.1).describe('CPUs of CFS quota of its sandboxes; default SANDBOX_CPU_COUNT (0: no quota), at most SANDBOX_MAX_CPU_COUNT'),
  diskMB: z.number().int().min(1).describe("Size of its sandboxes' writable layer in MB; default SANDBOX_DISK_MB, at most SANDBOX_MAX_DISK_MB"),
  network: networkSchema(z).describe("What its sandboxes may reach: egress 'internet' (default), 'none', or { allow: [IPv4 CIDR…] }"),
  webhook: WebhookInput.describe('POSTed to (signed with the secret) when each of its sessions ends'),
  user: z
    .enum(['root', 'sandbox'])
    .describe("Who its sandboxes' processes run as: root, or sandbox (uid 1000, HOME=/home/sandbox, passwordless sudo); default SANDBOX_USER, else root"),
  retryOnHostLoss: z
    .boolean()
    .describe(
      'A session whose sandbox host is lost while its entrypoint runs runs again from the start on another host (the agent must be idempotent); default false: it ends failed with reason host_lost',
    ),
};

export const CreateAgentBody = z
  .object({
    id: AgentId.optional(),
    display_name: agentFields.display_name.optional(),
    core: agentFields.core,
    channels: agentFields.channels.default([]),
    packages: agentFields.packages.default([]),
    secret_store: agentFields.secret_store.default('default'),
    config: agentFields.config.default(null),
    entrypoint: agentFields.entrypoint,
    files: agentFields.files.default({}),
    env: agentFields.env.default({}),
    snapshot: agentFields.snapshot.default(null),
    timeoutSeconds: agentFields.timeoutSeconds.default(3600),
    memoryMB: agentFields.memoryMB.optional(),
    cpuCount: agentFields.cpuCount.optional(),
    diskMB: agentFields.diskMB.optional(),
    network: agentFields.network.optional(),
    user: agentFields.user.optional(),
    webhook: agentFields.webhook.optional(),
    retryOnHostLoss: agentFields.retryOnHostLoss.default(false),
  })
  .strict()
  .openapi('CreateAgent');

export const UpdateAgentBody = z
  .object({
    display_name: agentFields.display_name,
    core: agentFields.core,
    channels: agentFields.channels,
    packages: agentFields.packages,
    secret_store: agentFields.secret_store,
    config: agentFields.config,
    entrypoint: agentFields.entrypoint,
    files: agentFields.files,
    env: agentFields.env,
    snapshot: agentFields.snapshot,
    timeoutSeconds: agentFields.timeoutSeconds,
    // null: back to the operator's default.
    memoryMB: agentFields.memoryMB.nullable(),
    cpuCount: agentFields.cpuCount.nullable(),
    diskMB: agentFields.diskMB.nullable(),
    network: agentFields.network.nullable(),
    user: agentFields.user.nullable(),
    webhook: agentFields.webhook.nullable(),
    retryOnHostLoss: agentFields.retryOnHostLoss,
  })
  .partial()
  .strict()
  .openapi('UpdateAgent');

export const Agent = z
  .object({
    id: z.string(),
    display_name: z.string(),
    core: z.string(),
    channels: z.array(z.string()),
    packages: z.array(z.string()),
    secret_store: z.string(),
    config: JsonObject.nullable(),
    entrypoint: z.array(z.string()),
    files: z.record(z.string(), z.string()),
    env: z.record(z.string(), z.string()).describe('Values are never returned: each is shown as "[set]"'),
    snapshot: z.string().nullable(),
    timeoutSeconds: z.number().int(),
    memoryMB: z.number().nullable().describe("null: the operator's default (SANDBOX_MEMORY_MB)"),
    cpuCount: z.number().nullable().describe("null: the operator's default (SANDBOX_CPU_COUNT)"),
    diskMB: z.number().nullable().describe("null: the operator's default (SANDBOX_DISK_MB)"),
    network: z
      .object({ egress: z.union([z.enum(['internet', 'none']), z.object({ allow: z.array(z.string()) })]) })
      .nullable()
      .describe('null: the default (egress internet)'),
    user: z.enum(['root', 'sandbox']).nullable().describe("null: the operator's default (SANDBOX_USER, else root)"),
    webhook: WebhookView.describe('null: none; the secret is never shown'),
    retryOnHostLoss: z.boolean(),
    created_at: z.string(),
    updated_at: z.string(),
  })
  .openapi('Agent');

export const SessionStatusEnum = z.enum(['creating', 'running', 'completed', 'failed']);

export const Outcome = z
  .object({
    reason: z.enum(OUTCOME_REASONS).nullable(),
    exit_code: z.number().int().nullable(),
    message: z.string().nullable(),
  })
  .openapi('SessionOutcome');

export const Session = z
  .object({
    id: z.string(),
    agent_id: z.string(),
    status: SessionStatusEnum,
    input: JsonObject,
    result: JsonObject.nullable(),
    preview_url: z.string().nullable(),
    metadata: JsonObject,
    outcome: Outcome.nullable(),
    created_at: z.string(),
    updated_at: z.string(),
  })
  .openapi('Session');

export const CreateSessionBody = z
  .object({
    input: JsonObject.default({}),
    metadata: JsonObject.default({}),
    webhook: WebhookInput.optional().describe("POSTed to when this session ends (instead of the agent's webhook)"),
  })
  .strict()
  .openapi('CreateSession');

export const SessionResult = z
  .object({
    status: z.enum(['completed', 'failed']),
    data: JsonObject.nullable(),
    completed_at: z.string(),
    reason: Outcome.shape.reason,
    exit_code: z.number().int().nullable(),
    message: z.string().nullable(),
  })
  .openapi('SessionResult');

export const Cursor = z.string().max(500);
export const Limit = z.coerce.number().int().min(1).max(200).default(50);
/** `?wait=N`: wait up to N seconds (at most 60) for a session to end before answering. */
export const WaitSeconds = z.coerce.number().min(0).max(60).optional();

export const AgentParams = z.object({ agentId: AgentId });
export const SessionParams = z.object({ agentId: AgentId, id: z.string().regex(/^sess_[a-z0-9]{1,64}$/, 'must be a session id (sess_…)') });

export const LogsQuery = z.object({
  stream: z.enum(['stdout', 'stderr', 'all']).default('all').describe('Which output (default all: both, interleaved as written)'),
  follow: z
    .enum(['true', 'false', '1', '0'])
    .default('false')
    .transform((v) => v === 'true' || v === '1')
    .describe('Stream the output while the session runs (chunked), ending when the session ends'),
});
