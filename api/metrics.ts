import { createHash, timingSafeEqual } from 'node:crypto';
import type { NextFunction, Request, Response } from 'express';
import { ApiError } from '../contract/errors';
import type { Authenticator } from './auth';
import client from 'prom-client';
import type { ApiDeps } from './deps';
import { runningBatchItems } from '../services/sessions/batches';

/**
 * The API's Prometheus metrics (one registry per app): HTTP latency by route and status, sessions
 * and batches created, batch items by state in running batches, preview proxy requests, and the
 * process's default metrics. Labels hold route patterns, never URLs, ids or keys.
 */
export interface ApiMetrics {
  registry: client.Registry;
  httpDuration: client.Histogram<'method' | 'route' | 'status'>;
  sessionsCreated: client.Counter;
  batchesCreated: client.Counter;
  batchItemsSubmitted: client.Counter;
  proxyRequests: client.Counter<'kind'>;
  /** Express middleware timing every request by its matched route. */
  middleware(req: Request, res: Response, next: NextFunction): void;
  /** Express handler answering the text exposition format. */
  handler(req: Request, res: Response): Promise<void>;
}

/** How long the batch-item gauge may serve its last reading (it scans the running batches). */
const BATCH_GAUGE_TTL_MS = 5000;

export function createApiMetrics(deps: Pick<ApiDeps, 'store'>): ApiMetrics {
  const registry = new client.Registry();
  client.collectDefaultMetrics({ register: registry, prefix: 'sap_api_' });
  const httpDuration = new client.Histogram({
    name: 'sap_http_request_duration_seconds',
    help: 'HTTP request latency by method, route pattern and status',
    labelNames: ['method', 'route', 'status'] as const,
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15],
    registers: [registry],
  });
  const sessionsCreated = new client.Counter({
    name: 'sap_sessions_created_total',
    help: 'Sessions created through the API (201 answers)',
    registers: [registry],
  });
  const batchesCreated = new client.Counter({ name: 'sap_batches_created_total', help: 'Batches created through the API', registers: [registry] });
  const batchItemsSubmitted = new client.Counter({
    name: 'sap_batch_items_submitted_total',
    help: 'Items of the batches created through the API',
    registers: [registry],
  });
  const proxyRequests = new client.Counter({
    name: 'sap_proxy_requests_total',
    help: 'Preview proxy requests, by kind (http or websocket)',
    labelNames: ['kind'] as const,
    registers: [registry],
  });

  let cached: { at: number; counts: Record<string, number> } | undefined;
  new client.Gauge({
    name: 'sap_batch_items',
    help: 'Items of the running batches by state (pending, running, completed, failed)',
    labelNames: ['state'] as const,
    registers: [registry],
    async collect() {
      if (!cached || Date.now() - cached.at > BATCH_GAUGE_TTL_MS) {
        cached = { at: Date.now(), counts: await runningBatchItems(deps.store as ApiDeps['store']) };
      }
      for (const [state, v] of Object.entries(cached.counts)) this.set({ state }, v);
    },
  });

  return {
    registry,
    httpDuration,
    sessionsCreated,
    batchesCreated,
    batchItemsSubmitted,
    proxyRequests,
    middleware(req, res, next) {
      const end = httpDuration.startTimer();
      const routeOf = () => (req.route?.path ? `${req.baseUrl}${req.route.path as string}` : 'unmatched');
      let timed = false;
      if ((req.headers.accept ?? '').includes('text/event-stream')) {
        // A streamed answer (server-sent events) is timed to its headers: its end is when the stream
        // ends (an exec session's exit), which says nothing of how long the request took.
        const writeHead = res.writeHead;
        res.writeHead = function (this: typeof res, ...args: Parameters<typeof res.writeHead>) {
          res.writeHead = writeHead;
          const out = writeHead.apply(this, args);
          if (String(res.getHeader('content-type') ?? '').startsWith('text/event-stream')) {
            timed = true;
            end({ method: req.method, route: routeOf(), status: String(res.statusCode) });
          }
          return out;
        } as typeof res.writeHead;
      }
      res.once('finish', () => {
        const route = routeOf();
        if (!timed) end({ method: req.method, route, status: String(res.statusCode) });
        if (req.method === 'POST' && res.statusCode === 201) {
          if (route === '/v1/agents/:agentId/sessions') sessionsCreated.inc();
          else if (route === '/v1/agents/:agentId/batches') {
            batchesCreated.inc();
            const total = Number((res.locals as { batchTotal?: number }).batchTotal ?? 0);
            if (total > 0) batchItemsSubmitted.inc(total);
          }
        }
      });
      next();
    },
    async handler(_req, res) {
      try {
        const text = await registry.metrics();
        res.setHeader('content-type', registry.contentType);
        res.end(text);
      } catch (err) {
        res.status(500).json({ error: { type: 'internal', message: `metrics: ${(err as Error).message}` } });
      }
    },
  };
}

/** Whether a peer address is loopback (127.0.0.0/8, ::1, or IPv4 loopback mapped into IPv6). */
export function isLoopback(address: string | undefined): boolean {
  if (!address) return false;
  const v4 = address.startsWith('::ffff:') ? address.slice(7) : address;
  return address === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(v4);
}

const digest = (s: string) => createHash('sha256').update(s).digest();

/**
 * Who may read GET /metrics (its counters are every organisation's together, so not a tenant):
 * - an operator's API key (X-API-Key), always; a tenant's key gets 403;
 * - with METRICS_TOKEN set, `Authorization: Bearer <METRICS_TOKEN>`, from anywhere (and nothing else);
 * - without it, a loopback peer (bind the API to a private address, or put a proxy in front that
 *   sets no X-API-Key: then set METRICS_TOKEN, since every request reaches the API from loopback).
 * Throws the ApiError to answer otherwise.
 */
export async function authorizeMetrics(req: Request, token: string | undefined, auth: Pick<Authenticator, 'authenticateOperator'>): Promise<void> {
  if (req.headers['x-api-key'] !== undefined) {
    await auth.authenticateOperator(req);
    return;
  }
  const header = req.headers.authorization;
  if (token) {
    const m = typeof header === 'string' ? /^Bearer\s+(\S+)$/i.exec(header) : null;
    if (m && timingSafeEqual(digest(m[1]!), digest(token))) return;
    throw new ApiError('unauthorized', 'GET /metrics needs Authorization: Bearer <METRICS_TOKEN> (or an operator API key)');
  }
  if (isLoopback(req.socket.remoteAddress)) return;
  throw new ApiError('forbidden', 'GET /metrics answers loopback peers only while METRICS_TOKEN is unset (or an operator API key)');
}
