import { MongoBulkWriteError } from 'mongodb';
import type { Store } from './index';
import { isDuplicateKey } from './index';
import { decodeCursor } from './page';

/**
 * Listing keys: one small document per listed item in the `listings` collection, its `_id` the
 * list's name, the item's creation time (milliseconds, 13 digits) and the item's id, joined by
 * SEP. A page of a list, newest first by (created_at, _id), is then one `_id` range read in
 * descending `_id` order with a limit, which our FerretDB patch (tools/ferretdb/patches/
 * sqlite-id-range.patch) answers from an index: its cost does not grow with the list's length.
 * Without that patch (MongoDB, FerretDB on PostgreSQL) the same query is still right.
 * A key is written after its item and deleted with it; a key whose item is gone is skipped.
 */
export interface ListingDoc {
  _id: string;
}

/** Joins the parts of a key; ids never contain it (they are generated or validated slugs). */
const SEP = '\u0001';
/** Just after SEP: `list + END` is past every key of `list`. */
const END = '\u0002';

export const listingsOf = (store: Store) => store.db.collection<ListingDoc>('listings');

/** The name of a list, e.g. listName('sessions', orgId, agentId). */
export function listName(...parts: string[]): string {
  return parts.join(SEP);
}

function keyOf(list: string, createdAt: Date, id: string): string {
  return [list, String(createdAt.getTime()).padStart(13, '0'), id].join(SEP);
}

/** The item a listing key stands for: its id and creation time. */
export interface Listed {
  id: string;
  created_at: Date;
}

function listedOf(key: string): Listed {
  const [t, id] = key.split(SEP).slice(-2);
  return { id: id ?? '', created_at: new Date(Number(t)) };
}

/** Adds items to a list; keys that exist already are left as they are. */
export async function addToList(store: Store, list: string, items: { _id: string; created_at: Date }[]): Promise<void> {
  if (items.length === 0) return;
  const docs = items.map((i) => ({ _id: keyOf(list, i.created_at, i._id) }));
  try {
    if (docs.length === 1) await listingsOf(store).insertOne(docs[0]!);
    else await listingsOf(store).insertMany(docs, { ordered: false });
  } catch (err) {
    if (isDuplicateKey(err)) return;
    const dupOnly = err instanceof MongoBulkWriteError && [err.writeErrors].flat().every((e) => e.code === 11000);
    if (!dupOnly) throw err;
  }
}

/** Removes an item's key from a list. */
export async function removeFromList(store: Store, list: string, item: { _id: string; created_at: Date }): Promise<void> {
  await listingsOf(store).deleteOne({ _id: keyOf(list, item.created_at, item._id) });
}

/**
 * Up to `size` items of a list after `cursor` (a cursor of store/page.ts), newest first by
 * (created_at, _id).
 */
export async function listedAfter(store: Store, list: string, cursor: string | undefined, size: number): Promise<Listed[]> {
  let upper = list + END;
  if (cursor) {
    const pos = decodeCursor(cursor);
    upper = keyOf(list, new Date(pos.t), pos.id);
  }
  const docs = await listingsOf(store)
    .find({ _id: { $gt: list + SEP, $lt: upper } })
    .sort({ _id: -1 })
    .limit(size)
    .toArray();
  return docs.map((d) => listedOf(d._id));
}
