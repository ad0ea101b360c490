/**
 * The sandbox host's request shapes as zod schemas: every body, path parameter set and query the
 * host accepts. ./wire.ts puts them together per route (method, path, `{ params, query, body }`);
 * the host validates requests with them (built once, here, at module load: a schema built per
 * request costs zod's compile each time) and the client's request types are inferred from them
 * (./types.ts). Pure: zod and contract/ only.
 */
import { z } from 'zod';
import { MIN_MEMORY_MB } from '../../contract/limits';
import { networkSchema } from '../../contract/network';

const stringMap = z.record(z.string(), z.string());

/** `:id` of a sandbox. */
export const idParams = z.object({ id: z.string().min(1) });
/** `:id` of a sandbox and `:sid` of one of its exec sessions or terminals. */
export const sessionParams = z.object({ id: z.string().min(1), sid: z.string().min(1) });
/** `:layerId` of a layer. */
export const layerParams = z.object({ layerId: z.string().min(1) });
/** `:id` of a sandbox and `:port` inside it. */
export const portParams = z.object({ id: z.string().min(1), port: z.coerce.number().int().min(1).max(65535) });

/** Who a sandbox's processes run as (see CreateSandboxRequest.user). */
export const sandboxUser = z.enum(['root', 'sandbox']);

/** The main process of a sandbox. It survives restarts of the host's clients (and of the host). */
export const entrypointSpec = z.object({
  argv: z.array(z.string()).min(1),
  env: stringMap.optional(),
  cwd: z.string().startsWith('/').optional(),
  /** Killed after this many seconds; its exit is then reported with `timedOut: true`. */
  timeoutSeconds: z.number().positive().optional(),
});

const patches = z.array(z.object({ id: z.string().min(1), script: z.string() }));

/** What to create (`POST /sandboxes`). Everything but `id` and `orgId` is optional. */
export const createSandboxBody = z.object({
  /** `sb-<id>`; chosen by the caller so that a retried create is idempotent. */
  id: z.string().min(1),
  /** Organisation that owns the sandbox (recorded, never interpreted by the host). */
  orgId: z.string(),
  /** Who asked for it, so leftovers can be reaped: e.g. { kind: 'session', id: 'sess_…' }. */
  owner: z.object({ kind: z.enum(['session', 'instance', 'api', 'snapshot']), id: z.string() }).optional(),
  /** Read-only layers to stack under the sandbox's writable layer, topmost first (checkpoint ids). */
  layers: z.array(z.string()).optional(),
  /** Environment of every process started in the sandbox. */
  envs: stringMap.optional(),
  /**
   * Sealed secrets (docs/sealed-secrets.md): each becomes the env variable `name` holding a
   * placeholder made by the host; the host's egress proxy keeps the value (sealed with its own key)
   * and puts it into requests to `allowedHosts` only. Never echoed in any answer.
   */
  sealedSecrets: z
    .array(
      z.object({
        name: z.string().min(1).max(200),
        value: z.string().min(1).max(32768),
        allowedHosts: z.array(z.string().max(253)).min(1).max(32),
        injectInto: z.array(z.string().max(100)).min(1).max(16).optional(),
      }),
    )
    .max(256)
    .optional(),
  /** Default working directory (absolute) of every process started in the sandbox; default /workspace. */
  cwd: z.string().startsWith('/').optional(),
  /**
   * Who its processes run as (patches excepted: they run as root): `root` (default) or `sandbox`
   * (uid 1000, HOME=/home/sandbox, no capabilities, passwordless sudo to sandbox root; docs/isolation.md).
   * Files the host writes for it (the files API, `files`) are then owned by that user.
   */
  user: sandboxUser.optional(),
  /**
   * Resource limits (cgroups and the writable layer's size). Absent: the host's defaults
   * (SANDBOX_MEMORY_MB, SANDBOX_DISK_MB, …); the host clamps nothing: callers check the operator's maxima.
   */
  memoryMB: z.number().int().positive().optional(),
  /** 0: no CFS quota (an equal cpu.shares weight). */
  cpuCount: z.number().min(0).optional(),
  maxProcesses: z.number().int().positive().optional(),
  /** Size of the writable layer (everything the sandbox writes to its filesystem); writes past it get ENOSPC. */
  diskMB: z.number().int().positive().optional(),
  /**
   * What the sandbox may reach over the network (see sandbox/network.ts): `internet` (default),
   * `none`, or `{ allow: [IPv4 CIDR, host name or *.wildcard…] }`. The host itself, link-local, other sandboxes and private
   * ranges are refused whatever the policy.
   */
  network: networkSchema(z).optional(),
  /** Files written before anything runs: absolute path inside the sandbox → UTF-8 content. */
  files: stringMap.optional(),
  /** Scripts run with bash, in order, before anything else (checkpoint patches). */
  patches: patches.optional(),
  /**
   * A patch that exits non-zero: by default the create fails with patch_failed (nothing is left);
   * with true the chain stops there and the sandbox is kept with the patches before it (the failed
   * one's outcome is the last of the answer's `patches`; the ones after it did not run).
   */
  keepOnPatchFailure: z.boolean().optional(),
  /** Started right after creation, detached: the sandbox's main process (a session's entrypoint). */
  entrypoint: entrypointSpec.optional(),
  /** Free-form labels kept with the sandbox. */
  metadata: stringMap.optional(),
  /**
   * With an entrypoint: wait up to `waitMs` for it to exit before answering and, when it has,
   * read `readFile` too, so that a short task is one call (see CreatedSandbox).
   */
  awaitExit: z
    .object({
      waitMs: z.number().int().min(0),
      readFile: z.object({ path: z.string().min(1), maxBytes: z.number().int().positive() }).optional(),
      readLog: z.object({ maxBytes: z.number().int().positive() }).optional(),
    })
    .optional(),
});

