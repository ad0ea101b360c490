/**
 * The services of the workflows' steps on the sandbox host beside the worker: what the activities
 * call (activities/deps.ts). Built by services/index.ts createWorkerServices beside the control
 * plane's; apart from them, so that the activities' types do not reach the workflows through
 * services/workflow-control.ts.
 */
import { createBatchRunService } from './sessions/batch-runs';
import { createConversationRunService } from './conversations/runs';
import type { ServiceDeps } from './deps';
import { checkHostLost } from './hosts/host-loss';
import { createInstanceRunService } from './instances/instance-runs';
import type { LocalHost } from './hosts/local-host';
import { createSessionRunService } from './sessions/session-runs';
import { createWebhookService } from './webhooks/webhooks';

export function createStepServices(deps: Pick<ServiceDeps, 'store' | 'hosts' | 'logger'>, local: LocalHost) {
  const runDeps = { ...local, store: deps.store };
  return {
    sessionRuns: createSessionRunService(runDeps),
    batchRuns: createBatchRunService(runDeps),
    instanceRuns: createInstanceRunService(runDeps),
    conversationRuns: createConversationRunService(runDeps, { store: deps.store, hosts: deps.hosts, logger: deps.logger }),
    webhooks: createWebhookService(deps),
    hostLoss: {
      /** True when host `hostId` is lost (services/hosts/host-loss.ts checkHostLost). */
      isLost: (hostId: string): Promise<boolean> => checkHostLost(deps.store, hostId, local.hostDeadAfterMs ?? 15_000, local.hostToken ?? ''),
    },
  };
}

/** The services of the workflows' steps (see createStepServices). */
export type StepServices = ReturnType<typeof createStepServices>;
