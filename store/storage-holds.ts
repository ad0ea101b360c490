import type { Store } from './index';

/**
 * Room reserved by one capture under way (services/checkpoints/storage-quota.ts): a document of its own, written
 * only by its capture (inserted, renewed, admitted, deleted) and deleted by others only once it has
 * lapsed. FerretDB (SQLite, PostgreSQL) runs an update as a read and a write of the whole document,
 * not atomically, so concurrent updates of one shared document (a counter) lose some; an insert, a
 * read and a delete of a document are each atomic on MongoDB and FerretDB alike, and that is all this
 * uses. `_id` is `<orgId>/<order>/<holdId>`: an organisation's holds are read by an `_id` range,
 * in the order they were taken.
 */
export interface StorageHoldDoc {
  _id: string;
  orgId: string;
  holdId: string;
  bytes: number;
  /** `pending` while its capture decides whether it fits; `admitted` once it does. */
  state: 'pending' | 'admitted';
  /** A pending hold not admitted by then is given up (its capture refuses itself; the others stop waiting for it). */
  decideBy: Date;
  /** It lapses then unless its capture renews it (a capture whose API process died). */
  expiresAt: Date;
}

const holdsOf = (s: Store) => s.db.collection<StorageHoldDoc>('storage_holds');

/** The organisation's holds (lapsed ones included), in the order they were taken. */
export async function listStorageHolds(store: Store, orgId: string): Promise<StorageHoldDoc[]> {
  const docs = await holdsOf(store)
    .find({ _id: { $gte: `${orgId}/`, $lt: `${orgId}0` } })
    .toArray();
  // An organisation id with a "/" would share the range with another's: its field decides.
  return docs.filter((d) => d.orgId === orgId).sort((a, b) => (a._id < b._id ? -1 : a._id > b._id ? 1 : 0));
}

/** Records a hold. */
export async function insertStorageHold(store: Store, doc: StorageHoldDoc): Promise<void> {
  await holdsOf(store).insertOne(doc);
}

/** Sets fields of a hold (its own capture only). */
export async function updateStorageHold(store: Store, id: string, set: Partial<Pick<StorageHoldDoc, 'state' | 'expiresAt'>>): Promise<void> {
  await holdsOf(store).updateOne({ _id: id }, { $set: set });
}

/** Removes a hold. */
export async function deleteStorageHold(store: Store, id: string): Promise<void> {
  await holdsOf(store).deleteOne({ _id: id });
}
