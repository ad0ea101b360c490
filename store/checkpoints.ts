import type { Store } from './index';
import { isDuplicateKey } from './index';
import { countedBytes, putStorageEntry } from './storage-entries';

/**
 * A checkpoint: a copy of a sandbox's writable layer, kept as read-only layer `layerId` on the
 * host that took it (`hostId`). Sandboxes spawned from it stack that layer (and its `parents`)
 * copy-on-write, so they are created on that same host.
 * `patchSeq` is the highest patch sequence handed out so far (a hint, see createPatch).
 */
export interface CheckpointDoc {
  _id: string;
  orgId: string;
  sandboxId: string;
  hostId: string;
  name: string;
  layerId: string;
  /** The layers the checkpoint was taken over (its sandbox's own layers), topmost first. */
  parents: string[];
  patchSeq: number;
  /** `processing` while the host copies the layer; absent in records written before it existed (ready). */
  status?: 'processing' | 'ready' | 'failed';
  /** Why it failed (status failed). */
  error?: string | null;
  /** Bytes of the layer's own files. */
  sizeBytes?: number | null;
  createdAt: Date;
}

/** A checkpoint still `processing` after this long was abandoned (its API died mid-copy): shown as failed. */
export const CHECKPOINT_STALE_MS = 10 * 60_000;

/** The status of a checkpoint as callers see it. */
export function checkpointStatus(c: CheckpointDoc, now = Date.now()): { status: 'processing' | 'ready' | 'failed'; error: string | null } {
  const status = c.status ?? 'ready';
  if (status === 'processing' && now - c.createdAt.getTime() > CHECKPOINT_STALE_MS) return { status: 'failed', error: 'interrupted: the copy did not finish' };
  return { status, error: c.error ?? null };
}

/**
 * A patch of a checkpoint. `_id` is `pa-<checkpoint id body>-<sequence>`, so the unique `_id`
 * index is what keeps sequence numbers unique, and a checkpoint's patches are read by `_id`.
 * A deleted patch stays as a tombstone (`deleted: true`, script emptied) so its number is never
 * reused and readers can walk past it.
 */
export interface PatchDoc {
  _id: string;
  orgId: string;
  checkpointId: string;
  sequence: number;
  script: string;
  description: string;
  strategy: 'on_wake';
  deleted: boolean;
  createdAt: Date;
}

/** One build step of an image manifest (the open API's shape). */
export type ImageStep =
  | { type: 'run'; args: { commands: string[] } }
  | { type: 'apt_install'; args: { packages: string[] } }
  | { type: 'pip_install'; args: { packages: string[] } }
  | { type: 'env'; args: { vars: Record<string, string> } }
  | { type: 'workdir'; args: { path: string } }
  | { type: 'add_file'; args: { path: string; content: string; encoding?: 'base64' | 'utf8' } }
  | { type: 'add_dir'; args: { path: string; files: { relativePath: string; content: string }[] } };

export interface ImageManifest {
  base: string;
  steps: ImageStep[];
  builderMemoryMB?: number;
}

/**
 * A snapshot: a named checkpoint, built from an image manifest or taken from an existing
 * checkpoint. `env` and `workdir` are what the manifest's `env`/`workdir` steps set; every
 * sandbox started from the snapshot gets them (envs, default working directory).
 * The manifest is kept as JSON text (see AgentDoc).
 */
export interface SnapshotDoc {
  _id: string;
  orgId: string;
  name: string;
  status: 'building' | 'ready' | 'failed';
  contentHash: string | null;
  checkpointId: string | null;
  /** Denormalised from the checkpoint, so that placing a sandbox needs no second read. */
  hostId: string | null;
  layerId: string | null;
  /** True when the checkpoint was made by this snapshot's build (it is deleted with it). */
  ownsCheckpoint: boolean;
  manifest: string;
  /** Pairs, not an object: env names are caller-chosen keys (and FerretDB stores no nested arrays). */
  env: { name: string; value: string }[];
  workdir: string | null;
  error: string | null;
  /** The build's sandbox and its liveness, while building (a build whose heartbeat stops is failed). */
  build: { sandboxId: string; hostId: string; heartbeatAt: Date } | null;
  createdAt: Date;
  updatedAt: Date;
  lastUsedAt: Date;
}

/** `_id` is `<orgId>/<name>`: the unique index that makes names unique per organisation. */
export interface SnapshotNameDoc {
  _id: string;
  snapshotId: string;
}

