import fs from 'node:fs';
import path from 'node:path';
import { NativeConnection, Worker } from '@temporalio/worker';
import { Client, Connection } from '@temporalio/client';
import { hostTaskQueue, hostUrlOf, loadConfigOrExit, PROJECT_ROOT, resolveHostToken, resolveSecretBox, workerHeartbeatMs } from '../config';
import { createActivities } from '../activities';
import { createLogger } from '../lib/logger';
import { HostClient } from '../sandbox';
import { createWorkerServices } from '../services';
import { startReaper } from '../services/sandboxes/reaper';
import { createWorkerMetrics, installTemporalRuntime, serveWorkerMetrics } from './metrics';
import { joinHosts, startHostHeartbeat } from '../services/hosts/host-heartbeat';
import { HostDirectory } from '../services/hosts/hosts';
import { placementFrom } from '../services/hosts/placement';
import { openWorkerStore, workflowOrgLookup } from '../services/ops/startup';
import { dataConverterOf, payloadCodecOf } from '../lib/payload-codec';
import { workerReadiness } from './readiness';
import { startHostWatch } from '../services/hosts/host-watch';

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
  const store = await openWorkerStore(cfg.MONGO_URL);
  const host = new HostClient({ url: `http://${cfg.HOST_LISTEN}`, token: resolveHostToken(cfg) });
  // The host says who it is; its sandboxes' steps are routed to that host's task queue.
  const { hostId, ok: _ok, provider: _provider, ...capacity } = await host.health();
  const hostEntry = { id: hostId, url: hostUrlOf(cfg), taskQueue: hostTaskQueue(cfg, hostId) };
  // Temporal payloads per organisation (PAYLOAD_ENCRYPTION): the workers encode and decode outside the workflow isolate.
  const secrets = resolveSecretBox(cfg);
  const codec = payloadCodecOf(cfg, secrets, workflowOrgLookup(store));
  const clientConnection = await Connection.connect({ address: cfg.TEMPORAL_ADDRESS });
  const client = new Client({ connection: clientConnection, namespace: cfg.TEMPORAL_NAMESPACE, ...dataConverterOf(codec) });
  // Written off while away: its old sandboxes go before it takes anything new.
  const ownHost = { store, client, host, entry: hostEntry, logger };
  await joinHosts(ownHost, capacity);
  const heartbeat = startHostHeartbeat({ ...ownHost, intervalMs: cfg.HOST_HEARTBEAT_MS });
  const deadAfterMs = cfg.HOST_DEAD_AFTER * 1000;
  const placement = placementFrom(store, { hostId, deadAfterMs, refreshMs: cfg.HOST_HEARTBEAT_MS / 2 });
  // The same services as the API's (createServices), and those of the workflows' steps on this host.
  const services = createWorkerServices(
    { cfg, store, temporal: client, logger, hosts: new HostDirectory(store, resolveHostToken(cfg), deadAfterMs), secrets, codec },
    {
      host,
      hostTaskQueue: hostEntry.taskQueue,
      resultMaxBytes: cfg.RESULT_MAX_BYTES,
      logMaxBytes: cfg.SESSION_LOG_MAX_BYTES,
      limits: cfg.limits,
      ...(cfg.SANDBOX_USER ? { sandboxUser: cfg.SANDBOX_USER } : {}),
      secrets,
      placeElsewhere: placement.placeElsewhere,
      severalHosts: placement.severalHosts,
      hostId,
      hostDeadAfterMs: deadAfterMs,
      hostToken: resolveHostToken(cfg),
    },
  );
  const activities = createActivities({
    services,
    host,
    webhooks: { allowedCidrs: cfg.WEBHOOK_ALLOWED_CIDRS, timeoutMs: cfg.WEBHOOK_TIMEOUT_MS, answerMaxBytes: cfg.WEBHOOK_ANSWER_MAX_BYTES },
    secrets,
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
  heartbeat.stop();
  await Promise.allSettled([store.close(), connection.close(), clientConnection.close()]);
  logger.info('worker stopped');
}

main().catch((err) => {
  process.stderr.write(`worker: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
