import http from 'node:http';
import client from 'prom-client';
import type { ActivityExecuteInput, ActivityInboundCallsInterceptor, Next } from '@temporalio/worker';
import type { Context } from '@temporalio/activity';
import type { Logger } from '../lib/logger';
import type { HostClient } from '../sandbox';
import type { SessionEnd } from '../contract/workflows';
import type { WorkerReadiness } from './readiness';
import { registerSandboxGauges } from './sandbox-gauges';

/** The worker's Prometheus metrics and the activity interceptor that feeds them. */
export interface WorkerMetrics {
  registry: client.Registry;
  /** Activity interceptor factory for Worker.create({ interceptors: { activity: [...] } }). */
  activityInterceptor: (ctx: Context) => { inbound: ActivityInboundCallsInterceptor };
  /** Counts the reaper's sweeps by outcome (ok, error). */
  reaperSwept(outcome: 'ok' | 'error'): void;
}

/** How many sessions' start times are remembered for the duration histogram. */
const MAX_TRACKED = 100_000;

/**
 * Sessions started (sandbox provisioned) and finished by status and reason, session duration
 * (provisioned → ended, for sessions provisioned by this worker process), activity latency and
 * failures by activity type, live sandboxes and running exec sessions on this worker's host
 * (read from the host at scrape time), the reaper's sweeps, per-sandbox resource gauges (./sandbox-gauges), and the process's default metrics.
 */
export function createWorkerMetrics(deps: { host: HostClient; sandboxMetricsMax?: number }): WorkerMetrics {
  const registry = new client.Registry();
  registerSandboxGauges(registry, deps.host, deps.sandboxMetricsMax ?? 50);
  client.collectDefaultMetrics({ register: registry, prefix: 'sap_worker_' });
  const started = new client.Counter({
    name: 'sap_sessions_started_total',
    help: 'Sessions whose sandbox was provisioned and entrypoint started',
    registers: [registry],
  });
  const finished = new client.Counter({
    name: 'sap_sessions_finished_total',
    help: 'Sessions ended, by status and reason',
    labelNames: ['status', 'reason'] as const,
    registers: [registry],
  });
  const duration = new client.Histogram({
    name: 'sap_session_duration_seconds',
    help: 'Session duration from provisioned to ended',
    buckets: [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600],
    registers: [registry],
  });
  const activity = new client.Histogram({
    name: 'sap_activity_duration_seconds',
    help: 'Activity execution time by activity type and outcome',
    labelNames: ['activity', 'outcome'] as const,
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15, 60],
    registers: [registry],
  });
  new client.Gauge({
    name: 'sap_live_sandboxes',
    help: "Sandboxes on this worker's sandbox host, by owner kind",
    labelNames: ['owner'] as const,
    registers: [registry],
    async collect() {
      this.reset();
      const list = await deps.host.listSandboxes();
      const by = new Map<string, number>();
      for (const sb of list) by.set(sb.owner?.kind ?? 'none', (by.get(sb.owner?.kind ?? 'none') ?? 0) + 1);
      for (const [owner, n] of by) this.set({ owner }, n);
      const execs = await Promise.all(list.slice(0, 200).map((sb) => deps.host.listExec(sb.id).catch(() => [])));
      execGauge.set(execs.flat().filter((e) => e.running).length);
    },
  });
  const execGauge = new client.Gauge({
    name: 'sap_exec_sessions_running',
    help: "Running exec sessions on this worker's host (first 200 sandboxes)",
    registers: [registry],
  });

  const sweeps = new client.Counter({
    name: 'sap_reaper_sweeps_total',
    help: "The reaper's sweeps of this worker's host (services/sandboxes/reaper.ts), by outcome",
    labelNames: ['outcome'] as const,
    registers: [registry],
  });

  const provisionedAt = new Map<string, number>();
  const sessionOf = (input: ActivityExecuteInput): string | undefined => (input.args[0] as { sessionId?: string } | undefined)?.sessionId;

  return {
    registry,
    reaperSwept: (outcome) => sweeps.inc({ outcome }),
    activityInterceptor: (ctx) => ({
      inbound: {
        async execute(input: ActivityExecuteInput, next: Next<ActivityInboundCallsInterceptor, 'execute'>): Promise<unknown> {
          const type = ctx.info.activityType;
          const end = activity.startTimer({ activity: type });
          try {
            const out = await next(input);
            end({ outcome: 'ok' });
            const sessionId = sessionOf(input);
            if (type === 'provisionSandboxAndRunEntrypoint' && sessionId) {
              started.inc();
              if (provisionedAt.size >= MAX_TRACKED) provisionedAt.clear();
              provisionedAt.set(sessionId, Date.now());
            }
            const sessionEnd = sessionEndOf(type, input, out);
            if (sessionEnd && sessionId) {
              finished.inc({ status: sessionEnd.status, reason: sessionEnd.outcome?.reason ?? (sessionEnd.status === 'completed' ? 'ok' : 'unknown') });
              const t = provisionedAt.get(sessionId);
              if (t !== undefined) {
                duration.observe((Date.now() - t) / 1000);
                provisionedAt.delete(sessionId);
              }
            }
            return out;
          } catch (err) {
            end({ outcome: 'error' });
            throw err;
          }
        },
      },
    }),
  };
}

