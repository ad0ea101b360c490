/**
 * The sandbox host's HTTP API: JSON over HTTP, bearer-token auth; its routes and their schemas are
 * declared in ../host-contract/wire.ts (served through ./serve.ts).
 * `createApp(deps)` builds the express app; `startHost(opts)` adopts existing sandboxes and listens.
 * Sandboxes outlive the host: closing it stops only the HTTP server.
 */
import * as http from 'node:http';
import * as os from 'node:os';
import express, { type NextFunction, type Request, type Response } from 'express';
import pino, { type Logger } from 'pino';
import { effectiveResources, loadLimits, overMaximum, type SandboxLimits } from '../../config/limits';
import { loadExecLimits, type ExecLimits } from '../../config/exec-limits';
import { HOST_ERROR_STATUS, isSandboxError, SandboxError, type HostErrorType } from '../../contract/errors';
import type { ProviderKind, SandboxProvider } from '../driver';
import { createSandboxProvider } from '../factory';
import type { CreatedSandbox, WireEntrypointLog } from '../host-contract/types';
import type { EntrypointLog } from '../base';
import { bearerMatchesHeader } from './auth';
import { HostClient } from '../host-contract/client';
import type { HostCapacity } from '../../contract/hosts';
import { machineName } from '../../lib/machine';
import { scrubUrl } from '../../lib/logger';
import { trace } from '../../lib/trace';
import { attachExec, ExecManager } from './exec';
import { PortForwarder } from './forward';
import { fileRoutes } from './files';
import { resourceRoutes } from './resources';
import { PtyManager } from './pty';
import { serveOn } from './serve';
import { hostRoutes } from '../host-contract/wire';
import type { SandboxNetwork } from '../network';

/** What the app needs. */
export interface HostDeps {
  provider: SandboxProvider;
  token: string;
  logger: Logger;
  hostId: string;
  exec: ExecManager;
  /** Terminals; absent in hosts built without them. */
  pty?: PtyManager;
  /** Forwarded ports (previews); absent in hosts built without them. */
  forward?: PortForwarder;
  /** Default limits filled into a create that leaves them out, and the maxima a create may not exceed. */
  limits: SandboxLimits;
  /** At most this many live sandboxes (HOST_MAX_SANDBOXES); a create of a new one beyond it is refused. */
  maxSandboxes: number;
}

/**
 * Makes layer `layerId` (and its parents, first) present on this host, fetching what is missing from
 * `from` (streamed, checked against the sender's content hash). One fetch per layer at a time.
 * Answers the ids fetched (empty: everything was here already).
 */
async function fetchLayer(provider: SandboxProvider, from: HostClient, layerId: string, inflight: Map<string, Promise<string[]>>): Promise<string[]> {
  if (await provider.hasLayer(layerId)) return [];
  let p = inflight.get(layerId);
  if (!p) {
    p = (async () => {
      const archive = await from.layerArchive(layerId);
      const { parents } = await provider.importLayer(layerId, archive.stream, archive.sha256);
      const more: string[] = [];
      for (const parent of parents) more.push(...(await fetchLayer(provider, from, parent, inflight)));
      return [layerId, ...more];
    })().finally(() => inflight.delete(layerId));
    inflight.set(layerId, p);
  }
  return p;
}

/** HOST_MAX_SANDBOXES by default: one sandbox per 64 MB of the machine's memory, at least 16. */
export function defaultMaxSandboxes(totalMemoryBytes = os.totalmem()): number {
  return Math.max(16, Math.floor(totalMemoryBytes / (64 * 1024 * 1024)));
}

const MAX_WAIT_MS = 30_000;
const DEFAULT_READ_MAX = 16 * 1024 * 1024;

/** Constant-time check of `Authorization: Bearer <token>`. */
export const bearerMatches = bearerMatchesHeader;

function sendError(res: Response, type: HostErrorType, message: string): void {
  res.status(HOST_ERROR_STATUS[type]).json({ error: { type, message } });
}

/** A file for CreatedSandbox.file: its content, missing, too large, or undefined on any other failure. */
async function readIfPossible(provider: SandboxProvider, id: string, p: string, maxBytes: number): Promise<CreatedSandbox['file']> {
  try {
    return { content: (await provider.readFile(id, p, maxBytes)).toString('base64') };
  } catch (err) {
    if (isSandboxError(err) && err.type === 'not_found') return { missing: true };
    if (isSandboxError(err) && err.type === 'payload_too_large') return { tooLarge: true };
    return undefined;
  }
}

