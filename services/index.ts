/**
 * The composition root of the control plane's services: `createServices(deps)` builds each service
 * once and wires them to each other. The API process (api/server.ts) builds one set and hands it to
 * its routes, WebSocket routes and preview proxy, so they share one preview cache and one exec registry.
 * The worker process (worker/main.ts) builds the same set with `createWorkerServices`, which adds the
 * services of the workflows' steps on the sandbox host beside it.
 */
import { createAgentService } from './agents/agents';
import { createKeyService } from './orgs/api-keys';
import { createBatchService } from './sessions/batches';
import { createCapacityService } from './orgs/capacity';
import { createCodecService } from './codec';
import { createConsoleService } from './ops/console';
import { createConversationService } from './conversations';
import type { ServiceDeps } from './deps';
import { createInstanceService } from './instances/instances';
import type { LocalHost } from './hosts/local-host';
import { createSandboxServices } from './sandboxes/sandbox-services';
import { createSecretStoreService } from './orgs/secret-stores';
import { createStepServices } from './step-services';
import { createSessionService } from './sessions/sessions';
import { createUsageService } from './orgs/usage';

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
 * `local`, the sandbox host beside the worker (services/step-services.ts), which the activities call.
 */
export function createWorkerServices(deps: ServiceDeps, local: LocalHost) {
  return { ...createServices(deps), ...createStepServices(deps, local) };
}

/** The worker's services (see createWorkerServices). */
export type WorkerServices = ReturnType<typeof createWorkerServices>;
