/**
 * The types of the contract between the sandbox host (one long-lived process per machine that owns
 * every sandbox on it) and its clients: the worker's activities and the API's sandbox routes. The
 * routes are declared in ./wire.ts; the request types here are inferred from the schemas the host
 * validates with (./wire-schemas.ts), the answers' are written out. HostClient speaks it.
 */

import type { CreateSandboxBody, CreatePtyBody, EntrypointSpecBody, ExecBody, ScaleBody, sandboxUser } from './wire-schemas';
import type { z } from 'zod';

export { EXEC_SESSION_ID } from './wire-schemas';

/** Who a sandbox's processes run as (see CreateSandboxRequest.user). */
export type SandboxUser = z.infer<typeof sandboxUser>;

/** What to create (the body of `POST /sandboxes`, ./wire-schemas.ts `createSandboxBody`). */
export interface CreateSandboxRequest extends CreateSandboxBody {
  /** Host-internal (a hibernated sandbox made again; never accepted over HTTP): its sealed secrets as they were kept. */
  restoredSealed?: { placeholder: string; name: string; hosts: string[]; inject?: string[]; box: string }[];
}

/** What a create answers: the sandbox and, when asked for with `awaitExit`, its entrypoint's state and file. */
export interface CreatedSandbox extends SandboxInfo {
  entrypoint?: EntrypointStatus;
  /**
   * The file asked for once the entrypoint has exited: its content (base64), or that it is missing
   * or larger than maxBytes. Left out when it could not be read for another reason.
   */
  file?: { content: string } | { missing: true } | { tooLarge: true };
  /** The entrypoint's output in order once it has exited, when asked for with `awaitExit.readLog`. */
  log?: WireEntrypointLog;
}

/** An entrypoint's stdout and stderr in the order written (the last maxBytes of each), chunk bytes in base64. */
export interface WireEntrypointLog {
  chunks: { stream: 'stdout' | 'stderr'; at: number | null; offset: number; data: string }[];
  bytes: { stdout: number; stderr: number };
  truncated: { stdout: boolean; stderr: boolean };
}

/** The main process of a sandbox (./wire-schemas.ts `entrypointSpec`). */
export type EntrypointSpec = EntrypointSpecBody;

export interface PatchOutcome {
  id: string;
  exitCode: number;
  /** Last few KiB of combined stdout/stderr. */
  outputTail: string;
}

export interface SandboxInfo {
  id: string;
  orgId: string;
  hostId: string;
  owner?: CreateSandboxRequest['owner'];
  status: 'running' | 'stopped';
  createdAt: string;
  metadata: Record<string, string>;
  patches: PatchOutcome[];
  /** Which isolation this sandbox got: 'namespaces' or 'process' (none). */
  provider: string;
  /** Its egress policy now (absent: loopback only, no policy: SANDBOX_NETWORK=off or the process provider). */
  network?: { egress: 'internet' | 'none' | { allow: string[] } };
}

/** Exit status of a sandbox's entrypoint. */
export type EntrypointStatus =
  | { state: 'none' }
  | { state: 'running'; pid: number; startedAt: string }
  | {
      state: 'exited';
      exitCode: number;
      timedOut: boolean;
      signal: string | null;
      startedAt: string;
      exitedAt: string;
      /** The kernel's OOM killer killed a process of the sandbox (its memory limit was reached) while the entrypoint ran. */
      oomKilled?: boolean;
    };

/** Error body the host answers with: { error: { type, message } } like the public API. */
export interface HostErrorBody {
  error: { type: string; message: string };
}

/** Body of `POST /sandboxes/:id/exec` (./wire-schemas.ts `execBody`). */
export type ExecRequest = ExecBody;

/** An exec session (the public API's Exec session object). */
export interface ExecSessionInfo {
  /** `es-<id>` */
  sessionID: string;
  sandboxID: string;
  command: string;
  args: string[];
  running: boolean;
  exitCode: number | null;
  startedAt: string;
  attachedClients: number;
  /** When the command exited; null while running. */
  exitedAt?: string | null;
  /** Set once the command has exited: whether the sandbox's memory limit made the OOM killer kill a process meanwhile. */
  oomKilled?: boolean;
}

