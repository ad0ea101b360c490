/**
 * Snapshots: named checkpoints, built from an image manifest (services/checkpoints/snapshot-builder.ts) or taken
 * from an existing checkpoint; the image cache of sandbox creates; where an agent's snapshot lives.
 */
import { createHash } from 'node:crypto';
import { hostTaskQueue } from '../../config';
import { ApiError, conflict, invalid, notFound } from '../../contract/errors';
import { randomId } from '../../lib/ids';
import { isDuplicateKey } from '../../store';
import {
  deleteSnapshotRecord,
  findAgentOfSnapshot,
  findOrgSnapshot,
  ImageManifest,
  insertSnapshot,
  listOrgSnapshots,
  releaseSnapshotName,
  reserveSnapshotName,
  SnapshotDoc,
} from '../../store/checkpoints';
import { findRunningSandboxOfSnapshot } from '../../store/sandboxes';
import { checkpointInUse, deleteCheckpoint, getOrgCheckpoint, readyCheckpoint } from './checkpoints';
import type { SandboxDeps } from '../deps';
import { buildSnapshot, chainHash, reapStaleBuild, type BuildLog } from './snapshot-builder';
import { assertStorageRoom } from './storage-quota';

export type { ImageManifest, SnapshotDoc };

/** A new snapshot record, `building`, named `name` (not stored yet). */
function newSnapshotDoc(orgId: string, name: string, manifest: ImageManifest): SnapshotDoc {
  const now = new Date();
  return {
    _id: `snap-${randomId()}`,
    orgId,
    name,
    status: 'building',
    contentHash: null,
    checkpointId: null,
    hostId: null,
    layerId: null,
    ownsCheckpoint: false,
    manifest: JSON.stringify(manifest),
    env: [],
    workdir: null,
    error: null,
    build: null,
    createdAt: now,
    updatedAt: now,
    lastUsedAt: now,
  };
}

/** The name under which an image given at sandbox create is cached: `image-` + 24 hex digits of its manifest's hash. */
export function imageCacheName(manifest: ImageManifest): string {
  const canonical = JSON.stringify({ base: manifest.base, steps: manifest.steps });
  return `image-${createHash('sha256').update(canonical).digest('hex').slice(0, 24)}`;
}

/** 400 when an image's builder asks for more memory than SANDBOX_MAX_MEMORY_MB. */
export function assertBuilderMemory(deps: Pick<SandboxDeps, 'cfg'>, image: ImageManifest | undefined): void {
  const builderMB = image?.builderMemoryMB;
  if (builderMB !== undefined && builderMB > deps.cfg.limits.maxMemoryMB) {
    throw invalid(`body.image.builderMemoryMB: ${builderMB} is above the maximum of ${deps.cfg.limits.maxMemoryMB} MB (SANDBOX_MAX_MEMORY_MB)`);
  }
}

const IMAGE_WAIT_MS = 30 * 60_000;

/**
 * The snapshot of an image given at sandbox create, built once per organisation and manifest: a ready
 * one is reused (no build); one being built by another request is waited for; a failed one is built
 * again; otherwise it is built here, its steps' output going to `log`. Throws conflict when the
 * build fails (with its error).
 */
export async function imageSnapshot(deps: SandboxDeps, orgId: string, manifest: ImageManifest, log: BuildLog): Promise<SnapshotDoc> {
  const name = imageCacheName(manifest);
  const deadline = Date.now() + IMAGE_WAIT_MS;
  for (let attempt = 0; ; attempt++) {
    const found = await findOrgSnapshot(deps.store, orgId, name);
    const cur = found ? await reapStaleBuild(deps, found) : null;
    if (cur?.status === 'ready') {
      log({ step: 0, type: 'cache', message: `image ${name} is built already (snapshot ${cur._id}): no build` });
      return cur;
    }
    if (cur?.status === 'failed') {
      if (attempt > 0) throw conflict(`the image build failed: ${cur.error ?? 'unknown error'}`);
      // A failed build of the same manifest is built again (it may have been a network failure).
      await deleteSnapshotRecord(deps.store, cur._id);
      await releaseSnapshotName(deps.store, orgId, name);
      continue;
    }
    if (cur?.status === 'building') {
      if (Date.now() > deadline) throw conflict(`image ${name} is still building`);
      await new Promise((r) => setTimeout(r, 500));
      attempt = -1;
      continue;
    }
    await assertStorageRoom(deps, orgId);
    const doc = newSnapshotDoc(orgId, name, manifest);
    try {
      await reserveSnapshotName(deps.store, orgId, name, doc._id);
    } catch (err) {
      if (isDuplicateKey(err)) continue; // another request started the build just now
      throw err;
    }
    try {
      await insertSnapshot(deps.store, doc);
    } catch (err) {
      await releaseSnapshotName(deps.store, orgId, name);
      throw err;
    }
    const done = await buildSnapshot(deps, doc, manifest, log);
    if (done.refusal) throw done.refusal;
    if (done.status !== 'ready') throw conflict(`the image build failed: ${done.error ?? 'unknown error'}`);
    return done;
  }
}

/**
 * Where sessions and instances of an agent with `snapshot` (id or name) are provisioned: the
 * snapshot's id and the task queue of the host that has its layer. 400 when it is missing or not ready.
 */
