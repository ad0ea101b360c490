/**
 * The composition root of the control plane's services: `createServices(deps)` builds each service
 * once and wires them to each other. The API process (api/server.ts) builds one set and hands it to
 * its routes, WebSocket routes and preview proxy, so they share one preview cache and one exec registry.
 * The worker process (worker/main.ts) builds the same set with `createWorkerServices`, which adds the
 * services of the workflows' steps on the sandbox host beside it.
 */
import { createAgentService } from './agents';
import { createKeyService } from './api-keys';
import { createBatchService } from './batches';
import { createBatchRunService } from './batch-runs';
import { createCapacityService } from './capacity';
import { createCodecService } from './codec';
import { createConsoleService } from './console';
import { createConversationService } from './conversations';
import { createConversationRunService } from './conversations/runs';
import type { ServiceDeps } from './deps';
import { checkHostLost } from './host-loss';
import { createInstanceService } from './instances';
import { createInstanceRunService } from './instance-runs';
import type { LocalHost } from './local-host';
import { createSandboxServices } from './sandbox-services';
import { createSecretStoreService } from './secret-stores';
import { createSessionService } from './sessions';
import { createSessionRunService } from './session-runs';
import { createUsageService } from './usage';
import { createWebhookService } from './webhooks';

/** Builds every service of the control plane over `deps`, once. */
export function createServices(deps: ServiceDeps) {
  const secretStores = createSecretStoreService(deps);
  const agents = createAgentService(deps, secretStores);
  return {
    keys: createKeyService(deps.store),
    secretStores,
    agents,
    sessions: createSessionService(deps, agents),
    conversations: createConversationService(deps, agents),
    batches: createBatchService(deps, agents),
    instances: createInstanceService(deps, agents),
    capacity: createCapacityService(deps),
    usage: createUsageService(deps),
    console: createConsoleService(deps),
    codec: createCodecService(deps),
    /** Sandboxes, checkpoints, snapshots, exec and agent sessions, files, terminals, previews, resources. */
    sandbox: createSandboxServices(deps),
  };
}

/** The services of the control plane (see createServices). */
export type Services = ReturnType<typeof createServices>;

/**
 * The worker's services: the control plane's (createServices) and those of the workflows' steps on
 * `local`, the sandbox host beside the worker, which the activities call.
 */
export function createWorkerServices(deps: ServiceDeps, local: LocalHost) {
  const runDeps = { ...local, store: deps.store };
  return {
    ...createServices(deps),
    sessionRuns: createSessionRunService(runDeps),
    batchRuns: createBatchRunService(runDeps),
    instanceRuns: createInstanceRunService(runDeps),
    conversationRuns: createConversationRunService(runDeps),
    webhooks: createWebhookService(deps),
    hostLoss: {
      /** True when host `hostId` is lost (services/host-loss.ts checkHostLost). */
      isLost: (hostId: string): Promise<boolean> => checkHostLost(deps.store, hostId, local.hostDeadAfterMs ?? 15_000, local.hostToken ?? ''),
    },
  };
}

/** The worker's services (see createWorkerServices). */
export type WorkerServices = ReturnType<typeof createWorkerServices>;