/** `_id` is `<sandboxId>/<name>`: the unique index that makes checkpoint names unique per sandbox. */
export interface CheckpointNameDoc {
  _id: string;
  checkpointId: string;
  at: Date;
}

export const checkpointsOf = (s: Store) => s.db.collection<CheckpointDoc>('checkpoints');
const checkpointNamesOf = (s: Store) => s.db.collection<CheckpointNameDoc>('checkpoint_names');
const patchesOf = (s: Store) => s.db.collection<PatchDoc>('patches');
export const snapshotsOf = (s: Store) => s.db.collection<SnapshotDoc>('snapshots');
const snapshotNamesOf = (s: Store) => s.db.collection<SnapshotNameDoc>('snapshot_names');

const snapshotNameKey = (orgId: string, name: string): string => `${orgId}/${name}`;

/** The `_id` of patch number `sequence` of a checkpoint. */
export function patchIdFor(checkpointId: string, sequence: number): string {
  return `pa-${checkpointId.replace(/^cp-/, '')}-${sequence}`;
}

/** The organisation's checkpoint, or null. */
export async function findOrgCheckpoint(store: Store, orgId: string, id: string): Promise<CheckpointDoc | null> {
  const doc = await checkpointsOf(store).findOne({ _id: id });
  return doc && doc.orgId === orgId ? doc : null;
}

/**
 * Adds a patch with the next sequence number. Numbers come from `$inc` on the checkpoint's
 * `patchSeq`, and the insert of `_id` = (checkpoint, number) is what guarantees uniqueness:
 * a number already taken (FerretDB may lose concurrent `$inc`s) fails the insert and the next
 * number is tried. Every number handed out is inserted by its holder or already exists, so the
 * sequence has no gaps (unless a process dies between the two writes).
 */
export async function createPatch(store: Store, cp: CheckpointDoc, patch: { script: string; description: string }): Promise<PatchDoc> {
  const next = async (): Promise<number> => {
    const r = await checkpointsOf(store).findOneAndUpdate({ _id: cp._id }, { $inc: { patchSeq: 1 } }, { returnDocument: 'after' });
    if (!r) throw Object.assign(new Error(`checkpoint ${cp._id} not found`), { code: 'not_found' });
    return r.patchSeq;
  };
  let seq = await next();
  for (let attempt = 0; attempt < 1000; attempt++) {
    const doc: PatchDoc = {
      _id: patchIdFor(cp._id, seq),
      orgId: cp.orgId,
      checkpointId: cp._id,
      sequence: seq,
      script: patch.script,
      description: patch.description,
      strategy: 'on_wake',
      deleted: false,
      createdAt: new Date(),
    };
    try {
      await patchesOf(store).insertOne(doc);
      return doc;
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
      seq = Math.max(seq + 1, await next());
    }
  }
  throw new Error(`could not allocate a patch number for ${cp._id}`);
}

/**
 * The live patches of a checkpoint in sequence order, read by `_id` only: numbers 1..patchSeq in
 * parallel, then onwards one by one until a number is missing (patchSeq may lag behind).
 */
export async function listPatches(store: Store, cp: Pick<CheckpointDoc, '_id' | 'patchSeq'>): Promise<PatchDoc[]> {
  const col = patchesOf(store);
  const known = Math.max(0, cp.patchSeq ?? 0);
  const seqs = Array.from({ length: known + 1 }, (_, i) => i + 1);
  const docs = await Promise.all(seqs.map((n) => col.findOne({ _id: patchIdFor(cp._id, n) })));
  const all = docs.filter((d): d is PatchDoc => d !== null);
  if (docs[known] !== null) {
    for (let n = known + 2; ; n++) {
      const d = await col.findOne({ _id: patchIdFor(cp._id, n) });
      if (!d) break;
      all.push(d);
    }
  }
  return all.filter((p) => !p.deleted).sort((a, b) => a.sequence - b.sequence);
}

/** Tombstones a patch; false when it does not exist or was deleted already. */
export async function deletePatch(store: Store, patchId: string): Promise<boolean> {
  const r = await patchesOf(store).updateOne({ _id: patchId }, { $set: { deleted: true, script: '' } });
  return r.modifiedCount === 1;
}