/** `PUT /sandboxes/:id/network`: the sandbox's new egress policy. */
export const networkBody = networkSchema(z);

/** A live resize (POST /sandboxes/:id/scale): the fields given change, the others stay. */
export const scaleBody = z
  .object({ memoryMB: z.number().int().min(MIN_MEMORY_MB).optional(), cpuCount: z.number().min(0).max(4096).optional() })
  .strict()
  .refine((b) => b.memoryMB !== undefined || b.cpuCount !== undefined, 'give memoryMB, cpuCount or both');

/** `PUT /sandboxes/:id/files`: a whole file in the JSON body. */
export const writeFileBody = z.object({
  path: z.string().min(1),
  content: z.string(),
  encoding: z.enum(['utf8', 'base64']).optional(),
  mode: z.number().int().min(0).max(0o7777).optional(),
});

export const wakeBody = z.object({ patches: patches.default([]), keepOnPatchFailure: z.boolean().default(false) });
export const restoreBody = z.object({ layerId: z.string().min(1), patches: patches.default([]) });

/** What an exec session's id must look like (CreateExecBody.sessionID). */
export const EXEC_SESSION_ID = /^es-[0-9a-f]{16}$/;

/** Body of `POST /sandboxes/:id/exec` (a command run inside a live sandbox). */
export const execBody = z.object({
  cmd: z.string().min(1),
  args: z.array(z.string()).optional(),
  envs: stringMap.optional(),
  cwd: z.string().startsWith('/').optional(),
  /** Seconds before the command is killed (SIGKILL to its process group); default: no limit. */
  timeout: z.number().int().positive().optional(),
  /** Seconds the command keeps running once its last WebSocket client has left; default: no limit. */
  maxRunAfterDisconnect: z.number().int().min(0).optional(),
  /**
   * The session's id (`es-` and 16 hex digits), chosen by the control plane so that it records the
   * session while the host starts the command; absent: the host makes one. A host that has it already answers conflict.
   */
  sessionID: z.string().regex(EXEC_SESSION_ID, 'must be es- and 16 hex digits').optional(),
});
/** Body of `POST /sandboxes/:id/exec/run`: an exec, and what its stdin gets. */
export const execRunBody = execBody.extend({ stdin: z.string().optional() });

/** `awaitStartMs` of `execFrames`: how long to wait for the session's start (at most 10 s; 0: not at all). */
export const execAwaitStartMs = z.coerce.number().int().min(0).max(10_000).default(0);

/** `waitMs` of the exec routes that wait (at most 30 s). */
export const execWaitMs = z.coerce.number().int().min(0).max(30_000).default(0);

/** `?path=` of the filesystem routes. */
export const fsPathQuery = z.object({ path: z.string().min(1) });
/** A boolean query flag: `true` or `false`. */
export const queryFlag = z.enum(['true', 'false']).transform((v) => v === 'true');
/** `?mode=` of an upload: octal permission bits. */
export const fileMode = z
  .string()
  .regex(/^[0-7]{3,4}$/, 'must be octal, e.g. 644')
  .optional();

const terminalSize = z.number().int().min(1).max(1000);
/** Body of `POST /sandboxes/:id/pty`: a login shell on a terminal of `cols` × `rows`. */
export const createPtyBody = z.object({
  cols: terminalSize.default(80),
  rows: terminalSize.default(24),
  envs: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string()).optional(),
  cwd: z.string().startsWith('/').optional(),
});
/** A terminal's text frame that resizes it (client → host, on the terminal's WebSocket). */
export const ptyResizeMessage = z.object({ type: z.literal('resize'), cols: terminalSize, rows: terminalSize });

/** The request types, as the host has them once validated (defaults filled in). */
export type CreateSandboxBody = z.infer<typeof createSandboxBody>;
export type EntrypointSpecBody = z.infer<typeof entrypointSpec>;
export type ScaleBody = z.infer<typeof scaleBody>;
export type ExecBody = z.infer<typeof execBody>;
export type ExecRunBody = z.infer<typeof execRunBody>;
export type CreatePtyBody = z.infer<typeof createPtyBody>;
