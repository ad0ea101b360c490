/**
 * Checkpoints (a copy of a sandbox's writable layer), spawning and restoring from them, and their
 * on_wake patches.
 */
import type { HostClient } from '../../sandbox';
import { MAX_CHECKPOINTS_PER_SANDBOX } from '../../contract/limits';
import { ApiError, conflict, invalid, notFound } from '../../contract/errors';
import { turnOfCheckpoint } from '../../contract/checkpoints';
import { findConversation } from '../../store/conversations';
import { randomId } from '../../lib/ids';
import {
  CheckpointDoc,
  checkpointStatus,
  claimCheckpointName,
  countSandboxCheckpoints,
  createPatch,
  deleteCheckpointRecords,
  deletePatch,
  findCheckpoint,
  findChildCheckpoint,
  findOrgCheckpoint,
  findPatch,
  findSnapshotOfCheckpoint,
  insertCheckpoint,
  listPatches,
  listSandboxCheckpoints,
  PatchDoc,
  releaseCheckpointName,
  updateCheckpoint,
} from '../../store/checkpoints';
import { findSandboxOnCheckpoint, SandboxDoc, updateSandbox } from '../../store/sandboxes';
import type { SandboxDeps } from '../deps';
import type { SandboxCreateRequest, SandboxService } from '../sandboxes/sandboxes';
import { reserveStorage, writableLayerBytes } from './storage-quota';
import { patchRecord, patchRefs } from './patch-state';

export { checkpointStatus, type CheckpointDoc, type PatchDoc };

const READY_WAIT_MS = 120_000;

/** The organisation's checkpoint, or 404. */
export async function getOrgCheckpoint(deps: Pick<SandboxDeps, 'store'>, orgId: string, id: string): Promise<CheckpointDoc> {
  const cp = await findOrgCheckpoint(deps.store, orgId, id);
  if (!cp) throw notFound(`checkpoint ${id}`);
  return cp;
}

/**
 * The checkpoint once it is ready: a `processing` one (its copy is under way in another request) is
 * waited for (bounded); a failed one is 409.
 */
export async function readyCheckpoint(deps: Pick<SandboxDeps, 'store'>, cp: CheckpointDoc): Promise<CheckpointDoc> {
  const deadline = Date.now() + READY_WAIT_MS;
  let cur = cp;
  for (;;) {
    const { status, error } = checkpointStatus(cur);
    if (status === 'ready') return cur;
    if (status === 'failed') throw conflict(`checkpoint ${cur._id} failed: ${error ?? 'unknown error'}`);
    if (Date.now() > deadline) throw conflict(`checkpoint ${cur._id} is still processing`);
    await new Promise((r) => setTimeout(r, 100));
    const next = await findCheckpoint(deps.store, cur._id);
    if (!next) throw notFound(`checkpoint ${cur._id}`);
    cur = next;
  }
}

/**
 * Why a checkpoint cannot be deleted yet, or null: a snapshot uses it, a later checkpoint was
 * taken over it, or a running sandbox stacks it. (List queries: this is not a hot path.)
 */
export async function checkpointInUse(deps: Pick<SandboxDeps, 'store'>, cp: CheckpointDoc, exceptSnapshot?: string): Promise<string | null> {
  const [snap, child, sandbox] = await Promise.all([
    findSnapshotOfCheckpoint(deps.store, cp.orgId, cp._id, exceptSnapshot),
    findChildCheckpoint(deps.store, cp.orgId, cp.layerId),
    findSandboxOnCheckpoint(deps.store, cp.orgId, cp._id),
  ]);
  if (snap) return `snapshot ${snap._id} uses it`;
  if (child) return `checkpoint ${child._id} was taken over it`;
  if (sandbox) return `sandbox ${sandbox._id} runs from it`;
  return null;
}

/**
 * Removes a checkpoint's record and patches, and releases its layer on every live host (the one that
 * took it and those that copied it): a host removes it at once where nothing uses it, else once the
 * last sandbox or layer standing on it there is gone (sandbox/base/layer-gc.ts).
 */
