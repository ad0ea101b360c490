/**
 * The sandbox host's wire contract, declared once: every HTTP route (its method, its path, the zod
 * schema of its `{ params, query, body }` and the type of its JSON answer), the upgrade routes
 * (WebSockets and port tunnels) and the exec frames (./exec-frames.ts). Both sides derive from it:
 * the host registers each route at its declared method and path and validates requests with its
 * schema (sandbox/host/serve.ts; the schemas are built once, when this module loads); HostClient
 * (./client.ts) sends each call to the declared method and path, its request types inferred from the
 * same schemas and its answer types from `answer`. test/unit/host-wire.test.ts checks that the host's
 * app serves exactly the routes declared here.
 *
 * Pure: it imports zod, contract/ and the rest of host-contract/, nothing of the host's runtime
 * (.dependency-cruiser.cjs `host-contract-is-pure`).
 */
import { z } from 'zod';
import type { HostCapacity } from '../../contract/hosts';
import * as s from './wire-schemas';
import type {
  CreatedSandbox,
  EntrypointStatus,
  ExecExitsAnswer,
  ExecRunResult,
  ExecSessionInfo,
  PtyInfo,
  SandboxEntry,
  SandboxInfo,
  SandboxMetrics,
  SandboxMetricsEntry,
  ScaleResult,
  WireEntrypointLog,
} from './types';

export { FRAME_EXIT, FRAME_SCROLLBACK_END, FRAME_STDERR, FRAME_STDIN, FRAME_STDOUT, decodeExecFrame, encodeStdinFrame, type ExecFrame } from './exec-frames';

export type HostMethod = 'GET' | 'POST' | 'PUT' | 'DELETE';

/** The type of a route's answer, carried by the declaration at the type level only (nothing at run time). */
export interface Answer<A> {
  readonly __answer: A;
}
/** A route whose answer is a stream of bytes, not JSON (a file's content, a layer's archive). */
export interface Streamed {
  readonly streamed: true;
}

/** One route of the host: method, path (express syntax, `:name` parameters) and request schema. */
export interface HostRoute<S extends z.ZodType = z.ZodType, A = unknown> {
  readonly method: HostMethod;
  readonly path: string;
  /** The schema of `{ params, query, body }`: what the host accepts. */
  readonly request: S;
  readonly answer: Answer<A>;
}

/** What the host has once it validated a request (defaults filled in, queries coerced). */
export type RouteInput<R extends HostRoute> = z.output<R['request']>;
/** What a client sends: `{ params, query, body }` before the host's defaults and coercions. */
export type RouteRequest<R extends HostRoute> = z.input<R['request']>;
/** The JSON a route answers with. */
export type RouteAnswer<R extends HostRoute> = R extends HostRoute<z.ZodType, infer A> ? A : never;

const answer = <A>(): Answer<A> => ({}) as Answer<A>;
const route = <S extends z.ZodType, A>(method: HostMethod, path: string, request: S, _answer: Answer<A>): HostRoute<S, A> => ({
  method,
  path,
  request,
  answer: _answer,
});

const byId = z.object({ params: s.idParams });
const bySession = z.object({ params: s.sessionParams });
const byLayer = z.object({ params: s.layerParams });
const byPort = z.object({ params: s.portParams });
const fsPath = z.object({ params: s.idParams, query: s.fsPathQuery });
type Content = { content: string; size: number };