/** The organisation's snapshot by id (`snap-…`) or name, or null. */
export async function findOrgSnapshot(store: Store, orgId: string, idOrName: string): Promise<SnapshotDoc | null> {
  if (/^snap-[a-z0-9]+$/.test(idOrName)) {
    const doc = await snapshotsOf(store).findOne({ _id: idOrName });
    if (doc && doc.orgId === orgId) return doc;
  }
  const named = await snapshotNamesOf(store).findOne({ _id: snapshotNameKey(orgId, idOrName) });
  if (!named) return null;
  const doc = await snapshotsOf(store).findOne({ _id: named.snapshotId });
  return doc && doc.orgId === orgId ? doc : null;
}

/** Sets a snapshot's lastUsedAt, at most once every 10 s per snapshot per process (it costs a write). */
const used = new Map<string, number>();
export async function touchSnapshot(store: Store, id: string): Promise<void> {
  const now = Date.now();
  if ((used.get(id) ?? 0) > now - 10_000) return;
  used.set(id, now);
  if (used.size > 10_000) used.clear();
  await snapshotsOf(store).updateOne({ _id: id }, { $set: { lastUsedAt: new Date(now) } });
}

/** Records a checkpoint (its storage entry first: see store/storage-entries.ts). */
export async function insertCheckpoint(store: Store, doc: CheckpointDoc): Promise<void> {
  await putStorageEntry(store, doc.orgId, doc._id, countedBytes(doc));
  await checkpointsOf(store).insertOne(doc);
}

/** A checkpoint by id (any organisation), or null. */
export function findCheckpoint(store: Store, id: string): Promise<CheckpointDoc | null> {
  return checkpointsOf(store).findOne({ _id: id });
}

/**
 * Sets fields of a checkpoint's record. A change of its size or status moves its storage entry too:
 * before the record when it counts more, after it when it counts less (store/storage-entries.ts).
 */
export async function updateCheckpoint(store: Store, id: string, set: Partial<CheckpointDoc>): Promise<void> {
  const counts = 'sizeBytes' in set || 'status' in set;
  const before = counts ? await checkpointsOf(store).findOne({ _id: id }, { projection: { orgId: 1, status: 1, sizeBytes: 1 } }) : null;
  if (!before) {
    await checkpointsOf(store).updateOne({ _id: id }, { $set: set });
    return;
  }
  const was = countedBytes(before) ?? -1;
  const bytes = countedBytes({ ...before, ...set });
  const grows = (bytes ?? -1) > was;
  if (grows) await putStorageEntry(store, before.orgId, id, bytes);
  await checkpointsOf(store).updateOne({ _id: id }, { $set: set });
  if (!grows) await putStorageEntry(store, before.orgId, id, bytes);
}

/** The checkpoints taken of a sandbox, oldest first (at most 1000). */
export function listSandboxCheckpoints(store: Store, sandboxId: string): Promise<CheckpointDoc[]> {
  return checkpointsOf(store).find({ sandboxId }).sort({ createdAt: 1 }).limit(1000).toArray();
}

/** How many checkpoints of a sandbox are recorded (processing, ready or failed). */
export function countSandboxCheckpoints(store: Store, sandboxId: string): Promise<number> {
  return checkpointsOf(store).countDocuments({ sandboxId });
}

/**
 * Claims checkpoint name `name` of a sandbox for checkpoint `checkpointId`; false when another
 * checkpoint of the sandbox has it. The claim's `_id` is what keeps two creates at once from both
 * having it (the claim comes first, the record right after it); a record of the name without a claim
 * (written before claims existed) counts too, and a claim whose checkpoint was still not recorded
 * CHECKPOINT_STALE_MS later (its API died between the two) is taken over.
 */
export async function claimCheckpointName(store: Store, sandboxId: string, name: string, checkpointId: string, now = new Date()): Promise<boolean> {
  if (await checkpointsOf(store).findOne({ sandboxId, name }, { projection: { _id: 1 } })) return false;
  const _id = `${sandboxId}/${name}`;
  try {
    await checkpointNamesOf(store).insertOne({ _id, checkpointId, at: now });
    return true;
  } catch (err) {
    if (!isDuplicateKey(err)) throw err;
  }
  const claim = await checkpointNamesOf(store).findOne({ _id });
  if (!claim || now.getTime() - claim.at.getTime() < CHECKPOINT_STALE_MS) return false;
  if (await checkpointsOf(store).findOne({ _id: claim.checkpointId }, { projection: { _id: 1 } })) return false;
  const taken = await checkpointNamesOf(store).updateOne({ _id, checkpointId: claim.checkpointId }, { $set: { checkpointId, at: now } });
  return taken.modifiedCount === 1;
}