export async function snapshotRefOf(deps: Pick<SandboxDeps, 'store' | 'cfg'>, orgId: string, ref: string): Promise<{ snapshotId: string; taskQueue: string }> {
  const snap = await findOrgSnapshot(deps.store, orgId, ref);
  if (!snap) throw invalid(`the agent's snapshot ${ref} does not exist`);
  if (snap.status !== 'ready' || !snap.hostId) throw invalid(`the agent's snapshot ${ref} is ${snap.status}, not ready`);
  return { snapshotId: snap._id, taskQueue: hostTaskQueue(deps.cfg, snap.hostId) };
}

/** The snapshot operations of the API. */
export function createSnapshotService(deps: SandboxDeps) {
  /** The organisation's snapshot by id or name (a dead build is reported failed), or 404. */
  async function get(orgId: string, idOrName: string): Promise<SnapshotDoc> {
    const s = await findOrgSnapshot(deps.store, orgId, idOrName);
    if (!s) throw notFound(`snapshot ${idOrName}`);
    return reapStaleBuild(deps, s);
  }

  return {
    get,
    imageSnapshot: (orgId: string, manifest: ImageManifest, log: BuildLog) => imageSnapshot(deps, orgId, manifest, log),
    snapshotRefOf: (orgId: string, ref: string) => snapshotRefOf(deps, orgId, ref),

    /**
     * Creates a snapshot named `name`: of checkpoint `checkpointId` (ready at once), or of `image`
     * (recorded `building`; `build` then builds it). 409 when the name is taken, 507 over the quota.
     */
    async create(
      orgId: string,
      body: { name: string; image?: ImageManifest; checkpointId?: string },
    ): Promise<{ snapshot: SnapshotDoc; manifest: ImageManifest }> {
      assertBuilderMemory(deps, body.image);
      await assertStorageRoom(deps, orgId);
      const found = body.checkpointId ? await getOrgCheckpoint(deps, orgId, body.checkpointId).catch(() => null) : null;
      if (body.checkpointId && !found) throw invalid(`body.checkpointId: checkpoint ${body.checkpointId} not found`);
      const cp = found ? await readyCheckpoint(deps, found) : null;
      const manifest: ImageManifest = body.image ?? { base: 'base', steps: [] };
      const doc = newSnapshotDoc(orgId, body.name, manifest);
      try {
        await reserveSnapshotName(deps.store, orgId, body.name, doc._id);
      } catch (err) {
        if (isDuplicateKey(err)) throw conflict(`a snapshot named ${body.name} exists`);
        throw err;
      }
      if (cp) {
        try {
          const host = await deps.hosts.get(cp.hostId);
          const hashes = await Promise.all([cp.layerId, ...cp.parents].map((l) => host.layerHash(l)));
          Object.assign(doc, { status: 'ready', contentHash: chainHash(hashes), checkpointId: cp._id, hostId: cp.hostId, layerId: cp.layerId });
          await insertSnapshot(deps.store, doc);
        } catch (err) {
          await releaseSnapshotName(deps.store, orgId, body.name);
          if (err instanceof ApiError) throw err;
          throw new ApiError('unavailable', `could not read the checkpoint's layers: ${(err as Error).message}`);
        }
        return { snapshot: doc, manifest };
      }
      try {
        await insertSnapshot(deps.store, doc);
      } catch (err) {
        await releaseSnapshotName(deps.store, orgId, body.name);
        throw err;
      }
      return { snapshot: doc, manifest };
    },

    /** Builds a `building` snapshot; resolves with it `ready` or `failed` (never throws for a failed build). */
    build: (snap: SnapshotDoc, manifest: ImageManifest, log: BuildLog) => buildSnapshot(deps, snap, manifest, log),

    /** The organisation's snapshots, newest first (dead builds reported failed). */
    async list(orgId: string): Promise<SnapshotDoc[]> {
      const docs = await listOrgSnapshots(deps.store, orgId);
      return Promise.all(docs.map((d) => reapStaleBuild(deps, d)));
    },

    /** Deletes a snapshot (and the checkpoint its build made); 409 while it is building or an agent or a running sandbox uses it. */
    async remove(orgId: string, idOrName: string): Promise<SnapshotDoc> {
      const snap = await get(orgId, idOrName);
      if (snap.status === 'building') throw conflict(`snapshot ${snap.name} is still building`);
      const [agent, sandbox] = await Promise.all([
        findAgentOfSnapshot(deps.store, orgId, [snap._id, snap.name]),
        findRunningSandboxOfSnapshot(deps.store, orgId, snap._id),
      ]);
      if (agent) throw conflict(`snapshot ${snap.name} is used by agent ${agent.id}`);
      if (sandbox) throw conflict(`snapshot ${snap.name} is used by running sandbox ${sandbox._id}`);
      const cp = snap.ownsCheckpoint && snap.checkpointId ? await getOrgCheckpoint(deps, orgId, snap.checkpointId).catch(() => null) : null;
      if (cp) {
        const why = await checkpointInUse(deps, cp, snap._id);
        if (why) throw conflict(`snapshot ${snap.name}'s checkpoint ${cp._id} is in use: ${why}`);
      }
      await deleteSnapshotRecord(deps.store, snap._id);
      await releaseSnapshotName(deps.store, orgId, snap.name);
      if (cp) await deleteCheckpoint(deps, cp);
      return snap;
    },
  };
}

/** The snapshot operations (see createSnapshotService). */
export type SnapshotService = ReturnType<typeof createSnapshotService>;
