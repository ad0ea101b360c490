import { trace } from '../lib/trace';
import express, { NextFunction, Request, Response } from 'express';
import expressWs from 'express-ws';
import type http from 'node:http';
import { OpenApiGeneratorV31 } from '@asteasolutions/zod-to-openapi';
import { randomUUID } from 'node:crypto';
import pinoHttp from 'pino-http';
import { ApiError } from '../contract/errors';
import { unreachableService } from '../lib/unreachable';
import { scrubUrl } from '../lib/logger';
import { createAuthenticator, Authenticator, pickSubprotocol } from './auth';
import type { ApiDeps } from './deps';
import { RouteTable } from './http';
import { ApiMetrics, authorizeMetrics, createApiMetrics } from './metrics';
import { registerAgentRoutes } from './routes/agents';
import { registerSessionRoutes } from './routes/sessions';
import { registerConversationRoutes } from './routes/conversations';
import { registerBatchRoutes } from './routes/batches';
import { registerSandboxRoutes } from './routes/sandboxes';
import { registerCheckpointRoutes } from './routes/checkpoints';
import { registerSnapshotRoutes } from './routes/snapshots';
import { registerInstanceRoutes } from './routes/instances';
import { registerCapacityRoutes } from './routes/capacity';
import { registerUsageRoutes } from './routes/usage';
import { registerPreviewRoutes } from './routes/previews';
import { registerExecRoutes } from './routes/exec';
import { registerExecSocket } from './routes/exec-socket';
import { closeWith } from './ws';
import { dataAnswerHeaders } from './answer-headers';
import { registerSandboxAgentRoutes } from './routes/sandbox-agents';
import { registerSecretStoreRoutes } from './routes/secret-stores';
import { registerFileRoutes } from './routes/files';
import { registerUnimplementedRoutes } from './routes/unimplemented';
import { registerPtyRoutes, registerPtySocket } from './routes/pty';
import { registerConsoleRoutes } from './routes/console';
import { registerConsole } from './console';
import { codecCors, registerCodecRoutes } from './routes/codec';
import { referenceOutline } from './docs-outline';
import { notReadyMessage, Readiness } from '../services/ops/readiness';
import { createServices, type Services } from '../services';

/** Body types the API reads; anything else on a request with a body is 415. */
const JSON_TYPES = ['application/json', 'application/*+json'];

/**
 * Builds the Express app: authentication, the routes of every resource, /openapi.json,
 * health checks, and one error body for every failure. Tests drive this directly.
 */
