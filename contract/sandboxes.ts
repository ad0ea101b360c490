/**
 * Sandboxes (/api/sandboxes): the create body, the public view, kill, metrics and scale.
 */
import { z } from './zod'; // zod with .openapi()
import { MIN_MEMORY_MB } from './limits';
import { networkSchema } from './network';
import { TEMPLATE_NAMES } from './templates';
import { ImageManifestSchema } from './image-schema';

/*
 * The schemas of a sandbox, shared by the routes of sandboxes, checkpoints, exec,
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
      .describe(
        'Size of the writable layer in MB (writes past it get ENOSPC); default SANDBOX_DISK_MB (20480, as on OpenComputer), at most SANDBOX_MAX_DISK_MB (20480)',
      ),
    user: z
      .enum(['root', 'sandbox'])
      .optional()
      .describe(
        "Who its commands run as: sandbox (uid 1000, HOME=/home/sandbox, /workspace its own, passwordless sudo to sandbox root) or root; default SANDBOX_USER, else sandbox (OpenComputer's convention)",
      ),
    previewAuth: z.unknown().optional().describe('Not implemented (501): protect previews per URL with authConfig at POST /preview'),
    webhooks: z.unknown().optional().describe('Not implemented (501): sandbox lifecycle webhooks'),
    network: networkSchema(z)
      .optional()
      .describe(
        "What the sandbox may reach: egress 'internet' (default), 'none', or { allow: [IPv4 address, CIDR, host name or *.wildcard…] }; the host, link-local, other sandboxes and private ranges are always refused",
      ),
  })
  .openapi('CreateSandbox');

const PatchRefView = z.object({ id: z.string(), sequence: z.number().int() });
const PatchesView = z.object({
  applied: z.array(PatchRefView),
  failed: PatchRefView.extend({ exitCode: z.number().int(), outputTail: z.string() }).nullable(),
});

export const SandboxView = z
  .object({
    sandboxID: z.string(),
    status: z
      .enum(['running', 'hibernated', 'stopped', 'error', 'lost'])
      .describe(
        'lost (listings only): its sandbox host is lost (HOST_DEAD_AFTER); GET of it answers 410 gone until the host rejoins. error: its host came back without it',
      ),
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
    user: z.enum(['root', 'sandbox']).describe('Who its commands run as'),
    createdAt: z.string(),
    patchError: z.string().optional().describe("Set while a checkpoint patch failed (OpenComputer's field): which, its exit code and output, what to do"),
    patches: PatchesView.optional().describe('For a sandbox from a checkpoint: the patches it has, in order, and the one that stopped the chain (null: none)'),
  })
  .openapi('Sandbox');

/** `GET /api/sandboxes/{id}/allowed-hosts`: OpenComputer's AllowedHostsInfo, plus the policy itself. */
export const AllowedHostsView = z
  .object({
    sandboxID: z.string(),
    secretStore: z.string().optional(),
    egressAllowlist: z.array(z.string()).describe('The allow list of its policy (names, wildcards and CIDRs); empty under internet and none: see network'),
    perSecretAllowedHosts: z
      .record(z.string(), z.array(z.string()))
      .describe("Each sealed secret of the sandbox's store and the hosts it may be sent to (docs/sealed-secrets.md)"),
    network: z.object({ egress: EgressView }),
  })
  .openapi('AllowedHosts');

export const SandboxParams = z.object({ id: z.string().regex(/^sb-[a-z0-9-]{1,64}$/, 'must be a sandbox id (sb-…)') });

/** The body of a kill (exec and agent sessions). */
export const KillBody = z
  .object({
    signal: z
      .union([z.string().max(16), z.number().int().min(1).max(64)])
      .optional()
      .describe('Name (SIGTERM) or number; default SIGKILL'),
  })
  .default({});

const count = z.number().nullable();

/** `GET /api/sandboxes/{id}/metrics`: the sandbox's resource use now, and E2B's flat fields (`getMetrics`). */
export const SandboxMetricsView = z
  .object({
    sandboxID: z.string(),
    timestamp: z.string(),
    cpu: z.object({
      count: z.number().describe('CPUs of quota; 0: no quota'),
      usageSeconds: count.describe('CPU time of all its processes since it started'),
      percent: count.describe('Use over windowMs before the reading, in percent of one CPU (since the previous reading of this sandbox, else 100 ms sampled)'),
      windowMs: count,
      throttledSeconds: count.describe('Time its processes waited for the quota'),
    }),
    memory: z.object({ usedBytes: count, limitBytes: count, peakBytes: count, cacheBytes: count, oomKills: z.number() }),
    disk: z.object({ usedBytes: count, limitBytes: count }).describe('The writable layer: bytes written there and its size'),
    network: z.object({ rxBytes: count, txBytes: count, rxPackets: count, txPackets: count }).describe('rx: into the sandbox; tx: out of it; null: no link'),
    processes: z.object({ current: count, limit: count }),
    cpuCount: z.number(),
    cpuUsedPct: count,
    memUsed: count,
    memTotal: count,
    diskUsed: count,
    diskTotal: count,
  })
  .openapi('SandboxMetrics');

/** `POST /api/sandboxes/{id}/scale`: OpenComputer's `Sandbox.scale` body, with `cpuCount` too. */
export const ScaleBody = z
  .object({
    memoryMB: z
      .number()
      .int()
      .min(MIN_MEMORY_MB)
      .max(1024 * 1024 * 1024)
      .optional()
      .describe('The new memory limit (at most SANDBOX_MAX_MEMORY_MB)'),
    cpuCount: z.number().min(0).max(4096).optional().describe('The new CPU quota (at most SANDBOX_MAX_CPU_COUNT); 0: no quota'),
  })
  .openapi('ScaleSandbox');

export const ScaleView = z
  .object({
    sandboxID: z.string(),
    memoryMB: z.number().nullable(),
    cpuCount: z.number(),
    cpuPercent: z.number().describe('100 per CPU of quota; 0: no quota'),
  })
  .openapi('ScaleResult');

/** An idle timeout in seconds (0 = none), at most 30 days. */
export const IdleTimeoutSeconds = z
  .number()
  .int()
  .min(0)
  .max(30 * 24 * 3600);
