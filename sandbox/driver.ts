/**
 * The driver interface for the thing that varies: how a sandbox is isolated. `namespaces` (the
 * project's own helpers: user namespaces, overlayfs, seccomp, cgroups; the default) and `process` (no
 * isolation, for development) implement it; the host daemon is the only caller. This module imports
 * no driver: `createSandboxProvider({ kind })` in ./factory picks one.
 */
import type { ChildProcess } from 'node:child_process';
import type { Logger } from 'pino';
import type { CreateSandboxRequest, EntrypointSpec, EntrypointStatus, SandboxInfo, SandboxMetrics, ScaleRequest, ScaleResult } from './host-contract/types';

/** Which provider a host runs. */
export type ProviderKind = 'namespaces' | 'process';

/** One piece of an entrypoint's output: its stream, when the helper read it (ms since the epoch; null: not recorded). */
export interface EntrypointLogChunk {
  stream: 'stdout' | 'stderr';
  at: number | null;
  /** Where the chunk starts in its stream (bytes from the stream's beginning). */
  offset: number;
  data: Buffer;
}

/** An entrypoint's output in order (see BaseProvider.entrypointLog). */
export interface EntrypointLog {
  chunks: EntrypointLogChunk[];
  /** Each stream's whole size, and whether the chunks start after its beginning. */
  bytes: { stdout: number; stderr: number };
  truncated: { stdout: boolean; stderr: boolean };
}

/** A process to run inside a live sandbox. */
export interface SpawnOptions {
  argv: string[];
  /** Added to the sandbox's environment. */
  env?: Record<string, string>;
  /** Working directory inside the sandbox; default /workspace. */
  cwd?: string;
  /** Run as this user instead of the sandbox's own (CreateSandboxRequest.user); patches run as root. */
  user?: import('./host-contract/types').SandboxUser;
  /**
   * Run on a pseudo-terminal of the sandbox (stdin/stdout are the terminal; stderr is the helper's
   * own messages); the child's fd 3 (stdio[3]) takes window sizes as "ROWS COLS\n" lines.
   */
  pty?: { rows: number; cols: number };
}

/** Filter for listing sandboxes: owner kind, optionally with the owner's id. */
export interface ListFilter {
  ownerKind?: string;
  ownerId?: string;
}

/** What `create` did: `created` is false when a sandbox with that id already existed (idempotent create). */
export interface CreateResult {
  info: SandboxInfo;
  created: boolean;
}

/** A sandbox runtime. Every method that takes an id throws SandboxError('not_found') for unknown sandboxes. */
export interface SandboxProvider {
  readonly kind: ProviderKind;

  /** Prepares the data directory and re-adopts the sandboxes found in it; returns them. */
  init(): Promise<SandboxInfo[]>;

  /**
   * Creates a sandbox, writes `files`, runs `patches` in order and starts `entrypoint` when given.
   * Idempotent on `req.id`. Throws patch_failed (after destroying what was made) when a patch fails,
   * not_found for unknown layers, invalid_request for bad input.
   */
  create(req: CreateSandboxRequest): Promise<CreateResult>;

  /** The sandbox, or null. */
  get(id: string): SandboxInfo | null;

  /** All sandboxes of this host, optionally filtered by owner. */
  list(filter?: ListFilter): SandboxInfo[];
  /** How many sandboxes are live and the sum of their memory limits in MB (0 for those without one). */
  load(): { sandboxes: number; reservedMB: number };

  /** Kills every process of the sandbox and removes it. Returns false when it did not exist. */
  destroy(id: string): Promise<boolean>;

  /** Writes a file at an absolute path inside the sandbox (parents created). */
  writeFile(id: string, path: string, content: Buffer, mode?: number): Promise<void>;

  /**
   * The running sandbox's tree, for the file operations of ./paths (stream, list, stat, mkdir,
   * rename, remove); conflict when it is stopped.
   */
  fileRoot(id: string): Promise<import('./paths').RootMap>;

  /** See BaseProvider.hibernate: checkpoint to `layerId`, keep a respawn record, destroy. */
  hibernate(id: string, layerId: string): Promise<{ layerId: string; parents: string[] }>;

  /** See BaseProvider.wake: the hibernated sandbox made again (same id), `patches` run first. */
  wake(id: string, patches?: { id: string; script: string }[], opts?: { keepOnPatchFailure?: boolean }): Promise<SandboxInfo>;

  /** See BaseProvider.restore: the running sandbox made again over checkpoint layer `layerId`. */
  restore(id: string, layerId: string, patches?: { id: string; script: string }[]): Promise<SandboxInfo>;

  /** Reads a file inside the sandbox; throws not_found or payload_too_large (over maxBytes). */
  readFile(id: string, path: string, maxBytes: number): Promise<Buffer>;

  /** Starts the sandbox's main process, detached from the host. Throws conflict when one was already started. */
  startEntrypoint(id: string, spec: EntrypointSpec): Promise<EntrypointStatus>;

  /** Current state of the entrypoint; its exit code survives restarts of the host. */
  entrypointStatus(id: string): Promise<EntrypointStatus>;

  /** Like entrypointStatus but waits up to `waitMs` for a running entrypoint to exit. */
  waitEntrypoint(id: string, waitMs: number, signal?: AbortSignal): Promise<EntrypointStatus>;

  /** The last `maxBytes` of the entrypoint's stdout or stderr (empty when none). */
  entrypointOutput(id: string, stream: 'stdout' | 'stderr', maxBytes: number): Promise<Buffer>;