/** Every HTTP route of the host. */
export const hostRoutes = {
  /** Liveness and load (no token needed). */
  health: route('GET', '/healthz', z.object({}), answer<{ ok: boolean; hostId: string; provider: string } & HostCapacity>()),

  // Sandboxes.
  createSandbox: route('POST', '/sandboxes', z.object({ body: s.createSandboxBody }), answer<CreatedSandbox>()),
  listSandboxes: route('GET', '/sandboxes', z.object({ query: z.object({ owner: z.string().optional() }) }), answer<SandboxInfo[]>()),
  getSandbox: route('GET', '/sandboxes/:id', byId, answer<SandboxInfo>()),
  setNetwork: route('PUT', '/sandboxes/:id/network', z.object({ params: s.idParams, body: s.networkBody }), answer<SandboxInfo>()),
  destroySandbox: route('DELETE', '/sandboxes/:id', byId, answer<{ destroyed: boolean }>()),
  writeFile: route('PUT', '/sandboxes/:id/files', z.object({ params: s.idParams, body: s.writeFileBody }), answer<{ path: string; size: number }>()),
  readFile: route(
    'GET',
    '/sandboxes/:id/files',
    z.object({ params: s.idParams, query: z.object({ path: z.string().min(1), maxBytes: z.coerce.number().int().positive().optional() }) }),
    answer<Content>(),
  ),

  // The entrypoint.
  startEntrypoint: route('POST', '/sandboxes/:id/entrypoint', z.object({ params: s.idParams, body: s.entrypointSpec }), answer<EntrypointStatus>()),
  entrypointStatus: route(
    'GET',
    '/sandboxes/:id/entrypoint',
    z.object({ params: s.idParams, query: z.object({ waitMs: z.coerce.number().int().min(0).optional() }) }),
    answer<EntrypointStatus>(),
  ),
  entrypointLog: route(
    'GET',
    '/sandboxes/:id/entrypoint/log',
    z.object({
      params: s.idParams,
      query: z.object({
        maxBytes: z.coerce
          .number()
          .int()
          .positive()
          .max(64 * 1024 * 1024)
          .default(1024 * 1024),
        sinceStdout: z.coerce.number().int().min(0).optional(),
        sinceStderr: z.coerce.number().int().min(0).optional(),
      }),
    }),
    answer<WireEntrypointLog>(),
  ),
  entrypointOutput: route(
    'GET',
    '/sandboxes/:id/entrypoint/output',
    z.object({
      params: s.idParams,
      query: z.object({ stream: z.enum(['stdout', 'stderr']).default('stdout'), maxBytes: z.coerce.number().int().positive().optional() }),
    }),
    answer<Content>(),
  ),

  // Checkpoints, hibernation and layers.
  createCheckpoint: route(
    'POST',
    '/sandboxes/:id/checkpoints',
    z.object({ params: s.idParams, body: z.object({ checkpointId: z.string().min(1) }) }),
    answer<{ layerId: string; parents: string[]; sizeBytes?: number }>(),
  ),
  hibernate: route(
    'POST',
    '/sandboxes/:id/hibernate',
    z.object({ params: s.idParams, body: z.object({ layerId: z.string().min(1) }) }),
    answer<{ layerId: string; parents: string[] }>(),
  ),
  wake: route('POST', '/sandboxes/:id/wake', z.object({ params: s.idParams, body: s.wakeBody }), answer<SandboxInfo>()),
  restore: route('POST', '/sandboxes/:id/restore', z.object({ params: s.idParams, body: s.restoreBody }), answer<SandboxInfo>()),
  deleteLayer: route('DELETE', '/layers/:layerId', byLayer, answer<{ deleted: boolean }>()),
  layerHash: route('GET', '/layers/:layerId/hash', byLayer, answer<{ layerId: string; sha256: string }>()),
  /** The layer as a tar archive; its content hash in the `x-layer-sha256` header. */
  layerArchive: route('GET', '/layers/:layerId/archive', byLayer, answer<Streamed>()),
  fetchLayer: route(
    'POST',
    '/layers/:layerId/fetch',
    z.object({ params: s.layerParams, body: z.object({ from: z.url({ protocol: /^https?$/ }) }) }),
    answer<{ layerId: string; fetched: string[]; ms: number }>(),
  ),

  // Ports (previews).
  openPortForward: route('POST', '/sandboxes/:id/ports/:port/forward', byPort, answer<{ socketPath: string; machine?: string }>()),
  closePortForward: route('DELETE', '/sandboxes/:id/ports/:port/forward', byPort, answer<{ closed: true }>()),

  // Resources.
  sandboxMetrics: route('GET', '/sandboxes/:id/metrics', byId, answer<SandboxMetrics>()),
  scaleSandbox: route('POST', '/sandboxes/:id/scale', z.object({ params: s.idParams, body: s.scaleBody }), answer<ScaleResult>()),
  busiestSandboxes: route(
    'GET',
    '/metrics/sandboxes',
    z.object({ query: z.object({ limit: z.coerce.number().int().min(0).max(1000).default(100) }) }),
    answer<{ total: number; sandboxes: SandboxMetricsEntry[] }>(),
  ),

  // Exec sessions.
  execExits: route(
    'GET',
    '/exec-exits',
    z.object({ query: z.object({ epoch: z.string().max(64).optional(), after: z.coerce.number().int().min(0).default(0), waitMs: s.execWaitMs }) }),
    answer<ExecExitsAnswer>(),
  ),
  execRun: route('POST', '/sandboxes/:id/exec/run', z.object({ params: s.idParams, body: s.execRunBody }), answer<ExecRunResult>()),
  createExec: route('POST', '/sandboxes/:id/exec', z.object({ params: s.idParams, body: s.execBody }), answer<ExecSessionInfo>()),
  listExec: route('GET', '/sandboxes/:id/exec', byId, answer<ExecSessionInfo[]>()),
  getExec: route('GET', '/sandboxes/:id/exec/:sid', bySession, answer<ExecSessionInfo>()),
  execResult: route(
    'GET',
    '/sandboxes/:id/exec/:sid/result',
    z.object({ params: s.sessionParams, query: z.object({ waitMs: s.execWaitMs }) }),
    answer<ExecSessionInfo & { timedOut: boolean; stdout: string; stderr: string; truncated?: boolean }>(),
  ),
  /**
   * An exec session's output as an HTTP answer on the kept-alive connections (no new connection, no
   * upgrade): 200 with `EXEC_FRAMES_TYPE`, then the WebSocket's server frames as its body, until the
   * exit frame ends it. The reader counts as an attached client. `awaitStartMs`: the session's create
   * is on its way with this id (an `es-` id the control plane chose); the host waits that long for
   * the start before answering 404.
   */
  execFrames: route(
    'GET',
    '/sandboxes/:id/exec/:sid/frames',
    z.object({ params: s.sessionParams, query: z.object({ awaitStartMs: s.execAwaitStartMs }) }),
    answer<never>(),
  ),
  killExec: route(
    'POST',
    '/sandboxes/:id/exec/:sid/kill',
    z.object({ params: s.sessionParams, body: z.object({ signal: z.string().optional() }).optional() }),
    answer<ExecSessionInfo>(),
  ),

  // The filesystem, streamed (sandbox/host/files.ts).
  downloadFile: route('GET', '/sandboxes/:id/fs', fsPath, answer<Streamed>()),
  /** The request's body is the file's bytes (application/octet-stream). */
  uploadFile: route(
    'PUT',
    '/sandboxes/:id/fs',
    z.object({ params: s.idParams, query: s.fsPathQuery.extend({ mode: s.fileMode }) }),
    answer<{ path: string; size: number }>(),
  ),
  listDir: route('GET', '/sandboxes/:id/fs/list', fsPath, answer<SandboxEntry[]>()),
  statPath: route(
    'GET',
    '/sandboxes/:id/fs/stat',
    z.object({ params: s.idParams, query: s.fsPathQuery.extend({ noFollow: s.queryFlag.optional() }) }),
    answer<SandboxEntry>(),
  ),
  makeDir: route('POST', '/sandboxes/:id/fs/mkdir', z.object({ params: s.idParams, body: z.object({ path: z.string().min(1) }) }), answer<SandboxEntry>()),
  renamePath: route(
    'POST',
    '/sandboxes/:id/fs/rename',
    z.object({ params: s.idParams, body: z.object({ from: z.string().min(1), to: z.string().min(1) }) }),
    answer<SandboxEntry>(),
  ),
  removePath: route(
    'DELETE',
    '/sandboxes/:id/fs',
    z.object({ params: s.idParams, query: s.fsPathQuery.extend({ recursive: s.queryFlag.default(true) }) }),
    answer<{ removed: true; path: string }>(),
  ),

  // Terminals.
  createPty: route('POST', '/sandboxes/:id/pty', z.object({ params: s.idParams, body: s.createPtyBody }), answer<PtyInfo>()),
  getPty: route('GET', '/sandboxes/:id/pty/:sid', bySession, answer<PtyInfo>()),
} as const;

