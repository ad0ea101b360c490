import { Context } from '@temporalio/activity';
import type { AgentRunSpec } from '../contract/workflows';
import { markInstanceRunning, markInstanceStoppedAt, recordInstanceStatus, sandboxIdForInstance } from '../store/instances';
import { deleteSandboxRecord, insertSandboxOnce, markSandboxStopped, type SandboxDoc } from '../store/sandboxes';
import type { ActivityDeps } from './deps';
import { agentEnvOrFail, createOrExplain, imageOrFail, secretEnvOrFail, userOf } from './sessions';
import { effectiveResources } from '../config/limits';
import { withoutOverridden, type SealedSecretSpec } from '../contract/sealed';

const sealedField = (s: SealedSecretSpec[]) => (s.length ? { sealedSecrets: s } : {});

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
    const image = args.run.snapshot ? await imageOrFail(deps, args.orgId, args.run.snapshotRef?.snapshotId ?? args.run.snapshot) : null;
    const { env: secretEnv, sealed } = await secretEnvOrFail(deps, args.orgId, args.run.secretStore);
    const agentEnv = agentEnvOrFail(deps, args.orgId, args.agentId, args.run);
    const hostId = await hostIdOf(deps);
    // The agent's limits, else the defaults: recorded as the sandbox's effective limits and sent to the host.
    const { memoryMB, cpuCount, diskMB } = effectiveResources(deps.limits, args.run);
    const now = new Date();
    const record: SandboxDoc = {
      _id: sandboxId,
      orgId: args.orgId,
      hostId,
      status: 'running',
      templateID: 'base',
      metadata: JSON.stringify({ instanceId: args.instanceId, agentId: args.agentId }),
      fromCheckpoint: image?.checkpointId ?? null,
      snapshot: image?.snapshotId ?? null,
      timeout: 0,
      memoryMB,
      cpuCount,
      diskMB,
      instanceId: args.instanceId,
      createdAt: now,
      updatedAt: now,
    };
    await insertSandboxOnce(deps.store, record);
    try {
      await createOrExplain(deps, {
        id: sandboxId,
        orgId: args.orgId,
        owner: { kind: 'instance', id: args.instanceId },
        // As for sessions: the agent's env wins over its store's secrets, the platform's variables over both.
        envs: { ...image?.env, ...secretEnv, ...agentEnv, INSTANCE_ID: args.instanceId, AGENT_ID: args.agentId },
        ...sealedField(withoutOverridden(sealed, agentEnv, { INSTANCE_ID: '', AGENT_ID: '' })),
        files: args.run.files,
        ...(image ? { layers: image.layers, patches: image.patches, ...(image.workdir ? { cwd: image.workdir } : {}) } : {}),
        memoryMB,
        cpuCount,
        diskMB,
        ...(args.run.network ? { network: args.run.network } : {}),
        ...userOf(deps, args.run),
        metadata: { instanceId: args.instanceId, agentId: args.agentId },
      });
    } catch (err) {
      // Not created: the record goes too (a retry writes it again).
      await deleteSandboxRecord(deps.store, sandboxId);
      throw err;
    }
    await markInstanceRunning(deps.store, args.instanceId, sandboxId, image?.snapshotId ?? null);
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
