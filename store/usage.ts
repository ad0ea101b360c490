import type { Store } from './index';
import { checkpointsOf, snapshotsOf } from './checkpoints';

/** What an organisation's checkpoints and snapshots hold on the hosts' disks. */
export interface StorageUsage {
  /** Bytes of the layers of its checkpoints (a snapshot's build makes one), failed ones left out. */
  usedBytes: number;
  checkpoints: number;
  snapshots: number;
}

/**
 * The organisation's storage use: the sum of its checkpoints' recorded sizes (a checkpoint still
 * being copied counts 0 until its size is known), and how many checkpoints and snapshots it has.
 * `exceptCheckpoint` is left out (a capture judging whether the others leave room for it).
 */
export async function storageUsage(store: Store, orgId: string, exceptCheckpoint?: string): Promise<StorageUsage> {
  const filter = { orgId, status: { $ne: 'failed' as const }, ...(exceptCheckpoint ? { _id: { $ne: exceptCheckpoint } } : {}) };
  const [docs, snapshots] = await Promise.all([
    checkpointsOf(store)
      .find(filter, { projection: { sizeBytes: 1 } })
      .toArray(),
    snapshotsOf(store).countDocuments({ orgId }),
  ]);
  return { usedBytes: docs.reduce((n, d) => n + (d.sizeBytes ?? 0), 0), checkpoints: docs.length, snapshots };
}

/** The organisation's own storage quota setting in MB (settings.storageQuotaMB), or undefined. */
export async function orgStorageQuotaMB(store: Store, orgId: string): Promise<number | undefined> {
  const org = await store.orgs.findOne({ _id: orgId }, { projection: { settings: 1 } });
  return org?.settings?.storageQuotaMB;
}