/** Builds the host's express app. */
export function createApp(deps: HostDeps): express.Express {
  const { provider, logger } = deps;
  const app = express();
  app.disable('x-powered-by');
  /** Layer fetches under way, by layer id (POST /layers/:id/fetch). */
  const inflight = new Map<string, Promise<string[]>>();
  const serve = serveOn(app);

  // Before the token's check: liveness needs none.
  app.get(hostRoutes.health.path, (_req, res) => {
    const capacity: HostCapacity = {
      ...provider.load(),
      maxSandboxes: deps.maxSandboxes,
      memoryMB: Math.floor(os.totalmem() / (1024 * 1024)),
    };
    res.json({ ok: true, hostId: deps.hostId, provider: provider.kind, ...capacity });
  });

  app.use((req, res, next) => {
    trace(req.path.split('/')[2] ?? '-', 'host:request-in');
    if (!bearerMatches(req.headers.authorization, deps.token)) return sendError(res, 'unauthorized', 'missing or wrong bearer token');
    next();
  });
  app.use(express.json({ limit: '256mb' }));

  serve(hostRoutes.createSandbox, async ({ body }, res) => {
    trace(body.id, 'host:create-parsed');
    const { awaitExit, ...given } = body;
    const over = overMaximum(deps.limits, given, 'body.');
    if (over) throw new SandboxError('invalid_request', over);
    // A host at its limit takes nothing new (placement should not have sent it; this is the guard).
    if (!provider.get(given.id) && provider.load().sandboxes >= deps.maxSandboxes) {
      throw new SandboxError('unavailable', `sandbox host ${deps.hostId} is at its limit of ${deps.maxSandboxes} sandboxes (HOST_MAX_SANDBOXES)`);
    }
    // Every sandbox gets limits: the caller's, else this host's defaults.
    const spec = { ...given, ...effectiveResources(deps.limits, given) };
    const { info, created } = await provider.create(spec);
    const answer: CreatedSandbox = info;
    if (awaitExit && spec.entrypoint) {
      const ac = new AbortController();
      res.on('close', () => ac.abort());
      answer.entrypoint = await provider.waitEntrypoint(info.id, Math.min(awaitExit.waitMs, MAX_WAIT_MS), ac.signal);
      const want = awaitExit.readFile;
      if (want && answer.entrypoint.state === 'exited') answer.file = await readIfPossible(provider, info.id, want.path, want.maxBytes);
      if (awaitExit.readLog && answer.entrypoint.state === 'exited') answer.log = wireLog(await provider.entrypointLog(info.id, awaitExit.readLog.maxBytes));
    }
    trace(info.id, 'host:create-answer');
    res.status(created ? 201 : 200).json(answer);
  });

  serve(hostRoutes.listSandboxes, async ({ query }, res) => {
    const [ownerKind, ownerId] = (query.owner ?? '').split(':');
    res.json(provider.list({ ownerKind: ownerKind || undefined, ownerId: ownerId || undefined }));
  });

  serve(hostRoutes.getSandbox, async ({ params }, res) => {
    const info = provider.get(params.id);
    if (!info) throw new SandboxError('not_found', `sandbox ${params.id} not found`);
    res.json(info);
  });

  serve(hostRoutes.setNetwork, async ({ params, body }, res) => {
    res.json(await provider.setNetwork(params.id, body));
  });

  serve(hostRoutes.destroySandbox, async ({ params }, res) => {
    deps.exec.dropSandbox(params.id);
    deps.pty?.dropSandbox(params.id);
    deps.forward?.dropSandbox(params.id);
    res.json({ destroyed: await provider.destroy(params.id) });
  });

  serve(hostRoutes.writeFile, async ({ params, body }, res) => {
    const content = Buffer.from(body.content, body.encoding === 'base64' ? 'base64' : 'utf8');
    await provider.writeFile(params.id, body.path, content, body.mode);
    res.json({ path: body.path, size: content.length });
  });

  serve(hostRoutes.readFile, async ({ params, query }, res) => {
    const buf = await provider.readFile(params.id, query.path, query.maxBytes ?? DEFAULT_READ_MAX);
    res.json({ content: buf.toString('base64'), size: buf.length });
  });

  serve(hostRoutes.startEntrypoint, async ({ params, body }, res) => {
    res.status(201).json(await provider.startEntrypoint(params.id, body));
  });

  serve(hostRoutes.entrypointStatus, async ({ params, query }, res) => {
    const ac = new AbortController();
    res.on('close', () => ac.abort());
    const status = await provider.waitEntrypoint(params.id, Math.min(query.waitMs ?? 0, MAX_WAIT_MS), ac.signal);
    res.json(status);
  });

  serve(hostRoutes.entrypointLog, async ({ params, query }, res) => {
    res.json(wireLog(await provider.entrypointLog(params.id, query.maxBytes, { stdout: query.sinceStdout, stderr: query.sinceStderr })));
  });

  serve(hostRoutes.entrypointOutput, async ({ params, query }, res) => {
    const buf = await provider.entrypointOutput(params.id, query.stream, query.maxBytes ?? 1024 * 1024);
    res.json({ content: buf.toString('base64'), size: buf.length });
  });

  serve(hostRoutes.createCheckpoint, async ({ params, body }, res) => {
    res.status(201).json(await provider.checkpoint(params.id, body.checkpointId));
  });

  // Hibernate and restore end the sandbox's processes: its exec sessions and forwards go first.
  serve(hostRoutes.hibernate, async ({ params, body }, res) => {
    deps.exec.dropSandbox(params.id);
    deps.pty?.dropSandbox(params.id);
    deps.forward?.dropSandbox(params.id);
    res.json(await provider.hibernate(params.id, body.layerId));
  });

  serve(hostRoutes.wake, async ({ params, body }, res) => {
    res.json(await provider.wake(params.id, body.patches, { keepOnPatchFailure: body.keepOnPatchFailure }));
  });

  serve(hostRoutes.restore, async ({ params, body }, res) => {
    deps.exec.dropSandbox(params.id);
    deps.pty?.dropSandbox(params.id);
    deps.forward?.dropSandbox(params.id);
    res.json(await provider.restore(params.id, body.layerId, body.patches));
  });

  serve(hostRoutes.deleteLayer, async ({ params }, res) => {
    res.json({ deleted: await provider.deleteLayer(params.layerId) });
  });

  serve(hostRoutes.layerHash, async ({ params }, res) => {
    res.json({ layerId: params.layerId, sha256: await provider.layerHash(params.layerId) });
  });

  // Layers move between hosts: another host streams this one's archive (x-layer-sha256 = its content hash)…
  serve(hostRoutes.layerArchive, async ({ params }, res) => {
    const { sha256, stream, done } = await provider.exportLayer(params.layerId);
    res.writeHead(200, { 'content-type': 'application/x-tar', 'x-layer-sha256': sha256 });
    stream.pipe(res);
    done.catch((err: Error) => {
      logger.error({ err, layerId: params.layerId }, 'layer archive failed');
      res.destroy(err);
    });
  });

  // …and fetches a layer it lacks (with its parents) from the host that has it.
  serve(hostRoutes.fetchLayer, async ({ params, body }, res) => {
    const started = Date.now();
    const fetched = await fetchLayer(provider, new HostClient({ url: body.from, token: deps.token }), params.layerId, inflight);
    res.json({ layerId: params.layerId, fetched, ms: Date.now() - started });
  });

  // Port forwarding for previews: a Unix socket on this machine that reaches 127.0.0.1:<port> inside.
  serve(hostRoutes.openPortForward, async ({ params }, res) => {
    if (!deps.forward) throw new SandboxError('internal', 'port forwarding is not available on this host');
    // The machine's name tells a client whether it can use the socket itself (same machine) or must
    // tunnel through this host (GET …/ports/:port/tunnel with Upgrade: sap-tunnel, see exec.ts).
    res.json({ socketPath: await deps.forward.open(params.id, params.port), machine: machineName() });
  });

  serve(hostRoutes.closePortForward, async ({ params }, res) => {
    await deps.forward?.close(params.id, params.port);
    res.json({ closed: true });
  });

  deps.exec.routes(serve);
  fileRoutes(serve, provider);
  resourceRoutes(serve, provider, deps.limits);
  deps.pty?.routes(serve);

  app.use((_req: Request, res: Response) => sendError(res, 'not_found', 'no such route'));

  app.use((err: unknown, req: Request, res: Response, _next: NextFunction) => {
    void _next;
    if (isSandboxError(err)) return sendError(res, err.type, err.message);
    const e = err as { type?: string; status?: number; message?: string };
    if (e.type === 'entity.parse.failed') return sendError(res, 'invalid_request', `invalid JSON body: ${e.message}`);
    if (e.type === 'entity.too.large') return sendError(res, 'payload_too_large', 'request body too large');
    logger.error({ err, method: req.method, url: scrubUrl(req.url ?? '') }, 'request failed');
    sendError(res, 'internal', (err as Error)?.message ?? 'internal error');
  });
  return app;
}