  /** The entrypoint's stdout and stderr in the order written: the last maxBytes of each. */
  entrypointLog(id: string, maxBytes: number, since?: { stdout?: number; stderr?: number }): Promise<EntrypointLog>;

  /**
   * Starts a process inside the live sandbox with piped stdio. It leads its own process group:
   * signal the whole tree with `process.kill(-child.pid, signal)`. Throws conflict when the sandbox is stopped.
   */
  spawn(id: string, opts: SpawnOptions): ChildProcess;

  /** spawn, without forking the host where the provider can (exec sessions and exec/run). */
  spawnPiped(id: string, opts: SpawnOptions): Promise<import('./spawner').PipedProcess>;

  /**
   * Copies the sandbox's writable layer into a read-only layer `layerId` (which references the layers the
   * sandbox was started from). Throws conflict when the layer exists.
   */
  checkpoint(id: string, layerId: string): Promise<{ layerId: string; parents: string[]; sizeBytes?: number }>;

  /**
   * The argv prefix that runs a host program inside the sandbox's network namespace only (it keeps the
   * host's filesystem and privileges): used for the port forwarder. Empty when the provider has no network
   * namespace. Throws conflict when the sandbox is stopped.
   */
  networkArgv(id: string): string[];

  /** Replaces a running sandbox's egress policy at once (409 when it has no network or is stopped). */
  setNetwork(id: string, network: { egress: 'internet' | 'none' | { allow: string[] } }): Promise<SandboxInfo>;

  /**
   * A running sandbox's metrics and live resizes of its memory and CPU limits (see base/resources.ts);
   * not_found, or conflict when it is not running.
   */
  readonly resources: { metrics(id: string, opts?: { sample?: boolean }): Promise<SandboxMetrics>; scale(id: string, req: ScaleRequest): Promise<ScaleResult> };

  /** Deletes a layer, at once or (while a sandbox or another layer on this host uses it) once its last user is gone; false when it did not exist. */
  deleteLayer(layerId: string): Promise<boolean>;

  /** sha256 over the layer's own files (paths, types, modes, content), sorted and deterministic. */
  layerHash(layerId: string): Promise<string>;
  /** True when layer `layerId` is on this host. */
  hasLayer(layerId: string): Promise<boolean>;
  /** The layer as a tar stream with its content hash (for another host: GET /layers/:id/archive). */
  exportLayer(layerId: string): Promise<{ sha256: string; stream: NodeJS.ReadableStream; done: Promise<void> }>;
  /** Stores a layer received from another host, checked against its content hash; answers its parents. */
  importLayer(layerId: string, stream: NodeJS.ReadableStream, sha256: string): Promise<{ parents: string[] }>;

  /** Releases what the provider keeps ready for future creates (the host is stopping); sandboxes keep running. */
  close(): Promise<void>;
}

/** Options shared by every provider. */
export interface ProviderOptions {
  dataDir: string;
  /** Recorded in SandboxInfo.hostId. */
  hostId: string;
  logger?: Logger;
  /**
   * namespaces provider: the `sap-sandbox-init` helper that builds a sandbox and becomes its pid 1 (built
   * by scripts/toolchain.sh into .tools/bin). Default: that path. Required.
   */
  initHelper?: string;
  /**
   * Where sandboxes of sessions keep their files (linked from DATA_DIR/sandboxes), best a tmpfs:
   * they live only as long as their session. Default: a directory under /dev/shm when that is a
   * tmpfs, else DATA_DIR like every other sandbox; null: always DATA_DIR.
   */
  scratchDir?: string | null;
  /**
   * namespaces provider: the `sap-sandbox-enter` helper that runs a process inside a sandbox in one exec
   * (built by scripts/toolchain.sh into .tools/bin). Default: that path. Required.
   */
  enterHelper?: string;
  /** namespaces provider: the seccomp filter (scripts/toolchain.sh builds it into .tools/lib/sap-seccomp.bpf). */
  seccompFilter?: string;
  /**
   * namespaces provider: a directory mounted as every sandbox's lowest read-only layer of `/`, holding
   * opt/sap/node_modules with the Claude Agent SDK (scripts/toolchain.sh installs it at
   * .tools/agent-sdk). Default: that path when it exists (SANDBOX_AGENT_SDK_LAYER overrides it); null: none.
   */
  agentSdkLayer?: string | null;
  /**
   * namespaces provider: host uid/gid of the first sandbox's root (SANDBOX_ID_BASE). Sandbox n (a slot
   * reused once its sandbox is gone) maps its ids 0..65535 to base + n × 65536 + 0..65535.
   */
  idBase?: number;
  /**
   * namespaces provider: how many spare init helpers (cgroups joined, waiting for a create's arguments)
   * to keep ready; refilled in the background while no create runs. Default: SANDBOX_POOL_SIZE, else 32; 0: none.
   */
  poolSize?: number;
  /** namespaces provider: sandboxes' network (see network.ts). Default: from SANDBOX_NETWORK and friends; null: loopback only. */
  network?: import('./network').SandboxNetwork | null;
  /**
   * The entrypoint audit log (see audit-log.ts): one fsync'd line per entrypoint start.
   * Default: DATA_DIR/audit/entrypoints.ndjson; null: off.
   */
  auditLog?: string | null;
  /**
   * How long a host waits for an entrypoint's helper to claim its start before cancelling it (ms).
   * Default: SANDBOX_ENTRYPOINT_CLAIM_TIMEOUT_MS, else 30000.
   */
  entrypointClaimTimeoutMs?: number;
}
