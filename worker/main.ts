import fs from 'node:fs';
import path from 'node:path';
import { NativeConnection, Worker } from '@temporalio/worker';
import { Client, Connection } from '@temporalio/client';
import { hostTaskQueue, hostUrlOf, loadConfigOrExit, PROJECT_ROOT, resolveHostToken, resolveSecretBox, workerHeartbeatMs } from '../config';
import { createActivities } from '../activities';
import { createLogger } from '../lib/logger';
import { HostClient } from '../sandbox';
import { connectStore } from '../store';
import { startReaper } from '../services/reaper';
import { createWorkerMetrics, installTemporalRuntime, serveWorkerMetrics } from './metrics';
import { registerHost } from '../store/hosts';
import { chooseHost, hostAlive, HostView, placementWeight } from '../services/placement';
import { orgOfWorkflowId } from '../store/orgs';
import { dataConverterOf, payloadCodecOf } from '../lib/payload-codec';

/** A session stays on the host whose worker took it while that host has at least this share of the roomiest host's room. */
const STAY_SHARE = 0.75;
import { workerReadiness } from './readiness';
import { rejoinIfLost, startHostWatch } from '../services/host-watch';

/** Where `npm run build` puts the prebundled workflow code (bundling at start costs ~2 s). */
export const WORKFLOW_BUNDLE = path.join(PROJECT_ROOT, 'dist', 'workflow-bundle.js');

/**
 * The worker process, one beside each sandbox host. It polls two task queues:
 * - TASK_QUEUE: session workflows, and provisioning (which lands on whichever host takes it);
 * - TASK_QUEUE@<hostId>: the steps that must run on the host that owns a sandbox.
 */
