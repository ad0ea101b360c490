import { Context } from '@temporalio/activity';
import type { AgentRunSpec } from '../contract/workflows';
import { markInstanceRunning, markInstanceStoppedAt, recordInstanceStatus, sandboxIdForInstance } from '../store/instances';
import { markSandboxStopped } from '../store/sandboxes';
import type { ActivityDeps } from './deps';
import { createAgentSandbox } from './agent-sandbox';

/** The id of the host beside this worker (asked once). */
const hostIds = new WeakMap<object, Promise<string>>();
function hostIdOf(deps: ActivityDeps): Promise<string> {
  let p = hostIds.get(deps.host);
  if (!p) {
    p = deps.host.health().then((h) => h.hostId);
    p.catch(() => hostIds.delete(deps.host));
    hostIds.set(deps.host, p);
  }
  return p;
}

/**
 * The instance activities. Each is idempotent (Temporal may run it again after a crash): the
 * sandbox id derives from the instance id, and the host's create is idempotent on it.
 */
export const createInstanceActivities = (deps: ActivityDeps) => ({
  /**
   * Creates the instance's sandbox on this worker's host: from the agent's snapshot (its layer,
   * then the checkpoint's patches in order) when it has one, with the agent's files and env; no
   * entrypoint is started. The sandbox is recorded (a SandboxDoc with `instanceId`) before it is
   * created, so /api/sandboxes/{id}/… can address it and the reaper leaves it alone. Marks the
   * instance `running`.
   */
  async provisionInstance(args: { instanceId: string; orgId: string; agentId: string; run: AgentRunSpec }): Promise<{ sandboxId: string; taskQueue: string }> {
    Context.current().heartbeat();
    const sandboxId = sandboxIdForInstance(args.instanceId);
    const owner = { envName: 'INSTANCE_ID', id: args.instanceId, instanceId: args.instanceId, metadataKey: 'instanceId' } as const;
    const { snapshotId } = await createAgentSandbox(deps, { ...args, sandboxId, hostId: await hostIdOf(deps), owner });
    await markInstanceRunning(deps.store, args.instanceId, sandboxId, snapshotId);
    return { sandboxId, taskQueue: deps.hostTaskQueue };
  },

  /** Destroys the instance's sandbox on this host and records the instance `stopped`. */
  async destroyInstanceSandbox(args: { instanceId: string; sandboxId: string }): Promise<void> {
    await deps.host.destroySandbox(args.sandboxId);
    const now = new Date();
    await markSandboxStopped(deps.store, args.sandboxId, now);
    await markInstanceStoppedAt(deps.store, args.instanceId, now);
  },

  /** Records an instance's end when it has no sandbox: `failed` with the reason, or `stopped`. */
  async recordInstanceEnd(args: { instanceId: string; status: 'failed' | 'stopped'; error: string | null }): Promise<void> {
    await recordInstanceStatus(deps.store, args.instanceId, args.status, args.error);
  },
});
