import { z } from 'zod';
import type { ApiDeps } from './deps';
import { MIN_MEMORY_MB } from '../config/limits';
import { networkSchema } from '../contract/network';
import { TEMPLATE_NAMES } from '../contract/templates';
import type { SandboxDoc } from '../services/sandboxes';
import { ImageManifestSchema } from '../contract/image-schema';
import './http';

/*
 * Schemas and the public form of a sandbox, shared by the routes of sandboxes, checkpoints, exec,
 * agent sessions, files, terminals, previews and the 501 answers.
 */

const EgressView = z.union([z.enum(['internet', 'none']), z.object({ allow: z.array(z.string()) })]);
const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');

/** The create body of the OpenComputer client (`Sandbox.create`); fields we do not use are ignored. */
export const CreateSandboxBody = z
  .object({
    templateID: z
      .string()
      .min(1)
      .max(200)
      .default('base')
      .describe(`The template: ${TEMPLATE_NAMES.join(', ')}; all are the base image, which has every runtime. The sandbox's templateID is the name given`),
    snapshot: z.string().min(1).max(200).optional(),
    image: ImageManifestSchema.optional().describe(
      "An image manifest (the client's Image): built once per manifest and cached as the snapshot image-<hash>, then the sandbox starts from it. " +
        'With Accept: text/event-stream the answer streams build_log events and ends with result (the sandbox) or error.',
    ),
    envs: z.record(EnvName, z.string().max(32768)).default({}),
    secretStore: z
      .string()
      .min(1)
      .max(100)
      .optional()
      .describe("Name of a secret store: its secrets become environment variables (the body's envs win on a clash)"),
    metadata: z.record(z.string(), z.string().max(4096)).default({}),
    timeout: z
      .number()
      .int()
      .min(0)
      .max(30 * 24 * 3600)
      .default(0)
      .describe('Idle seconds before the sandbox is destroyed (or hibernated: onTimeout); 0 = never'),
    onTimeout: z.enum(['kill', 'hibernate']).default('kill').describe('What an idle timeout does: kill (default) or hibernate (wake brings it back)'),
    memoryMB: z
      .number()
      .int()
      .min(MIN_MEMORY_MB)
      .optional()
      .describe("Memory limit in MB; default SANDBOX_MEMORY_MB (2048), at most SANDBOX_MAX_MEMORY_MB (the machine's memory)"),
    cpuCount: z
      .number()
      .min(0.1)
      .optional()
      .describe('CPUs of CFS quota; default SANDBOX_CPU_COUNT (0: no quota, an equal share), at most SANDBOX_MAX_CPU_COUNT'),
    diskMB: z
      .number()
      .int()
      .min(1)
      .optional()
      .describe('Size of the writable layer in MB (writes past it get ENOSPC); default SANDBOX_DISK_MB (2048), at most SANDBOX_MAX_DISK_MB (20480)'),
    previewAuth: z.unknown().optional().describe('Not implemented (501): protect previews per URL with authConfig at POST /preview'),
    webhooks: z.unknown().optional().describe('Not implemented (501): sandbox lifecycle webhooks'),
    network: networkSchema(z)
      .optional()
      .describe(
        "What the sandbox may reach: egress 'internet' (default), 'none', or { allow: [IPv4 address, CIDR, host name or *.wildcard…] }; the host, link-local, other sandboxes and private ranges are always refused",
      ),
  })
  .openapi('CreateSandbox');

export const SandboxView = z
  .object({
    sandboxID: z.string(),
    status: z.enum(['running', 'hibernated', 'stopped', 'error']),
    templateID: z.string(),
    metadata: z.record(z.string(), z.string()),
    timeout: z.number().int(),
    onTimeout: z.enum(['kill', 'hibernate']),
    hibernatedAt: z.string().nullable().describe('When it was hibernated (status hibernated), else null'),
    memoryMB: z.number().nullable().describe('The effective memory limit in MB (null: a sandbox created before limits were recorded)'),
    cpuCount: z.number().nullable().describe('The effective CPU quota; 0: no quota, an equal share of the machine'),
    diskMB: z.number().nullable().describe('The effective size of the writable layer in MB'),
    fromCheckpoint: z.string().nullable(),
    snapshot: z.string().nullable(),
    sandboxDomain: z.string(),
    network: z.object({ egress: EgressView }).describe('Its egress policy now (PUT /api/sandboxes/{id}/network changes it)'),
    createdAt: z.string(),
  })
  .openapi('Sandbox');

/** `GET /api/sandboxes/{id}/allowed-hosts`: OpenComputer's AllowedHostsInfo, plus the policy itself. */
export const AllowedHostsView = z
  .object({
    sandboxID: z.string(),
    secretStore: z.string().optional(),
    egressAllowlist: z.array(z.string()).describe('The allow list of its policy (names, wildcards and CIDRs); empty under internet and none: see network'),
    perSecretAllowedHosts: z.record(z.string(), z.array(z.string())).describe('Always empty: secrets are not sealed (see the README)'),
    network: z.object({ egress: EgressView }),
  })
  .openapi('AllowedHosts');

export const SandboxParams = z.object({ id: z.string().regex(/^sb-[a-z0-9-]{1,64}$/, 'must be a sandbox id (sb-…)') });

/** The public form of a sandbox (OpenComputer's shape: `sandboxID`, camelCase fields). */
export function sandboxView(deps: ApiDeps, s: SandboxDoc): z.infer<typeof SandboxView> {
  return {
    sandboxID: s._id,
    status: s.status,
    templateID: s.templateID,
    metadata: (JSON.parse(s.metadata) as Record<string, string> | null) ?? {},
    timeout: s.timeout,
    onTimeout: s.onTimeout ?? 'kill',
    hibernatedAt: s.status === 'hibernated' && s.hibernation ? s.hibernation.at.toISOString() : null,
    memoryMB: s.memoryMB,
    cpuCount: s.cpuCount,
    diskMB: s.diskMB ?? null,
    fromCheckpoint: s.fromCheckpoint,
    snapshot: s.snapshot,
    sandboxDomain: deps.cfg.PREVIEW_DOMAIN,
    network: s.network ?? { egress: 'internet' },
    createdAt: s.createdAt.toISOString(),
  };
}

/** The body of a kill (exec and agent sessions). */
export const KillBody = z
  .object({
    signal: z
      .union([z.string().max(16), z.number().int().min(1).max(64)])
      .optional()
      .describe('Name (SIGTERM) or number; default SIGKILL'),
  })
  .default({});