export async function deleteCheckpoint(
  deps: Pick<SandboxDeps, 'store' | 'logger'> & { hosts: Pick<SandboxDeps['hosts'], 'liveHosts' | 'get'> },
  cp: CheckpointDoc,
): Promise<void> {
  await deleteCheckpointRecords(deps.store, cp._id);
  await releaseCheckpointName(deps.store, cp);
  const hosts: { hostId: string; client: HostClient }[] = await deps.hosts.liveHosts().catch(() => []);
  if (!hosts.some((h) => h.hostId === cp.hostId)) {
    const own = await deps.hosts.get(cp.hostId).catch(() => null);
    if (own) hosts.push({ hostId: cp.hostId, client: own });
  }
  await Promise.all(
    hosts.map((h) =>
      h.client
        .deleteLayer(cp.layerId)
        .catch((err) => deps.logger.warn({ err: String(err), layerId: cp.layerId, hostId: h.hostId }, 'could not delete a layer')),
    ),
  );
}

/** A host's failure to read or capture sandbox `sandboxId`, as the API answers it: 409 when it is gone or not running, else 503. */
function captureFailed(sandboxId: string, err: unknown): ApiError {
  const e = err as { type?: string; message?: string };
  const message = e.message ?? String(err);
  if (e.type === 'not_found' || e.type === 'conflict') return conflict(`sandbox ${sandboxId} cannot be checkpointed: ${message}`);
  return new ApiError('unavailable', `could not checkpoint the sandbox: ${message}`);
}