/** Frees a checkpoint's name of its sandbox (only while checkpoint `checkpointId` holds it). */
export async function releaseCheckpointName(store: Store, cp: Pick<CheckpointDoc, '_id' | 'sandboxId' | 'name'>): Promise<void> {
  await checkpointNamesOf(store).deleteOne({ _id: `${cp.sandboxId}/${cp.name}`, checkpointId: cp._id });
}

/** A checkpoint of the organisation taken over layer `layerId` (its id only), or null. */
export function findChildCheckpoint(store: Store, orgId: string, layerId: string): Promise<{ _id: string } | null> {
  return checkpointsOf(store).findOne({ orgId, parents: layerId }, { projection: { _id: 1 } });
}

/** The organisation's checkpoints taken over layer `layerId` (id, layer and parents; at most 1000). */
export function listChildCheckpoints(store: Store, orgId: string, layerId: string): Promise<Pick<CheckpointDoc, '_id' | 'layerId' | 'parents'>[]> {
  return checkpointsOf(store)
    .find({ orgId, parents: layerId }, { projection: { _id: 1, layerId: 1, parents: 1 } })
    .limit(1000)
    .toArray();
}

/** Removes a checkpoint's record, its patches' records and its storage entry (last: see store/storage-entries.ts). */
export async function deleteCheckpointRecords(store: Store, id: string): Promise<void> {
  const doc = await checkpointsOf(store).findOne({ _id: id }, { projection: { orgId: 1 } });
  await checkpointsOf(store).deleteOne({ _id: id });
  await patchesOf(store).deleteMany({ checkpointId: id });
  if (doc) await putStorageEntry(store, doc.orgId, id, null);
}

/** A patch by id (tombstones included), or null. */
export function findPatch(store: Store, id: string): Promise<PatchDoc | null> {
  return patchesOf(store).findOne({ _id: id });
}

/** A snapshot of the organisation over checkpoint `checkpointId`, other than `exceptSnapshot` (its id only), or null. */
export function findSnapshotOfCheckpoint(store: Store, orgId: string, checkpointId: string, exceptSnapshot?: string): Promise<{ _id: string } | null> {
  return snapshotsOf(store).findOne(exceptSnapshot ? { orgId, checkpointId, _id: { $ne: exceptSnapshot } } : { orgId, checkpointId }, {
    projection: { _id: 1 },
  });
}

/** Records a snapshot. */
export async function insertSnapshot(store: Store, doc: SnapshotDoc): Promise<void> {
  await snapshotsOf(store).insertOne(doc);
}

/** Sets fields of a snapshot's record. */
export async function updateSnapshot(store: Store, id: string, set: Partial<SnapshotDoc> | Record<string, unknown>): Promise<void> {
  await snapshotsOf(store).updateOne({ _id: id }, { $set: set });
}

/** Removes a snapshot's record. */
export async function deleteSnapshotRecord(store: Store, id: string): Promise<void> {
  await snapshotsOf(store).deleteOne({ _id: id });
}

/** Claims a snapshot name in the organisation (a taken name throws the store's duplicate-key error). */
export async function reserveSnapshotName(store: Store, orgId: string, name: string, snapshotId: string): Promise<void> {
  await snapshotNamesOf(store).insertOne({ _id: snapshotNameKey(orgId, name), snapshotId });
}

/** Frees a snapshot name in the organisation. */
export async function releaseSnapshotName(store: Store, orgId: string, name: string): Promise<void> {
  await snapshotNamesOf(store).deleteOne({ _id: snapshotNameKey(orgId, name) });
}

/** The organisation's snapshots, newest first (at most 1000). */
export function listOrgSnapshots(store: Store, orgId: string): Promise<SnapshotDoc[]> {
  return snapshotsOf(store).find({ orgId }).sort({ createdAt: -1 }).limit(1000).toArray();
}

/** An agent of the organisation whose snapshot is one of `refs` (id or name; its id only), or null. */
export function findAgentOfSnapshot(store: Store, orgId: string, refs: string[]): Promise<{ id: string } | null> {
  return store.agents.findOne({ orgId, snapshot: { $in: refs } }, { projection: { id: 1 } });
}
