import { effectiveResources } from '../config/limits';
import { withoutOverridden, type SealedSecretSpec } from '../contract/sealed';
import type { AgentRunSpec } from '../contract/workflows';
import { deleteSandboxRecord, insertSandboxOnce, type SandboxDoc } from '../store/sandboxes';
import type { ActivityDeps } from './deps';
import { agentEnvOrFail, createOrExplain, imageOrFail, secretEnvOrFail, userOf } from './sessions';

const sealedField = (s: SealedSecretSpec[]) => (s.length ? { sealedSecrets: s } : {});

/** What owns an agent's long-lived sandbox: an instance or a conversation. */
export interface AgentSandboxOwner {
  /** The platform's variable naming the owner in the sandbox (INSTANCE_ID, CONVERSATION_ID). */
  envName: 'INSTANCE_ID' | 'CONVERSATION_ID';
  id: string;
  /** The sandbox record's `instanceId` (null for a conversation). */
  instanceId: string | null;
  /** The sandbox's metadata key for the owner's id. */
  metadataKey: 'instanceId' | 'conversationId';
}

/**
 * Creates an agent's long-lived sandbox (an instance's or a conversation's) on this worker's host,
 * from the agent's snapshot (its layer, then the checkpoint's patches) or over `fromLayer` (a fork's
 * turn checkpoint, whose files are already the agent's), with the agent's files and env; no
 * entrypoint is started. As for sessions, the agent's env wins over its store's secrets and the
 * platform's variables over both. The sandbox is recorded (owner `instance`, no idle timeout) before
 * it is created, so /api/sandboxes/{id}/… can address it and the reaper leaves it alone; a create
 * that fails takes the record with it (a retry writes it again). Idempotent on `sandboxId`.
 */
export async function createAgentSandbox(
  deps: ActivityDeps,
  a: { sandboxId: string; hostId: string; orgId: string; agentId: string; run: AgentRunSpec; owner: AgentSandboxOwner; fromLayer?: string | null },
): Promise<{ snapshotId: string | null }> {
  const { run, owner } = a;
  const image = !a.fromLayer && run.snapshot ? await imageOrFail(deps, a.orgId, run.snapshotRef?.snapshotId ?? run.snapshot) : null;
  const { env: secretEnv, sealed } = await secretEnvOrFail(deps, a.orgId, run.secretStore);
  const agentEnv = agentEnvOrFail(deps, a.orgId, a.agentId, run);
  // The agent's limits, else the defaults: recorded as the sandbox's effective limits and sent to the host.
  const { memoryMB, cpuCount, diskMB } = effectiveResources(deps.limits, run);
  const metadata = { [owner.metadataKey]: owner.id, agentId: a.agentId };
  const now = new Date();
  const record: SandboxDoc = {
    _id: a.sandboxId,
    orgId: a.orgId,
    hostId: a.hostId,
    status: 'running',
    templateID: 'base',
    metadata: JSON.stringify(metadata),
    fromCheckpoint: image?.checkpointId ?? null,
    snapshot: image?.snapshotId ?? null,
    timeout: 0,
    memoryMB,
    cpuCount,
    diskMB,
    instanceId: owner.instanceId,
    createdAt: now,
    updatedAt: now,
  };
  await insertSandboxOnce(deps.store, record);
  const layers = a.fromLayer ? [a.fromLayer] : (image?.layers ?? null);
  try {
    await createOrExplain(deps, {
      id: a.sandboxId,
      orgId: a.orgId,
      owner: { kind: 'instance', id: owner.id },
      envs: { ...image?.env, ...secretEnv, ...agentEnv, [owner.envName]: owner.id, AGENT_ID: a.agentId },
      ...sealedField(withoutOverridden(sealed, agentEnv, { [owner.envName]: '', AGENT_ID: '' })),
      ...(a.fromLayer ? {} : { files: run.files }),
      ...(layers ? { layers } : {}),
      ...(image ? { patches: image.patches, ...(image.workdir ? { cwd: image.workdir } : {}) } : {}),
      memoryMB,
      cpuCount,
      diskMB,
      ...(run.network ? { network: run.network } : {}),
      ...userOf(deps, run),
      metadata,
    });
  } catch (err) {
    await deleteSandboxRecord(deps.store, a.sandboxId);
    throw err;
  }
  return { snapshotId: image?.snapshotId ?? null };
}
