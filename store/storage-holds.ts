import type { Store } from './index';
import { isDuplicateKey } from './index';

/**
 * The storage an organisation's captures under way have reserved: one document per organisation
 * (`_id` the organisation's id), so that reserving is one atomic conditional update on it (MongoDB
 * and FerretDB alike: no transaction). `reservedBytes` is always the sum of `holds[*].bytes`: every
 * write changes both in the same update. A hold is keyed by the id of the checkpoint being
 * captured, and lapses at `expiresAt` unless its holder renews it (a capture whose API process
 * died leaves a hold that the next reservation of the organisation sweeps away).
 */
export interface StorageHoldsDoc {
  _id: string;
  reservedBytes: number;
  holds: Record<string, { bytes: number; expiresAt: Date }>;
}

const holdsOf = (s: Store) => s.db.collection<StorageHoldsDoc>('storage_holds');

/** Hold ids become field names: only the characters of a checkpoint id (no "." or "$"). */
function field(holdId: string): string {
  if (!/^[A-Za-z0-9_-]{1,100}$/.test(holdId)) throw new Error(`bad storage hold id ${JSON.stringify(holdId)}`);
  return `holds.${holdId}`;
}

/** The organisation's holds, or null when it never had one. */
export function findStorageHolds(store: Store, orgId: string): Promise<StorageHoldsDoc | null> {
  return holdsOf(store).findOne({ _id: orgId });
}

/**
 * Adds hold `holdId` of `bytes` lapsing at `expiresAt`, when the organisation's holds then add up to
 * at most `maxReservedBytes`: answers their sum with it, or null (nothing written) when it does not fit.
 */
export async function addStorageHold(
  store: Store,
  orgId: string,
  holdId: string,
  bytes: number,
  expiresAt: Date,
  maxReservedBytes: number,
): Promise<number | null> {
  const f = field(holdId);
  for (let attempt = 0; attempt < 2; attempt++) {
    const after = await holdsOf(store).findOneAndUpdate(
      { _id: orgId, reservedBytes: { $lte: maxReservedBytes - bytes }, [f]: { $exists: false } },
      { $inc: { reservedBytes: bytes }, $set: { [f]: { bytes, expiresAt } } },
      { returnDocument: 'after' },
    );
    if (after) return after.reservedBytes;
    if (attempt > 0 || (await findStorageHolds(store, orgId))) return null;
    // The organisation's first hold: its document is made (a concurrent first one makes it as well).
    await holdsOf(store)
      .insertOne({ _id: orgId, reservedBytes: 0, holds: {} })
      .catch((err: unknown) => {
        if (!isDuplicateKey(err)) throw err;
      });
  }
  return null;
}

/**
 * Grows hold `holdId` from `fromBytes` to `toBytes` when the organisation's holds then add up to at
 * most `maxReservedBytes`: answers their sum, or null (nothing written) when it does not fit or the
 * hold is gone.
 */
export async function growStorageHold(
  store: Store,
  orgId: string,
  holdId: string,
  fromBytes: number,
  toBytes: number,
  maxReservedBytes: number,
): Promise<number | null> {
  const f = field(holdId);
  const after = await holdsOf(store).findOneAndUpdate(
    { _id: orgId, [`${f}.bytes`]: fromBytes, reservedBytes: { $lte: maxReservedBytes - (toBytes - fromBytes) } },
    { $inc: { reservedBytes: toBytes - fromBytes }, $set: { [`${f}.bytes`]: toBytes } },
    { returnDocument: 'after' },
  );
  return after ? after.reservedBytes : null;
}

/** Moves hold `holdId`'s lapse to `expiresAt` (nothing when it is gone). */
export async function renewStorageHold(store: Store, orgId: string, holdId: string, expiresAt: Date): Promise<void> {
  const f = field(holdId);
  await holdsOf(store).updateOne({ _id: orgId, [f]: { $exists: true } }, { $set: { [`${f}.expiresAt`]: expiresAt } });
}

/**
 * Removes hold `holdId` of `bytes` (and its bytes from the sum), once: true when this call removed
 * it. With `lapsedBefore`, only when it lapsed before then (a renewal meanwhile keeps it).
 */
export async function dropStorageHold(store: Store, orgId: string, holdId: string, bytes: number, lapsedBefore?: Date): Promise<boolean> {
  const f = field(holdId);
  const r = await holdsOf(store).updateOne(
    { _id: orgId, [`${f}.bytes`]: bytes, ...(lapsedBefore ? { [`${f}.expiresAt`]: { $lt: lapsedBefore } } : {}) },
    { $unset: { [f]: '' }, $inc: { reservedBytes: -bytes } },
  );
  return r.modifiedCount === 1;
}