/** The checkpoint operations of the API, over the sandbox service (spawning provisions a sandbox). */
export function createCheckpointService(deps: SandboxDeps, sandboxes: SandboxService) {
  /** The organisation's checkpoint `id` of sandbox `sandboxId`, or 404. */
  async function ofSandbox(orgId: string, sandboxId: string, id: string): Promise<CheckpointDoc> {
    const cp = await getOrgCheckpoint(deps, orgId, id);
    if (cp.sandboxId !== sandboxId) throw notFound(`checkpoint ${id} of sandbox ${sandboxId}`);
    return cp;
  }

  return {
    get: ofSandbox,

    /**
     * Captures a running sandbox's writable layer (copied while it is frozen) as a checkpoint. What it
     * will add (the layer's use, as the sandbox's disk reports it) is reserved first: 507 over the
     * storage quota, before anything is copied or recorded. A copy larger than its reservation is
     * refused (507) and deleted unless the quota has room for the difference. OpenComputer's rules: at
     * most MAX_CHECKPOINTS_PER_SANDBOX (10) per sandbox, failed ones included (400 for the next, until
     * one is deleted), and a name another checkpoint of the sandbox has is 409.
     */
    async capture(orgId: string, sandboxId: string, name?: string): Promise<CheckpointDoc> {
      const sb = await sandboxes.get(orgId, sandboxId);
      if (sb.status !== 'running') throw conflict(`sandbox ${sb._id} is ${sb.status}`);
      // Counted before the name is claimed: two creates at once at the tenth may both pass (as OpenComputer's).
      if ((await countSandboxCheckpoints(deps.store, sb._id)) >= MAX_CHECKPOINTS_PER_SANDBOX)
        throw invalid(`maximum ${MAX_CHECKPOINTS_PER_SANDBOX} checkpoints per sandbox: delete one to take another`);
      const id = `cp-${randomId()}`;
      if (!(await claimCheckpointName(deps.store, sb._id, name || id, id))) throw conflict(`checkpoint name already exists for this sandbox: ${name}`);
      // Refused before anything is recorded (no host, no reading of its disk, no room): the name is free again.
      const reserved = await (async () => {
        const host = await deps.hosts.get(sb.hostId);
        const need = await writableLayerBytes(host, sb._id).catch((err) => {
          throw captureFailed(sb._id, err);
        });
        return { host, need, hold: await reserveStorage(deps, orgId, id, need) };
      })().catch(async (err) => {
        await releaseCheckpointName(deps.store, { _id: id, sandboxId: sb._id, name: name || id }).catch(() => undefined);
        throw err;
      });
      const { host, need, hold } = reserved;
      try {
        // Recorded as processing first: a list or spawn meanwhile sees it (and a spawn waits for it).
        const doc: CheckpointDoc = {
          _id: id,
          orgId,
          sandboxId: sb._id,
          hostId: sb.hostId,
          name: name || id,
          layerId: id,
          parents: [],
          patchSeq: 0,
          status: 'processing',
          error: null,
          sizeBytes: null,
          createdAt: new Date(),
        };
        await insertCheckpoint(deps.store, doc);
        let layer: { layerId: string; parents: string[]; sizeBytes?: number };
        try {
          layer = await host.createCheckpoint(sb._id, id);
        } catch (err) {
          const failed = captureFailed(sb._id, err);
          await updateCheckpoint(deps.store, id, { status: 'failed', error: (err as Error).message ?? String(err) });
          throw failed;
        }
        // Without a measure of the copy, the disk's reading stands for it.
        const sizeBytes = layer.sizeBytes ?? need;
        const done = { layerId: layer.layerId, parents: layer.parents, status: 'ready' as const, sizeBytes };
        try {
          await hold.grow(sizeBytes);
          // Its size is recorded before the hold is released: a capture judging the room meanwhile counts it at least once.
          await updateCheckpoint(deps.store, id, done);
        } catch (err) {
          if (err instanceof ApiError) await updateCheckpoint(deps.store, id, { status: 'failed', error: err.message }).catch(() => undefined);
          await host.deleteLayer(layer.layerId).catch(() => undefined);
          throw err;
        }
        return Object.assign(doc, done);
      } finally {
        await hold.release();
      }
    },

    /** A sandbox's checkpoints, oldest first. */
    async list(orgId: string, sandboxId: string): Promise<CheckpointDoc[]> {
      const sb = await sandboxes.get(orgId, sandboxId);
      const docs = await listSandboxCheckpoints(deps.store, sb._id);
      return docs.filter((d) => d.orgId === orgId);
    },

    /**
     * Deletes a checkpoint and its patches at once; its layer stays on a host while sandboxes spawned
     * from it (running or hibernated) or checkpoints taken over it use it there. 409 while it is
     * processing, or while a snapshot is made of it (delete the snapshot).
     */
    async remove(orgId: string, sandboxId: string, id: string): Promise<CheckpointDoc> {
      const cp = await ofSandbox(orgId, sandboxId, id);
      if (checkpointStatus(cp).status === 'processing') throw conflict(`checkpoint ${cp._id} is still processing`);
      const snap = await findSnapshotOfCheckpoint(deps.store, cp.orgId, cp._id);
      if (snap) throw conflict(`checkpoint ${cp._id} is in use: snapshot ${snap._id} uses it`);
      // A turn's checkpoint belongs to its conversation: its rewinds, forks and deletion free it (services/conversations/checkpoint-gc.ts).
      const turn = turnOfCheckpoint(cp._id);
      if (turn && (await findConversation(deps.store, turn.conversationId)))
        throw conflict(
          `checkpoint ${cp._id} is turn ${turn.turn} of conversation ${turn.conversationId}: it is freed by a rewind past it or by deleting the conversation`,
        );
      await deleteCheckpoint(deps, cp);
      return cp;
    },

    /** Puts a running sandbox's files back to a checkpoint in place (its patches first); answers the sandbox. */
    async restore(orgId: string, sandboxId: string, id: string): Promise<SandboxDoc> {
      const sb = await sandboxes.get(orgId, sandboxId);
      if (sb.status !== 'running') throw conflict(`sandbox ${sb._id} is ${sb.status}; only a running sandbox can be restored`);
      const cp = await readyCheckpoint(deps, await getOrgCheckpoint(deps, orgId, id));
      // Taken on another host: its layer (and parents) are copied to the sandbox's host first.
      if (cp.hostId !== sb.hostId) await deps.hosts.bringLayers(sb.hostId, cp.hostId, [cp.layerId]);
      const patches = patchRefs(await listPatches(deps.store, cp));
      const host = await deps.hosts.get(sb.hostId);
      let info;
      try {
        info = await host.restore(
          sb._id,
          cp.layerId,
          patches.map((p) => ({ id: p.id, script: p.script })),
        );
      } catch (err) {
        const e = err as { type?: string; message?: string };
        if (e.type === 'patch_failed') {
          // The host keeps it hibernated over the checkpoint: a wake retries the patches.
          const now = new Date();
          await updateSandbox(
            deps.store,
            sb._id,
            {
              status: 'hibernated',
              hibernation: { layerId: cp.layerId, at: now },
              fromCheckpoint: cp._id,
              // Made again over the checkpoint's layer: none of its patches is in it; the wake runs them all.
              patchesApplied: [],
              patchFailed: null,
              updatedAt: now,
            },
            sb,
          );
          throw conflict(`sandbox ${sb._id} was restored but a patch failed, so it is hibernated (wake retries): ${e.message}`);
        }
        if (e.type === 'conflict' || e.type === 'not_found') throw conflict(`sandbox ${sb._id} cannot be restored: ${e.message}`);
        throw new ApiError('unavailable', `could not restore the sandbox: ${e.message ?? String(err)}`);
      }
      // It now stands on the checkpoint (its layer is kept on the host while it does) and has all its patches.
      const now = new Date();
      const set = { fromCheckpoint: cp._id, ...patchRecord([], patches, info.patches ?? []), lastActiveAt: now, updatedAt: now };
      await updateSandbox(deps.store, sb._id, set);
      return { ...sb, ...set };
    },

    /**
     * Spawns a sandbox from a checkpoint (copy-on-write over its layer; its patches run first, in order).
     * A failing patch stops the chain: the sandbox is created with the patches before it, and its view
     * says which failed (patchError, patches.failed); the next wake after it is deleted applies the rest.
     */
    async spawn(orgId: string, id: string, body: SandboxCreateRequest): Promise<SandboxDoc> {
      const cp = await readyCheckpoint(deps, await getOrgCheckpoint(deps, orgId, id));
      const patches = await listPatches(deps.store, cp);
      return sandboxes.provision(orgId, body, {
        layers: [cp.layerId],
        patches: patchRefs(patches),
        keepOnPatchFailure: true,
        fromCheckpoint: cp._id,
        hostId: cp.hostId,
      });
    },

    /** Adds a patch with the next sequence number. */
    async addPatch(orgId: string, id: string, patch: { script: string; description: string }): Promise<PatchDoc> {
      const cp = await getOrgCheckpoint(deps, orgId, id);
      try {
        return await createPatch(deps.store, cp, patch);
      } catch (err) {
        if ((err as { code?: string }).code === 'not_found') throw notFound(`checkpoint ${cp._id}`);
        throw err;
      }
    },

    /** A checkpoint's patches in sequence order. */
    async listPatches(orgId: string, id: string): Promise<PatchDoc[]> {
      return listPatches(deps.store, await getOrgCheckpoint(deps, orgId, id));
    },

    /** Deletes a patch (its sequence number is not reused); answers it. */
    async removePatch(orgId: string, id: string, patchId: string): Promise<PatchDoc> {
      const cp = await getOrgCheckpoint(deps, orgId, id);
      const patch = await findPatch(deps.store, patchId);
      if (!patch || patch.checkpointId !== cp._id || patch.deleted) throw notFound(`patch ${patchId}`);
      await deletePatch(deps.store, patch._id);
      return patch;
    },
  };
}

/** The checkpoint operations (see createCheckpointService). */
export type CheckpointService = ReturnType<typeof createCheckpointService>;
