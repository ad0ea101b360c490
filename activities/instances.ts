import { Context } from '@temporalio/activity';
import type { AgentRunSpec } from '../contract/workflows';
import { withFailureTypes } from './failures';
import type { ActivityDeps } from './deps';

/**
 * The instance activities: adapters from Temporal's calls to the instance-run service
 * (services/instances/instance-runs.ts). Each is idempotent (Temporal may run it again after a crash).
 */
export const createInstanceActivities = (deps: ActivityDeps) => ({
  /** Creates the instance's sandbox on this worker's host and marks the instance `running`. */
  async provisionInstance(args: { instanceId: string; orgId: string; agentId: string; run: AgentRunSpec }): Promise<{ sandboxId: string; taskQueue: string }> {
    Context.current().heartbeat();
    return withFailureTypes(deps.services.instanceRuns.provision(args));
  },

  /** Destroys the instance's sandbox on this host and records the instance `stopped`. */
  async destroyInstanceSandbox(args: { instanceId: string; sandboxId: string }): Promise<void> {
    await withFailureTypes(deps.services.instanceRuns.destroySandbox(args));
  },

  /** Records an instance's end when it has no sandbox: `failed` with the reason, or `stopped`. */
  async recordInstanceEnd(args: { instanceId: string; status: 'failed' | 'stopped'; error: string | null }): Promise<void> {
    await withFailureTypes(deps.services.instanceRuns.recordEnd(args));
  },
});