export type HostRoutes = typeof hostRoutes;

/** The content type of `execFrames` answers: WebSocket server frames, one after the other (./frames.ts). */
export const EXEC_FRAMES_TYPE = 'application/x-sap-exec-frames';

/** The upgrade with which `hostSockets.tunnel` is asked for (`Upgrade: sap-tunnel`). */
export const TUNNEL_PROTOCOL = 'sap-tunnel';

/**
 * The host's upgrade routes (bearer token in `authorization`, as the HTTP routes): an exec session's
 * WebSocket (frames: ./exec-frames.ts), a terminal's WebSocket (keystrokes, `ptyResizeMessage`, and
 * output) and a raw byte pipe to a port inside the sandbox (`Upgrade: sap-tunnel`).
 */
export const hostSockets = {
  exec: '/sandboxes/:id/exec/:sid/ws',
  pty: '/sandboxes/:id/pty/:sid/ws',
  tunnel: '/sandboxes/:id/ports/:port/tunnel',
} as const;

/** A declared path with its `:name` parameters filled in (each URI-encoded). */
export function hostPath(path: string, params: Readonly<Record<string, unknown>> = {}): string {
  if (!path.includes(':')) return path;
  return path.replace(/:(\w+)/g, (_, name: string) => encodeURIComponent(String(params[name])));
}

/**
 * A RegExp matching a declared path whole, one capture group per `:name` parameter in order;
 * `pattern[name]` overrides a parameter's pattern (default: one path segment).
 */
export function hostPathPattern(path: string, pattern: Readonly<Record<string, string>> = {}): RegExp {
  const parts = path
    .split(/(:\w+)/)
    .map((part) => (part.startsWith(':') ? `(${pattern[part.slice(1)] ?? '[^/]+'})` : part.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')));
  return new RegExp(`^${parts.join('')}$`);
}
