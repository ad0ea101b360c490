import type { Store } from './index';
import { isDuplicateKey } from './index';
import { BACKFILLED, backfillOnce, entryKey, groupRange, insertEntries, memberOf } from './entry-keys';

/**
 * Storage entries: one small document per checkpoint that counts against its organisation's storage
 * quota, keyed by the organisation and the checkpoint (./entry-keys), holding the bytes it counts.
 * An organisation's use is then one `_id` range read, where a filter on `orgId` scans every
 * organisation's checkpoints and grows with all of them (28 ms at 186 checkpoints, on every message
 * of a conversation and every capture).
 *
 * An entry never counts less than its checkpoint: store/checkpoints.ts writes it before the record
 * when the bytes grow and after the record when they shrink. A crash between the two leaves an entry
 * counting more, never less; `exactUsage` (a scan of the records) decides and repairs near the quota.
 */
export interface StorageEntryDoc {
  _id: string;
  bytes: number;
  /** When it was last written: `exactUsage` corrects only entries older than a write in flight can be. */
  at: Date;
}

export const storageEntriesOf = (store: Store) => store.db.collection<StorageEntryDoc>('storage_entries');

/** The bytes a checkpoint record counts against its organisation's quota: none when failed, 0 until its size is known. */
export function countedBytes(c: { status?: string; sizeBytes?: number | null }): number | null {
  return c.status === 'failed' ? null : (c.sizeBytes ?? 0);
}

/** Sets the entry of a checkpoint (null: none). An insert first (one write); an update only when it exists. */
export async function putStorageEntry(store: Store, orgId: string, checkpointId: string, bytes: number | null, now = new Date()): Promise<void> {
  const _id = entryKey(orgId, checkpointId);
  if (bytes === null) {
    await storageEntriesOf(store).deleteOne({ _id });
    return;
  }
  try {
    await storageEntriesOf(store).insertOne({ _id, bytes, at: now });
  } catch (err) {
    if (!isDuplicateKey(err)) throw err;
    await storageEntriesOf(store).updateOne({ _id }, { $set: { bytes, at: now } });
  }
}

/** The organisation's entries: checkpoint id → bytes (at most 100,000). */
export async function readStorageEntries(store: Store, orgId: string): Promise<Map<string, StorageEntryDoc>> {
  const docs = await storageEntriesOf(store).find(groupRange(orgId)).sort({ _id: 1 }).limit(100_000).toArray();
  return new Map(docs.map((d) => [memberOf(d._id), d]));
}

export { BACKFILLED };

/**
 * Gives every checkpoint recorded before entries existed its entry, once per database (a marker
 * entry says it was done). Entries that exist are left as they are.
 */
export async function backfillStorageEntries(store: Store): Promise<number> {
  const now = new Date();
  return backfillOnce(storageEntriesOf(store), { _id: BACKFILLED, bytes: 0, at: now }, async () => {
    const docs = await store.db
      .collection<{ _id: string; orgId: string; status?: string; sizeBytes?: number | null }>('checkpoints')
      .find({}, { projection: { orgId: 1, status: 1, sizeBytes: 1 } })
      .toArray();
    const entries = docs.flatMap((d) => {
      const bytes = countedBytes(d);
      return bytes === null ? [] : [{ _id: entryKey(d.orgId, d._id), bytes, at: now }];
    });
    for (let i = 0; i < entries.length; i += 1000) await insertEntries(storageEntriesOf(store), entries.slice(i, i + 1000));
    return entries.length;
  });
}