async function main(): Promise<void> {
  const cfg = loadConfigOrExit();
  const logger = createLogger('worker', cfg.LOG_LEVEL);
  const store = await connectStore(cfg.MONGO_URL, { ensureIndexes: false });
  const host = new HostClient({ url: `http://${cfg.HOST_LISTEN}`, token: resolveHostToken(cfg) });
  // The host says who it is; its sandboxes' steps are routed to that host's task queue.
  const { hostId, ok: _ok, provider: _provider, ...capacity } = await host.health();
  const hostEntry = { id: hostId, url: hostUrlOf(cfg), taskQueue: hostTaskQueue(cfg, hostId) };
  // Temporal payloads per organisation (PAYLOAD_ENCRYPTION): the workers encode and decode outside the workflow isolate.
  const codec = payloadCodecOf(cfg, resolveSecretBox(cfg), (id) => orgOfWorkflowId(store, id));
  const clientConnection = await Connection.connect({ address: cfg.TEMPORAL_ADDRESS });
  const client = new Client({ connection: clientConnection, namespace: cfg.TEMPORAL_NAMESPACE, ...dataConverterOf(codec) });
  // Written off while away: its old sandboxes go before it takes anything new.
  await rejoinIfLost(store, client, host, hostId, logger);
  await registerHost(store, { ...hostEntry, capacity });
  // The heartbeat: the host's liveness and load, as long as the host answers (a host that stops
  // answering stops being heard of, and is dead HOST_DEAD_AFTER later).
  // A host written off while it was frozen or cut off hears of it here, at its first heartbeat back, and rejoins.
  let rejoining = false;
  const heartbeat = setInterval(() => {
    host
      .health({ signal: AbortSignal.timeout(cfg.HOST_HEARTBEAT_MS) })
      .then(async ({ hostId: _id, ok: _o, provider: _p, ...load }) => {
        const { lostAt } = await registerHost(store, { ...hostEntry, capacity: load });
        if (!lostAt || rejoining) return;
        rejoining = true;
        await rejoinIfLost(store, client, host, hostId, logger).finally(() => (rejoining = false));
      })
      .catch((err: Error) => logger.warn({ err: err.message }, 'host heartbeat failed'));
  }, cfg.HOST_HEARTBEAT_MS);
  const hosts = new HostView(store, cfg.HOST_HEARTBEAT_MS / 2);
  const deadAfterMs = cfg.HOST_DEAD_AFTER * 1000;
  const placeElsewhere = async (): Promise<string | null> => {
    const docs = await hosts.all();
    if (docs.length < 2) return null;
    // Workflow tasks already spread over the workers that poll the shared queue: sending a session
    // elsewhere costs an extra activity task, so it stays here unless this host has clearly less room.
    const own = docs.find((d) => d._id === hostId);
    const best = Math.max(...docs.filter((d) => hostAlive(d, deadAfterMs)).map((d) => placementWeight(d.capacity)));
    if (own && placementWeight(own.capacity) > 0 && placementWeight(own.capacity) >= STAY_SHARE * best) return null;
    const chosen = chooseHost(docs, deadAfterMs);
    return chosen && chosen._id !== hostId ? chosen.taskQueue : null;
  };
  const severalHosts = async (): Promise<boolean> => (await hosts.all()).length > 1;
  const activities = createActivities({
    store,
    host,
    hostTaskQueue: hostEntry.taskQueue,
    resultMaxBytes: cfg.RESULT_MAX_BYTES,
    logMaxBytes: cfg.SESSION_LOG_MAX_BYTES,
    limits: cfg.limits,
    ...(cfg.SANDBOX_USER ? { sandboxUser: cfg.SANDBOX_USER } : {}),
    webhooks: { allowedCidrs: cfg.WEBHOOK_ALLOWED_CIDRS, timeoutMs: cfg.WEBHOOK_TIMEOUT_MS, answerMaxBytes: cfg.WEBHOOK_ANSWER_MAX_BYTES },
    secrets: resolveSecretBox(cfg),
    placeElsewhere,
    severalHosts,
    hostId,
    hostDeadAfterMs: deadAfterMs,
    hostToken: resolveHostToken(cfg),
  });

  // Before any NativeConnection: SDK logs through pino, SDK metrics to a Prometheus exporter (port + 1).
  const sdkMetricsUrl = installTemporalRuntime({
    logger,
    prometheusPort: cfg.WORKER_METRICS_PORT ? cfg.WORKER_METRICS_PORT + 1 : 0,
    heartbeatMs: workerHeartbeatMs(cfg),
  });
  const metrics = createWorkerMetrics({ host, sandboxMetricsMax: cfg.SANDBOX_METRICS_MAX });
  // Filled once the Temporal workers exist; until then /readyz says they are not created yet.
  const temporalWorkers: { name: string; worker: Worker }[] = [];
  const ready = workerReadiness({ workers: () => temporalWorkers, host });
  if (cfg.WORKER_METRICS_PORT) serveWorkerMetrics(metrics, { host: cfg.HOST, port: cfg.WORKER_METRICS_PORT, sdkMetricsUrl, logger, ready });
  const connection = await NativeConnection.connect({ address: cfg.TEMPORAL_ADDRESS });
  const workflowSource = fs.existsSync(WORKFLOW_BUNDLE)
    ? { workflowBundle: { codePath: WORKFLOW_BUNDLE } }
    : { workflowsPath: require.resolve('../workflows') };
  const common = {
    connection,
    namespace: cfg.TEMPORAL_NAMESPACE,
    activities,
    maxConcurrentActivityTaskExecutions: 500,
    interceptors: { activity: [metrics.activityInterceptor] },
    ...dataConverterOf(codec),
  };
  const shared = await Worker.create({ ...common, ...workflowSource, taskQueue: cfg.TASK_QUEUE, maxConcurrentWorkflowTaskExecutions: 100 });
  const local = await Worker.create({ ...common, taskQueue: hostTaskQueue(cfg, hostId) });
  temporalWorkers.push({ name: cfg.TASK_QUEUE, worker: shared }, { name: hostTaskQueue(cfg, hostId), worker: local });

  const reaper = startReaper({ host, store, client, logger, onSweep: metrics.reaperSwept });
  const watch = startHostWatch({
    store,
    client,
    hostId,
    deadAfterMs,
    token: resolveHostToken(cfg),
    logger,
    intervalMs: Math.max(1_000, cfg.HOST_HEARTBEAT_MS),
  });

  logger.info({ taskQueue: cfg.TASK_QUEUE, hostQueue: hostTaskQueue(cfg, hostId) }, 'worker running');
  // Worker.run() resolves after SIGINT/SIGTERM (the SDK's shutdown signals) once tasks drain.
  await Promise.all([shared.run(), local.run()]);
  reaper.stop();
  watch.stop();
  clearInterval(heartbeat);
  await Promise.allSettled([store.close(), connection.close(), clientConnection.close()]);
  logger.info('worker stopped');
}

main().catch((err) => {
  process.stderr.write(`worker: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