/** Options of an in-process host (main.ts reads them from the environment). */
export interface StartHostOptions {
  dataDir: string;
  token: string;
  /** A provider kind, or a ready provider. Default 'namespaces'. */
  provider?: ProviderKind | SandboxProvider;
  hostId?: string;
  /** `host:port`; default 127.0.0.1:7300 (port 0 picks a free one). */
  listen?: string;
  logger?: Logger;
  /** See ProviderOptions.scratchDir. */
  scratchDir?: string | null;
  /** Default limits and maxima of sandboxes; default: from the SANDBOX_* environment variables (config/limits.ts). */
  limits?: SandboxLimits;
  /** See ProviderOptions.auditLog (default DATA_DIR/audit/entrypoints.ndjson; null: off). */
  auditLog?: string | null;
  /** See ProviderOptions.network (default: from SANDBOX_NETWORK and friends; null: loopback only). */
  network?: SandboxNetwork | null;
  /** HOST_MAX_SANDBOXES; default defaultMaxSandboxes(). */
  maxSandboxes?: number;
  /** Exec's limits; default: from the EXEC_* environment variables (config/exec-limits.ts). */
  execLimits?: ExecLimits;
}

/** An entrypoint's log as JSON: each chunk's bytes in base64. */
function wireLog(log: EntrypointLog): WireEntrypointLog {
  return { ...log, chunks: log.chunks.map((c) => ({ stream: c.stream, at: c.at, offset: c.offset, data: c.data.toString('base64') })) };
}