export function createApp(
  deps: ApiDeps,
  opts: { server?: http.Server; services?: Services } = {},
): { app: express.Express; auth: Authenticator; openapi: object; metrics: ApiMetrics } {
  // The services, built once (services/index.ts): the caller passes its set to share it (api/server.ts, with the preview proxy).
  const services = opts.services ?? createServices(deps);
  const app = express();
  // WebSocket routes (router.ws) need the HTTP server; without one (unit tests) they are absent.
  if (opts.server) expressWs(app, opts.server, { wsOptions: { handleProtocols: pickSubprotocol } });
  app.disable('x-powered-by');
  if (process.env.SAP_TRACE_DIR) app.use((req, _res, next) => (trace(req.url.split('/')[3] ?? '-', 'api:request-in'), next()));
  app.use(dataAnswerHeaders);
  app.set('etag', false);
  app.set('query parser', 'simple');

  const metrics = createApiMetrics(deps);
  app.use(metrics.middleware);
  app.use(
    pinoHttp({
      logger: deps.logger,
      genReqId: (req, res) => {
        const id = (req.headers['x-request-id'] as string | undefined)?.slice(0, 100) ?? randomUUID();
        res.setHeader('x-request-id', id);
        return id;
      },
      serializers: {
        req: (req: { id: string; method: string; url: string }) => ({ id: req.id, method: req.method, url: scrubUrl(req.url) }),
        res: (res: { statusCode: number }) => ({ statusCode: res.statusCode }),
      },
      // Every line of a request carries its organisation and the ids in its path (set once known).
      customProps: (req, res) => requestLogProps(req as Request, res as Response),
      autoLogging: { ignore: (req) => req.url === '/healthz' || req.url === '/readyz' || req.url === '/metrics' },
    }),
  );

  const auth = createAuthenticator(services.keys, deps.cfg.API_KEY_CACHE_MS);
  // Prometheus text format (labels hold route patterns only), for the operator: METRICS_TOKEN, an
  // operator's key, or a loopback peer when no token is set (api/metrics.ts, authorizeMetrics).
  app.get('/metrics', (req, res, next) => {
    authorizeMetrics(req, deps.cfg.METRICS_TOKEN, auth).then(
      () => metrics.handler(req, res),
      (err: unknown) => next(err),
    );
  });
  // Liveness only: the process serves HTTP. Readiness (below) asks the dependencies.
  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  const readiness = new Readiness({
    store: deps.store,
    temporal: deps.temporal,
    hosts: deps.hosts,
    namespace: deps.cfg.TEMPORAL_NAMESPACE,
    taskQueue: deps.cfg.TASK_QUEUE,
    workerMaxAgeMs: deps.cfg.READY_WORKER_MAX_AGE_MS,
  });
  app.get('/readyz', async (_req, res) => {
    const report = await readiness.check();
    const { mongo, temporal, worker, host } = report.checks;
    if (report.ok)
      res.json({ status: 'ok', mongo: mongo.message, temporal: temporal.message, worker: worker.message, host: host.message, checks: report.checks });
    else {
      const e = new ApiError('unavailable', notReadyMessage(report));
      res.status(e.status).json(e.toBody());
    }
  });

  const router = express.Router();
  const table = new RouteTable(router, auth);
  // The codec endpoint answers the Temporal UI's origin (CODEC_CORS_ORIGINS, else TEMPORAL_UI_URL's).
  app.use(codecCors(codecOrigins(deps.cfg)));
  app.use((req, _res, next) => {
    const hasBody = Number(req.headers['content-length'] ?? 0) > 0 || req.headers['transfer-encoding'] !== undefined;
    if (hasBody && !table.isRawBody(req) && ['POST', 'PUT', 'PATCH', 'DELETE'].includes(req.method) && !req.is(JSON_TYPES) && !req.is('application/x-ndjson')) {
      next(new ApiError('unsupported_media_type', 'request bodies must be JSON (Content-Type: application/json)'));
      return;
    }
    next();
  });
  app.use(
    express.json({
      limit: deps.cfg.BODY_LIMIT_BYTES,
      type: (req) => !table.isRawBody(req as Request) && Boolean((req as Request).is(JSON_TYPES)),
      strict: true,
    }),
  );
  // NDJSON bodies (batch items) reach their route as text.
  app.use(
    express.text({ limit: deps.cfg.BODY_LIMIT_BYTES, type: (req) => !table.isRawBody(req as Request) && Boolean((req as Request).is('application/x-ndjson')) }),
  );

  const { sandbox } = services;
  registerAgentRoutes(table, services.agents);
  registerSessionRoutes(table, services.sessions);
  registerConversationRoutes(table, services.conversations);
  registerBatchRoutes(table, services.batches);
  registerSandboxRoutes(table, deps, sandbox);
  registerCheckpointRoutes(table, deps, sandbox);
  registerSnapshotRoutes(table, deps, sandbox);
  registerInstanceRoutes(table, services.instances);
  registerCapacityRoutes(table, services.capacity);
  registerUsageRoutes(table, services.usage);
  registerPreviewRoutes(table, deps, sandbox);
  registerExecRoutes(table, deps, sandbox, auth);
  registerSandboxAgentRoutes(table, deps, sandbox);
  registerSecretStoreRoutes(table, services.secretStores);
  registerFileRoutes(table, deps, sandbox);
  registerUnimplementedRoutes(table, deps, sandbox);
  registerPtyRoutes(table, deps, sandbox);
  registerConsoleRoutes(table, services.console);
  registerCodecRoutes(table, services.codec, deps.cfg);
  registerExecSocket(app, deps, auth, sandbox);
  registerPtySocket(app, deps, auth, sandbox);

  const openapi = new OpenApiGeneratorV31(table.registry.definitions).generateDocument({
    openapi: '3.1.0',
    info: { title: 'Sandbox Agent Platform', version: '0.1.0', description: 'Agents, sessions and sandboxes. Authenticate with X-API-Key.' },
  });
  app.get('/openapi.json', (_req, res) => {
    res.json(openapi);
  });

  // The console's and the reference's static pages: no key (the API calls they make send one).
  registerConsole(app, referenceOutline(openapi));
  app.use(router);

  app.use((req, _res, next) => {
    // express-ws routes an upgrade as GET <path>/.websocket: name the path the client asked for.
    const path = (req as { ws?: unknown }).ws ? req.path.replace(/\/\.websocket$/, '') : req.path;
    next(new ApiError('not_found', `no route for ${(req as { ws?: unknown }).ws ? 'WebSocket' : req.method} ${path}`));
  });
  app.use((err: unknown, req: Request, res: Response, _next: NextFunction) => {
    const e = toApiError(err);
    if (e.status >= 500) req.log?.error({ err }, 'request failed');
    // An upgrade no WebSocket route took (express-ws has completed the handshake): the error body as
    // a text frame, then a policy-violation close, as the exec attach refuses.
    const ws = (req as { ws?: import('ws').WebSocket }).ws;
    if (ws) {
      closeWith(ws, e.status >= 500 ? 1011 : 1008, e.type, e.message);
      return;
    }
    if (res.headersSent) {
      res.end();
      return;
    }
    // An error answered before the request's body was read to its end (an upload refused part way,
    // say): the rest of the body is still on the connection, so it cannot carry another request.
    // Say so, and Node closes it after this answer, instead of the client reusing a connection the
    // server then drops (ECONNRESET on the client's next call).
    if (!req.complete) res.setHeader('connection', 'close');
    res.status(e.status).json(e.toBody());
  });
  return { app, auth, openapi, metrics };
}

