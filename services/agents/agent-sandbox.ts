/**
 * An agent's sandbox on the host beside the worker: what it is made from (the agent's snapshot, its
 * secret store's values, its env, its user), its create on the host, and the long-lived sandbox of an
 * instance or a conversation. What a retry cannot fix throws a StepFailure (contract/errors.ts).
 */
import { effectiveResources } from '../../config/limits';
import { StepFailure } from '../../contract/errors';
import { withoutOverridden, type SealedSecretSpec } from '../../contract/sealed';
import type { AgentRunSpec } from '../../contract/workflows';
import type { CreatedSandbox, HostClient } from '../../sandbox';
import { AgentEnvUnreadable, openAgentEnv } from '../../store/agent-env';
import { findHost } from '../../store/hosts';
import { deleteSandboxRecord, insertSandboxOnce, type SandboxDoc } from '../../store/sandboxes';
import { storeSecretsOf, SecretStoreMissing, SecretUnreadable } from '../../store/secrets';
import { ImageError, resolveImage, type ResolvedImage } from '../checkpoints/images';
import type { LocalHost, LocalRunDeps } from '../hosts/local-host';
import { hostAlive } from '../hosts/placement';

const sealedField = (s: SealedSecretSpec[]) => (s.length ? { sealedSecrets: s } : {});

/** The agent's snapshot resolved to layers and patches, its layers brought here; a missing or unready one fails for good (SnapshotNotFound). */
export async function imageOrFail(deps: LocalRunDeps, orgId: string, ref: string): Promise<ResolvedImage> {
  let image: ResolvedImage;
  try {
    image = await resolveImage(deps.store, orgId, ref);
  } catch (err) {
    if (err instanceof ImageError) throw new StepFailure('snapshot_not_found', err.message);
    throw err;
  }
  await bringLayersHere(deps, image);
  return image;
}

/**
 * Copies a snapshot's layers to this host from the host that built it, when they are not here yet
 * (the host fetches them host to host and keeps them). Their only copy on a lost host fails the
 * provisioning for good, saying so; a source that is merely slow to answer is retried.
 */
async function bringLayersHere(deps: LocalRunDeps, image: ResolvedImage): Promise<void> {
  if (!deps.hostId || !image.hostId || image.hostId === deps.hostId || image.layers.length === 0) return;
  const source = await findHost(deps.store, image.hostId);
  if (!source) throw new StepFailure('snapshot_not_found', `the snapshot's layers are on sandbox host ${image.hostId}, which is not registered`);
  for (const layer of image.layers) {
    try {
      await deps.host.fetchLayer(layer, source.url);
    } catch (err) {
      const e = err as { type?: string; message?: string };
      if (e.type === 'not_found') throw new StepFailure('snapshot_not_found', `layer ${layer} of the snapshot is not on sandbox host ${image.hostId} any more`);
      if (!hostAlive(source, deps.hostDeadAfterMs ?? 15_000)) {
        throw new StepFailure('snapshot_not_found', `the snapshot's layers were only on sandbox host ${image.hostId}, which is lost`);
      }
      throw err;
    }
  }
}

/**
 * The environment from the agent's secret store, opened here (never carried in workflow arguments).
 * A store deleted since the agent named it fails the session for good, saying which.
 */
export async function secretEnvOrFail(
  deps: LocalRunDeps,
  orgId: string,
  name: string | undefined,
): Promise<{ env: Record<string, string>; sealed: SealedSecretSpec[] }> {
  try {
    return await storeSecretsOf(deps.store, deps.secrets, orgId, name);
  } catch (err) {
    if (err instanceof SecretStoreMissing) throw new StepFailure('invalid_agent', `the agent's ${err.message}`);
    // A retry cannot help: the key is what it is until the operator acts.
    if (err instanceof SecretUnreadable) throw new StepFailure('invalid_agent', err.message);
    throw err;
  }
}

/** Who the agent's sandbox runs as: the agent's `user`, else SANDBOX_USER; absent: the host's default, root. */
export function userOf(deps: Pick<LocalHost, 'sandboxUser'>, run: AgentRunSpec): { user?: 'root' | 'sandbox' } {
  const user = run.user ?? deps.sandboxUser;
  return user ? { user } : {};
}

/** The agent's env opened (it travels sealed in the run spec); a value that does not open fails the run for good. */
export function agentEnvOrFail(deps: Pick<LocalHost, 'secrets'>, orgId: string, agentId: string, run: AgentRunSpec): Record<string, string> {
  try {
    return openAgentEnv(deps.secrets, orgId, agentId, run.env, run.envSealed);
  } catch (err) {
    // A retry cannot help: the key is what it is until the operator acts.
    if (err instanceof AgentEnvUnreadable) throw new StepFailure('invalid_agent', err.message);
    throw err;
  }
}

/** Creates a sandbox; failures that a retry cannot fix become non-retryable. */
export async function createOrExplain(deps: Pick<LocalHost, 'host'>, req: Parameters<HostClient['createSandbox']>[0]): Promise<CreatedSandbox> {
  try {
    return await deps.host.createSandbox(req);
  } catch (err) {
    const type = (err as { type?: string }).type;
    if (type === 'patch_failed') throw new StepFailure('patch_failed', (err as Error).message);
    if (type === 'invalid_request') throw new StepFailure('invalid_agent', (err as Error).message);
    throw err;
  }
}

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
  deps: LocalRunDeps,
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