/** Result of `POST /sandboxes/:id/exec/run`. */
export interface ExecRunResult {
  exitCode: number;
  /** Name of the signal that killed it, if any. */
  signal: string | null;
  timedOut: boolean;
  /** Whether the OOM killer killed a process of the sandbox while the command ran (its memory limit). */
  oomKilled?: boolean;
  stdout: string;
  stderr: string;
  /** Present (true) when a stream printed more than EXEC_RUN_OUTPUT_MAX_BYTES and only its first bytes are kept. */
  truncated?: boolean;
}

/** Layer ids of hibernations are `<sandbox id>.h<time>`: a host destroying the sandbox finds them by that prefix. */
export const HIBERNATION_LAYER_MARK = '.h';

/** What the filesystem routes say of a path: `lstat` of a listed entry, `stat` of a path asked for. */
export interface SandboxEntry {
  name: string;
  /** Absolute path inside the sandbox (symlinks on the way resolved for `stat`, as listed for `list`). */
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  isDir: boolean;
  size: number;
  /** Permission bits, e.g. 0o644. */
  mode: number;
  modTime: string;
  /** The link's target (symlinks only). */
  target?: string;
}

/**
 * A running sandbox's resource use (GET /sandboxes/:id/metrics), read from its cgroups, its writable
 * layer's filesystem and its link's counters. A reading the provider has no source for is null.
 */
export interface SandboxMetrics {
  /** When it was read (ISO 8601). */
  timestamp: string;
  cpu: {
    /** CPUs of CFS quota (0: no quota). */
    count: number;
    /** CPU time used by every process of the sandbox since it started (cpuacct.usage). */
    usageSeconds: number | null;
    /** Average use over `windowMs` before the reading, in percent of one CPU (200: two CPUs busy). */
    percent: number | null;
    windowMs: number | null;
    /** Time its processes waited because the quota was used up (cpu.stat throttled_time). */
    throttledSeconds: number | null;
  };
  memory: { usedBytes: number | null; limitBytes: number | null; peakBytes: number | null; cacheBytes: number | null; oomKills: number };
  /** The writable layer: what is written there and its size (statfs). */
  disk: { usedBytes: number | null; limitBytes: number | null };
  /** Bytes through its link: `rxBytes` into the sandbox, `txBytes` out of it (null: no link). */
  network: { rxBytes: number | null; txBytes: number | null; rxPackets: number | null; txPackets: number | null };
  processes: { current: number | null; limit: number | null };
}

/** A live resize (POST /sandboxes/:id/scale, ./wire-schemas.ts `scaleBody`): the fields given change, the others stay. */
export type ScaleRequest = ScaleBody;

/** The limits in force after a resize. */
export interface ScaleResult {
  memoryMB: number | null;
  cpuCount: number;
}

/** One sandbox in GET /metrics/sandboxes (owner: its owner's kind). */
export interface SandboxMetricsEntry {
  id: string;
  orgId: string;
  owner: string;
  metrics: SandboxMetrics;
}

/** One exec session's exit, as the host saw it happen (GET /exec-exits). */
export interface ExecExit {
  seq: number;
  sandboxID: string;
  sessionID: string;
  exitCode: number;
  exitedAt: string;
  oomKilled: boolean;
}

/**
 * GET /exec-exits?epoch=E&after=N&waitMs=M: the exits after `after` of this host's run `epoch`
 * (oldest first; waits up to waitMs for one). `complete` is false when some were dropped before they
 * were read (another epoch: the host restarted; or more than the host keeps): the caller then looks
 * at its open sessions itself.
 */
export interface ExecExitsAnswer {
  epoch: string;
  seq: number;
  exits: ExecExit[];
  complete: boolean;
}

/** Body of `POST /sandboxes/:id/pty` as the host has it (sizes defaulted). */
export type PtyRequest = CreatePtyBody;

/** A terminal (POST /sandboxes/:id/pty, GET /sandboxes/:id/pty/:sid). */
export interface PtyInfo {
  sessionID: string;
  sandboxID: string;
  cols: number;
  rows: number;
  running: boolean;
  exitCode: number | null;
  startedAt: string;
  attachedClients: number;
}
