/** A snapshot as the image of a new sandbox: its layer, its checkpoint's patches, its env and workdir. */
import type { Store } from '../../store';
import { findCheckpoint, findOrgSnapshot, listPatches, touchSnapshot } from '../../store/checkpoints';

/** What a sandbox started from a snapshot is made of. */
export interface ResolvedImage {
  snapshotId: string;
  checkpointId: string;
  hostId: string;
  layers: string[];
  patches: { id: string; sequence: number; script: string }[];
  env: Record<string, string>;
  workdir: string | null;
}

/** Why a snapshot cannot be used: `not_found`, or `not_ready` (building or failed). */
export class ImageError extends Error {
  override name = 'ImageError';
  constructor(
    readonly code: 'not_found' | 'not_ready',
    message: string,
  ) {
    super(message);
  }
}

/**
 * Resolves a snapshot (id or name, in the organisation) to its layer and the checkpoint's current
 * patches, and marks it used. Throws ImageError.
 */
export async function resolveImage(store: Store, orgId: string, ref: string): Promise<ResolvedImage> {
  const snap = await findOrgSnapshot(store, orgId, ref);
  if (!snap) throw new ImageError('not_found', `snapshot ${ref} not found`);
  if (snap.status !== 'ready' || !snap.checkpointId || !snap.layerId || !snap.hostId) {
    throw new ImageError('not_ready', `snapshot ${ref} is ${snap.status}${snap.error ? `: ${snap.error}` : ''}`);
  }
  const cp = await findCheckpoint(store, snap.checkpointId);
  if (!cp) throw new ImageError('not_found', `checkpoint ${snap.checkpointId} of snapshot ${ref} not found`);
  const [patches] = await Promise.all([listPatches(store, cp), touchSnapshot(store, snap._id)]);
  return {
    snapshotId: snap._id,
    checkpointId: cp._id,
    hostId: cp.hostId,
    layers: [cp.layerId],
    patches: patches.map((p) => ({ id: p._id, sequence: p.sequence, script: p.script })),
    env: Object.fromEntries(snap.env.map((e) => [e.name, e.value])),
    workdir: snap.workdir,
  };
}