/** A running host. `close()` stops the HTTP server, exec sessions' sockets and the provider's spare init; sandboxes keep running. */
export interface RunningHost {
  url: string;
  provider: SandboxProvider;
  close(): Promise<void>;
}

/** Starts a host: adopts the sandboxes under dataDir, then listens. Throws if it cannot listen. */
export async function startHost(opts: StartHostOptions): Promise<RunningHost> {
  if (!opts.token) throw new Error('a host token is required');
  const logger = opts.logger ?? pino({ level: 'silent' });
  // Before anything is adopted: a bad SANDBOX_* variable fails the start.
  const limits = opts.limits ?? loadLimits(process.env);
  const hostId = opts.hostId ?? os.hostname();
  const provider =
    typeof opts.provider === 'object'
      ? opts.provider
      : createSandboxProvider({
          kind: opts.provider ?? 'namespaces',
          dataDir: opts.dataDir,
          hostId,
          logger,
          scratchDir: opts.scratchDir,
          auditLog: opts.auditLog,
          ...(opts.network !== undefined ? { network: opts.network } : {}),
        });
  await provider.init();
  const exec = new ExecManager(provider, logger, opts.execLimits ?? loadExecLimits(process.env));
  const pty = new PtyManager(provider, logger);
  const forward = new PortForwarder(provider, opts.dataDir, logger);
  const app = createApp({ provider, token: opts.token, logger, hostId, exec, pty, forward, limits, maxSandboxes: opts.maxSandboxes ?? defaultMaxSandboxes() });
  const server = http.createServer(app);
  // Workers and APIs keep connections to the host open between calls; keep idle ones for a minute
  // (Node's default is 5 s), so that a pause between bursts does not close them under the clients.
  server.keepAliveTimeout = 65_000;
  attachExec(server, exec, opts.token, pty, (id, port) => forward.open(id, port));
  const [host, portText] = splitListen(opts.listen ?? '127.0.0.1:7300');
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(Number(portText), host, () => resolve());
  });
  const addr = server.address() as import('node:net').AddressInfo;
  const url = `http://${addr.family === 'IPv6' ? `[${addr.address}]` : addr.address}:${addr.port}`;
  logger.info({ url, hostId, provider: provider.kind, limits }, 'sandbox host listening');
  return {
    url,
    provider,
    close: async () => {
      exec.close();
      pty.close();
      forward.closeAll();
      await provider.close();
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
    },
  };
}

/** Splits `host:port` (IPv6 hosts in brackets). */
export function splitListen(listen: string): [string, string] {
  const m = /^\[?([^\]]*)\]?:(\d+)$/.exec(listen);
  if (!m) throw new Error(`invalid listen address: ${listen} (expected host:port)`);
  return [m[1], m[2]];
}
