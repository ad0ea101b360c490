/**
 * The contract between the sandbox host (one long-lived process per machine that owns every
 * sandbox on it) and its clients: the worker's activities and the API's sandbox routes.
 * The host serves it as JSON over HTTP (see sandbox/host/server.ts); HostClient speaks it.
 */

/** Who a sandbox's processes run as (see CreateSandboxRequest.user). */
export type SandboxUser = 'root' | 'sandbox';

/** What to create. Everything but `id` is optional. */
export interface CreateSandboxRequest {
  /** `sb-<id>`; chosen by the caller so that a retried create is idempotent. */
  id: string;
  /** Organisation that owns the sandbox (recorded, never interpreted by the host). */
  orgId: string;
  /** Who asked for it, so leftovers can be reaped: e.g. { kind: 'session', id: 'sess_…' }. */
  owner?: { kind: 'session' | 'instance' | 'api' | 'snapshot'; id: string };
  /** Read-only layers to stack under the sandbox's writable layer, topmost first (checkpoint ids). */
  layers?: string[];
  /** Environment of every process started in the sandbox. */
  envs?: Record<string, string>;
  /**
   * Sealed secrets (docs/sealed-secrets.md): each becomes the env variable `name` holding a
   * placeholder made by the host; the host's egress proxy keeps the value (sealed with its own key)
   * and puts it into requests to `allowedHosts` only. Never echoed in any answer.
   */
  sealedSecrets?: { name: string; value: string; allowedHosts: string[]; injectInto?: string[] }[];
  /** Host-internal (a hibernated sandbox made again; never accepted over HTTP): its sealed secrets as they were kept. */
  restoredSealed?: { placeholder: string; name: string; hosts: string[]; inject?: string[]; box: string }[];
  /** Default working directory (absolute) of every process started in the sandbox; default /workspace. */
  cwd?: string;
  /**
   * Who its processes run as (patches excepted: they run as root): `root` (default) or `sandbox`
   * (uid 1000, HOME=/home/sandbox, no capabilities, passwordless sudo to sandbox root; docs/isolation.md).
   * Files the host writes for it (the files API, `files`) are then owned by that user.
   */
  user?: SandboxUser;
  /**
   * Resource limits (cgroups and the writable layer's size). Absent: the host's defaults
   * (SANDBOX_MEMORY_MB, SANDBOX_DISK_MB, …); the host clamps nothing: callers check the operator's maxima.
   */
  memoryMB?: number;
  cpuCount?: number;
  maxProcesses?: number;
  /** Size of the writable layer (everything the sandbox writes to its filesystem); writes past it get ENOSPC. */
  diskMB?: number;
  /**
   * What the sandbox may reach over the network (see sandbox/network.ts): `internet` (default),
   * `none`, or `{ allow: [IPv4 CIDR, host name or *.wildcard…] }`. The host itself, link-local, other sandboxes and private
   * ranges are refused whatever the policy.
   */
  network?: { egress: 'internet' | 'none' | { allow: string[] } };
  /** Files written before anything runs: absolute path inside the sandbox → UTF-8 content. */
  files?: Record<string, string>;
  /** Scripts run with bash, in order, before anything else (checkpoint patches). */
  patches?: { id: string; script: string }[];
  /**
   * A patch that exits non-zero: by default the create fails with patch_failed (nothing is left);
   * with true the chain stops there and the sandbox is kept with the patches before it (the failed
   * one's outcome is the last of the answer's `patches`; the ones after it did not run).
   */
  keepOnPatchFailure?: boolean;
  /** Started right after creation, detached: the sandbox's main process (a session's entrypoint). */
  entrypoint?: EntrypointSpec;
  /** Free-form labels kept with the sandbox. */
  metadata?: Record<string, string>;
  /**
   * With an entrypoint: wait up to `waitMs` for it to exit before answering and, when it has,
   * read `readFile` too, so that a short task is one call (see CreatedSandbox).
   */
  awaitExit?: { waitMs: number; readFile?: { path: string; maxBytes: number }; readLog?: { maxBytes: number } };
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

/** The main process of a sandbox. It survives restarts of the host's clients (and of the host). */
export interface EntrypointSpec {
  argv: string[];
  env?: Record<string, string>;
  cwd?: string;
  /** Killed after this many seconds; its exit is then reported with `timedOut: true`. */
  timeoutSeconds?: number;
}

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

/** Body of `POST /sandboxes/:id/exec` (a command run inside a live sandbox). */
export interface ExecRequest {
  cmd: string;
  args?: string[];
  envs?: Record<string, string>;
  cwd?: string;
  /** Seconds before the command is killed (SIGKILL to its process group); default: no limit. */
  timeout?: number;
  /** Seconds the command keeps running once its last WebSocket client has left; default: no limit. */
  maxRunAfterDisconnect?: number;
  /**
   * The session's id (`es-` and 16 hex digits), chosen by the control plane so that it records the
   * session while the host starts the command; absent: the host makes one. A host that has it already answers conflict.
   */
  sessionID?: string;
}

/** What ExecRequest.sessionID must look like. */
export const EXEC_SESSION_ID = /^es-[0-9a-f]{16}$/;

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

/** A live resize (POST /sandboxes/:id/scale): the fields given change, the others stay. */
export interface ScaleRequest {
  memoryMB?: number;
  cpuCount?: number;
}

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
