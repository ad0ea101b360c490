/**
 * The steps of an instance's workflow on the host beside the worker: provision its sandbox, destroy
 * it, record the instance's end. Each is idempotent (Temporal may run its activity again after a
 * crash): the sandbox id derives from the instance id, and the host's create is idempotent on it.
 */
import type { AgentRunSpec } from '../../contract/workflows';
import { markInstanceRunning, markInstanceStoppedAt, recordInstanceStatus, sandboxIdForInstance } from '../../store/instances';
import { markSandboxStopped } from '../../store/sandboxes';
import { createAgentSandbox } from '../agents/agent-sandbox';
import type { LocalHost, LocalRunDeps } from '../hosts/local-host';

/** The id of the host beside this worker (asked once). */
const hostIds = new WeakMap<object, Promise<string>>();
function hostIdOf(deps: Pick<LocalHost, 'host'>): Promise<string> {
  let p = hostIds.get(deps.host);
  if (!p) {
    p = deps.host.health().then((h) => h.hostId);
    p.catch(() => hostIds.delete(deps.host));
    hostIds.set(deps.host, p);
  }
  return p;
}

export function createInstanceRunService(deps: LocalRunDeps) {
  return {
    /**
     * Creates the instance's sandbox on this worker's host: from the agent's snapshot (its layer,
     * then the checkpoint's patches in order) when it has one, with the agent's files and env; no
     * entrypoint is started. The sandbox is recorded (a SandboxDoc with `instanceId`) before it is
     * created, so /api/sandboxes/{id}/… can address it and the reaper leaves it alone. Marks the
     * instance `running`.
     */
    async provision(args: { instanceId: string; orgId: string; agentId: string; run: AgentRunSpec }): Promise<{ sandboxId: string; taskQueue: string }> {
      const sandboxId = sandboxIdForInstance(args.instanceId);
      const owner = { envName: 'INSTANCE_ID', id: args.instanceId, instanceId: args.instanceId, metadataKey: 'instanceId' } as const;
      const { snapshotId } = await createAgentSandbox(deps, { ...args, sandboxId, hostId: await hostIdOf(deps), owner });
      await markInstanceRunning(deps.store, args.instanceId, sandboxId, snapshotId);
      return { sandboxId, taskQueue: deps.hostTaskQueue };
    },

    /** Destroys the instance's sandbox on this host and records the instance `stopped`. */
    async destroySandbox(args: { instanceId: string; sandboxId: string }): Promise<void> {
      await deps.host.destroySandbox(args.sandboxId);
      const now = new Date();
      await markSandboxStopped(deps.store, args.sandboxId, now);
      await markInstanceStoppedAt(deps.store, args.instanceId, now);
    },

    /** Records an instance's end when it has no sandbox: `failed` with the reason, or `stopped`. */
    async recordEnd(args: { instanceId: string; status: 'failed' | 'stopped'; error: string | null }): Promise<void> {
      await recordInstanceStatus(deps.store, args.instanceId, args.status, args.error);
    },
  };
}

export type InstanceRunService = ReturnType<typeof createInstanceRunService>;