/** How a session ended, when this activity is the one that recorded it; null otherwise. */
function sessionEndOf(type: string, input: ActivityExecuteInput, out: unknown): SessionEnd | null {
  switch (type) {
    case 'recordSessionOutcome':
      return (input.args[0] as { end: SessionEnd }).end;
    case 'captureResultAndDestroySandbox':
      return out as SessionEnd;
    case 'provisionSandboxAndRunEntrypoint':
      // Set only when a quick entrypoint was finished within the provisioning step.
      return (out as { end: SessionEnd | null }).end ?? null;
    default:
      return null;
  }
}

/**
 * Serves, on `port`: GET /metrics (this registry, followed by the Temporal SDK's own metrics read
 * from its Prometheus exporter at `sdkMetricsUrl`, when set); GET /healthz (liveness: the process
 * answers); GET /readyz (`ready`: 200 `{ status: 'ok', ... }` or 503 with the error body). A port
 * already in use is logged, not fatal.
 */
export function serveWorkerMetrics(
  metrics: WorkerMetrics,
  opts: { host: string; port: number; sdkMetricsUrl?: string; logger: Logger; ready?: () => Promise<WorkerReadiness> },
): http.Server {
  const json = (res: http.ServerResponse, status: number, body: unknown) =>
    res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '').split('?')[0];
    if (req.method === 'GET' && path === '/healthz') {
      json(res, 200, { status: 'ok' });
      return;
    }
    if (req.method === 'GET' && path === '/readyz' && opts.ready) {
      opts.ready().then(
        ({ ok, message, workers, host }) =>
          ok ? json(res, 200, { status: 'ok', workers, host }) : json(res, 503, { error: { type: 'unavailable', message } }),
        (err: unknown) => json(res, 503, { error: { type: 'unavailable', message: `not ready: ${(err as Error).message}` } }),
      );
      return;
    }
    if (req.method !== 'GET' || path !== '/metrics') {
      json(res, 404, { error: { type: 'not_found', message: `GET /metrics, /healthz${opts.ready ? ', /readyz' : ''}` } });
      return;
    }
    void (async () => {
      try {
        let text = await metrics.registry.metrics();
        if (opts.sdkMetricsUrl) {
          const sdk = await fetch(opts.sdkMetricsUrl, { signal: AbortSignal.timeout(2000) })
            .then((r) => (r.ok ? r.text() : ''))
            .catch(() => '');
          if (sdk) text += `\n${sdk}`;
        }
        res.writeHead(200, { 'content-type': metrics.registry.contentType }).end(text);
      } catch (err) {
        json(res, 500, { error: { type: 'internal', message: (err as Error).message } });
      }
    })();
  });
  server.on('error', (err) => opts.logger.warn({ err: String(err), port: opts.port }, 'worker metrics server not listening'));
  server.listen(opts.port, opts.host, () => opts.logger.info({ url: `http://${opts.host}:${opts.port}/metrics` }, 'worker metrics listening'));
  server.unref();
  return server;
}

/**
 * Installs the Temporal runtime before any NativeConnection exists: the SDK's and core's logs go
 * through pino (JSON, with the workflow and activity ids the SDK attaches), and its metrics to a
 * Prometheus exporter on 127.0.0.1:`prometheusPort` (0: none). Answers the exporter's URL, or
 * undefined when it has none (port 0, or the port is taken: then the runtime runs without it).
 * Workers heartbeat to Temporal every `heartbeatMs` (default 60 s).
 */
export function installTemporalRuntime(opts: { logger: Logger; prometheusPort: number; heartbeatMs?: number }): string | undefined {
  const { Runtime, DefaultLogger } = require('@temporalio/worker') as typeof import('@temporalio/worker');
  const levels = { TRACE: 'trace', DEBUG: 'debug', INFO: 'info', WARN: 'warn', ERROR: 'error' } as const;
  const sdkLogger = new DefaultLogger('INFO', (entry) => {
    // The task token is a capability to complete the task: it stays out of the logs.
    const { sdkComponent, taskToken: _taskToken, ...meta } = (entry.meta ?? {}) as Record<string, unknown>;
    opts.logger[levels[entry.level]]({ sdk: sdkComponent ?? 'temporal', ...meta }, entry.message);
  });
  // Worker heartbeats let the API's /readyz tell a live idle worker from a dead one (see services/ops/readiness.ts).
  const workerHeartbeatInterval = opts.heartbeatMs ?? 60_000;
  if (opts.prometheusPort) {
    const bindAddress = `127.0.0.1:${opts.prometheusPort}`;
    try {
      Runtime.install({ logger: sdkLogger, workerHeartbeatInterval, telemetryOptions: { metrics: { prometheus: { bindAddress } } } });
      return `http://${bindAddress}/metrics`;
    } catch (err) {
      opts.logger.warn({ err: String(err), bindAddress }, 'Temporal SDK metrics exporter not started');
    }
  }
  Runtime.install({ logger: sdkLogger, workerHeartbeatInterval });
  return undefined;
}
