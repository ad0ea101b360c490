import type { Store } from './index';
import { checkpointsOf, snapshotsOf } from './checkpoints';
import { settled } from './entry-keys';
import { countedBytes, putStorageEntry, readStorageEntries } from './storage-entries';

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
 * Read from the storage entries (one `_id` range: store/storage-entries.ts), which may count more
 * than the records after a crash, never less: a decision at the quota takes `exactUsage`.
 * `exceptCheckpoint` is left out (a capture judging whether the others leave room for it).
 */
export async function storageUsage(store: Store, orgId: string, exceptCheckpoint?: string): Promise<StorageUsage> {
  const [entries, snapshots] = await Promise.all([readStorageEntries(store, orgId), snapshotsOf(store).countDocuments({ orgId })]);
  if (exceptCheckpoint) entries.delete(exceptCheckpoint);
  let usedBytes = 0;
  for (const e of entries.values()) usedBytes += e.bytes;
  return { usedBytes, checkpoints: entries.size, snapshots };
}

/**
 * The organisation's storage use read from its checkpoint records (a scan: for decisions at the
 * quota only). Entries that count otherwise than their records and were written more than
 * ENTRY_SETTLE_MS ago (no write in flight can explain them) are corrected on the way.
 */
export async function exactUsage(store: Store, orgId: string, exceptCheckpoint?: string, now = Date.now()): Promise<StorageUsage> {
  const [docs, entries, snapshots] = await Promise.all([
    checkpointsOf(store)
      .find({ orgId }, { projection: { status: 1, sizeBytes: 1 } })
      .toArray(),
    readStorageEntries(store, orgId),
    snapshotsOf(store).countDocuments({ orgId }),
  ]);
  const settledEntry = (id: string) => {
    const e = entries.get(id);
    return !e || settled(e.at, now);
  };
  let usedBytes = 0;
  let checkpoints = 0;
  for (const d of docs) {
    const bytes = countedBytes(d);
    // Judged before the entry leaves the map: a recent entry may be ahead of its record on purpose.
    const correct = (entries.get(d._id)?.bytes ?? null) !== bytes && settledEntry(d._id);
    entries.delete(d._id);
    if (correct) await putStorageEntry(store, orgId, d._id, bytes);
    if (bytes === null || d._id === exceptCheckpoint) continue;
    usedBytes += bytes;
    checkpoints++;
  }
  // What is left has no record: an entry of a crash (or of a record about to be written, if recent).
  for (const [id, e] of entries) if (settled(e.at, now)) await putStorageEntry(store, orgId, id, null);
  return { usedBytes, checkpoints, snapshots };
}

/** The organisation's own storage quota setting in MB (settings.storageQuotaMB), or undefined. */
export async function orgStorageQuotaMB(store: Store, orgId: string): Promise<number | undefined> {
  const org = await store.orgs.findOne({ _id: orgId }, { projection: { settings: 1 } });
  return org?.settings?.storageQuotaMB;
}