/** Log fields of a request: its organisation (once authenticated) and the resource ids in its path. */
function requestLogProps(req: Request, res: Response): Record<string, string> {
  const out: Record<string, string> = {};
  const orgId = (res.locals as { orgId?: string }).orgId;
  if (orgId) out.orgId = orgId;
  const p = (req.params ?? {}) as Record<string, string>;
  if (p.agentId) out.agentId = p.agentId;
  const id = p.id;
  if (id?.startsWith('sess_')) Object.assign(out, { sessionId: id, workflowId: id });
  else if (id?.startsWith('batch_')) Object.assign(out, { batchId: id, workflowId: id });
  else if (id) out.resourceId = id;
  return out;
}

/**
 * JSON.parse's message without the excerpt of the body that Node puts in it (`…, "<body>" is not
 * valid JSON`, with `...` where it is cut): a body may carry a secret value, which must not come back in an error.
 */
function withoutExcerpt(message: string): string {
  return message
    .replace(/(, )?(\.\.\.)?"[\s\S]*"(\.\.\.)? is not valid JSON/, '$1the body is not valid JSON')
    .replace(/^Unexpected token '[\s\S]+?'/, 'Unexpected token');
}

/** Maps any thrown value to an ApiError; internals never reach the client. */
export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  const e = err as { type?: string; status?: number; limit?: number; message?: string };
  switch (e?.type) {
    case 'entity.parse.failed':
      return new ApiError('invalid_request', `malformed JSON body: ${withoutExcerpt(e.message ?? '')}`.trim());
    case 'entity.too.large':
      return new ApiError('payload_too_large', `request body is larger than the ${e.limit}-byte limit`);
    case 'encoding.unsupported':
    case 'charset.unsupported':
      return new ApiError('unsupported_media_type', e.message ?? 'unsupported encoding');
    case 'request.aborted':
      return new ApiError('invalid_request', 'request aborted');
  }
  if (e?.status && e.status >= 400 && e.status < 500) return new ApiError('invalid_request', e.message ?? 'bad request');
  // MongoDB or Temporal restarting is an outage the client can wait out, not a bug.
  const service = unreachableService(err);
  if (service) return new ApiError('unavailable', `${service} is unavailable; retry shortly`);
  return new ApiError('internal', 'internal error');
}

/** The origins allowed to call the codec endpoint from a browser: CODEC_CORS_ORIGINS, else the Temporal UI's. */
function codecOrigins(cfg: ApiDeps['cfg']): string[] {
  if (cfg.CODEC_CORS_ORIGINS)
    return cfg.CODEC_CORS_ORIGINS.split(',')
      .map((o) => o.trim())
      .filter(Boolean);
  return cfg.TEMPORAL_UI_URL ? [new URL(cfg.TEMPORAL_UI_URL).origin] : [];
}
