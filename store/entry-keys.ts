import type { Collection, Document, OptionalUnlessRequiredId } from 'mongodb';
import { MongoBulkWriteError } from 'mongodb';
import { isDuplicateKey } from './index';

/**
 * Entry collections: small documents whose `_id` is a group's key (an organisation, a sandbox, a
 * list) and a member's joined by SEP, so that a group's members are one `_id` range read. FerretDB
 * answers only `_id` filters, and `_id` ranges with our patch (tools/ferretdb/patches/
 * sqlite-id-range.patch), from an index: a filter on any other field reads the whole collection and
 * slows as the store grows. MongoDB, and FerretDB on PostgreSQL, answer the same queries the same way.
 *
 * Used by the listing keys (./listing), storage entries (./storage-entries), open-exec entries
 * (./exec) and sandbox-preview entries (./previews). Each writes its entries on the side that never
 * undercounts (before its record when it adds, after it when it removes) and reads past the strays a
 * crash between the two writes leaves, removing them once settled (ENTRY_SETTLE_MS).
 */

/** Joins a group's key and a member's; ids never contain it (generated or validated slugs). */
export const SEP = '\u0001';
/** Just after SEP: `group + END` is past every entry of `group`. */
export const END = '\u0002';

/** The `_id` of `member`'s entry in `group`. */
export const entryKey = (group: string, member: string): string => group + SEP + member;

/** The member an entry's `_id` names (what follows the first SEP). */
export const memberOf = (key: string): string => key.slice(key.indexOf(SEP) + 1);

/** The filter of every entry of `group`: one `_id` range. */
export const groupRange = (group: string): { _id: { $gt: string; $lt: string } } => ({ _id: { $gt: group + SEP, $lt: group + END } });

/**
 * An entry written this recently may be ahead of its record on purpose (a write in flight): one older
 * than this whose record disagrees is a stray, and is corrected or removed.
 */
export const ENTRY_SETTLE_MS = 60_000;

/** True when an entry written at `at` is older than any write in flight can explain. */
export const settled = (at: Date, now = Date.now()): boolean => now - at.getTime() > ENTRY_SETTLE_MS;

/** True for an error that says only that some documents existed already (one insert, or an unordered insertMany). */
export function onlyDuplicates(err: unknown): boolean {
  // A bulk error carries its first write error's code: each write error is looked at, not that one.
  if (err instanceof MongoBulkWriteError) return [err.writeErrors].flat().every((e) => e.code === 11000);
  return isDuplicateKey(err);
}

/** Inserts entries; those that exist already are left as they are. Answers false when none was new (a single entry). */
export async function insertEntries<T extends Document>(coll: Collection<T>, docs: OptionalUnlessRequiredId<T>[]): Promise<boolean> {
  if (docs.length === 0) return false;
  try {
    if (docs.length === 1) await coll.insertOne(docs[0]!);
    else await coll.insertMany(docs, { ordered: false });
    return true;
  } catch (err) {
    if (!onlyDuplicates(err)) throw err;
    return false;
  }
}

/**
 * The `_id` of the marker of a database whose records from before an entry collection existed have
 * their entries (no NUL in it: FerretDB's PostgreSQL backend refuses \u0000).
 */
export const BACKFILLED = 'migrated:backfilled-v1';

/**
 * Runs `fill` once per database: skipped when `coll` holds the marker, which is written after `fill`
 * (an API stopped half-way fills again at its next start: `fill` must leave existing entries as they
 * are). `marker` is the marker's document. Answers what `fill` answers (0 when skipped).
 */
export async function backfillOnce<T extends Document & { _id: string }>(
  coll: Collection<T>,
  marker: OptionalUnlessRequiredId<T>,
  fill: () => Promise<number>,
): Promise<number> {
  if (await coll.findOne({ _id: marker._id } as Parameters<Collection<T>['findOne']>[0])) return 0;
  const n = await fill();
  await insertEntries(coll, [marker]);
  return n;
}
