import type { Store } from './index';
import { backfillOnce, END, insertEntries, SEP } from './entry-keys';
import { decodeCursor, encodeCursor } from './page';

/**
 * Listing keys: one small document per listed item in the `listings` collection, its `_id` the
 * list's name, the item's creation time (milliseconds, 13 digits) and the item's id, joined by
 * SEP (an entry collection: ./entry-keys). A page of a list, newest first by (created_at, _id), is
 * then one `_id` range read in descending `_id` order with a limit, answered from an index: its cost
 * does not grow with the list's length.
 * A key is written after its item and deleted with it; a key whose item is gone is skipped.
 */
export interface ListingDoc {
  _id: string;
}

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
  await insertEntries(
    listingsOf(store),
    items.map((i) => ({ _id: keyOf(list, i.created_at, i._id) })),
  );
}

/** Adds the keys of many items, each to its own list (one insert); keys already there are left as they are. */
export async function addToLists(store: Store, entries: { list: string; item: { _id: string; created_at: Date } }[]): Promise<void> {
  await insertEntries(
    listingsOf(store),
    entries.map((e) => ({ _id: keyOf(e.list, e.item.created_at, e.item._id) })),
  );
}

/** Removes an item's key from a list. */
export async function removeFromList(store: Store, list: string, item: { _id: string; created_at: Date }): Promise<void> {
  await listingsOf(store).deleteOne({ _id: keyOf(list, item.created_at, item._id) });
}

/** Removes the keys of many items, each from its own list (one delete). */
export async function removeListed(store: Store, entries: { list: string; item: Listed }[]): Promise<void> {
  if (entries.length === 0) return;
  await listingsOf(store).deleteMany({ _id: { $in: entries.map((e) => keyOf(e.list, e.item.created_at, e.item.id)) } });
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

/** Keys read per step when a filter leaves items out. */
const FILTER_CHUNK = 100;

/**
 * One page of a list, newest first by (created_at, id): up to `limit` items after `cursor` that
 * `load` finds (by the id in their key) and `keep` admits, and the cursor after the last one (null
 * at the end). A filtered page reads at most `scanMax` keys: it may then be short, with a cursor
 * to go on. A key whose item is gone, or was stored with another creation time, is left out and
 * removed (an item is stored before its key, so such a key is stale).
 */
export async function pageListed<T extends { created_at: Date }>(
  store: Store,
  list: string,
  cursor: string | undefined,
  limit: number,
  load: (id: string) => Promise<T | null>,
  keep?: (doc: T) => boolean,
  scanMax = 2000,
): Promise<{ page: T[]; next_cursor: string | null }> {
  const page: T[] = [];
  const stale: Listed[] = [];
  const size = keep ? FILTER_CHUNK : limit + 1;
  let after = cursor;
  let more = true;
  let scanned = 0;
  while (page.length < limit && more && scanned < scanMax) {
    const listed = await listedAfter(store, list, after, size);
    scanned += listed.length;
    more = listed.length === size;
    const docs = await Promise.all(listed.map((l) => load(l.id)));
    for (const [i, l] of listed.entries()) {
      const doc = docs[i];
      after = encodeCursor({ t: l.created_at.toISOString(), id: l.id });
      if (!doc || doc.created_at.getTime() !== l.created_at.getTime()) {
        stale.push(l);
        continue;
      }
      if (keep && !keep(doc)) continue;
      page.push(doc);
      if (page.length === limit) {
        more = more || i < listed.length - 1;
        break;
      }
    }
  }
  await removeListed(
    store,
    stale.map((item) => ({ list, item })),
  );
  return { page, next_cursor: more ? (after ?? null) : null };
}

/**
 * Lists the items of a collection stored before that collection was listed by key, once per
 * database (`marker` in `listings` says it is done). `listOf` names each item's list. Returns how
 * many items it read.
 */
export async function listUnlisted<T extends { created_at: Date }>(
  store: Store,
  marker: string,
  items: AsyncIterable<T>,
  listOf: (item: T) => { list: string; id: string },
): Promise<number> {
  return backfillOnce(listingsOf(store), { _id: marker }, async () => {
    let n = 0;
    let byList = new Map<string, { _id: string; created_at: Date }[]>();
    const flush = async () => {
      for (const [list, keyed] of byList) await addToList(store, list, keyed);
      byList = new Map();
    };
    for await (const item of items) {
      const { list, id } = listOf(item);
      byList.set(list, [...(byList.get(list) ?? []), { _id: id, created_at: item.created_at }]);
      if (++n % 1000 === 0) await flush();
    }
    await flush();
    return n;
  });
}
