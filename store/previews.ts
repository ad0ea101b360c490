import type { Collection } from 'mongodb';
import type { Store } from './index';
import { BACKFILLED, backfillOnce, entryKey, groupRange, insertEntries, memberOf, settled } from './entry-keys';

/**
 * A preview URL: one sandbox port served at a hostname. `_id` is the hostname without any port,
 * lowercase, so the proxy's lookup for each Host header is an `_id` lookup.
 */
export interface PreviewDoc {
  _id: string;
  /** `pv-<id>` */
  id: string;
  orgId: string;
  sandboxId: string;
  hostId: string;
  port: number;
  /** The custom domain it was created on, or null for PREVIEW_DOMAIN. */
  domain: string | null;
  /** The hostname as shown to callers (PREVIEW_DOMAIN may carry a `:port`). */
  hostname: string;
  /** Bearer authentication, with the token's sha256 (the token itself is never stored). */
  auth: { type: 'bearer'; tokenHash: string } | null;
  createdAt: Date;
}

const previewsOf = (store: Store): Collection<PreviewDoc> => store.db.collection<PreviewDoc>('previews');

/**
 * Sandbox-preview entries: one small document per preview, keyed by the sandbox and the preview's
 * hostname (./entry-keys), so a sandbox's previews are one `_id` range read (a filter on `sandboxId`
 * scanned every sandbox's previews, at every sandbox's delete). An entry is written before its preview and removed after it: an entry without a preview
 * (an API killed in between, or a create refused for a hostname another sandbox has) is skipped when
 * read, and removed then once it is a minute old.
 */
const entriesOf = (store: Store) => store.db.collection<{ _id: string; at: Date }>('sandbox_previews');

/** The previews of a sandbox, by port. */
export async function listSandboxPreviews(store: Store, sandboxId: string): Promise<PreviewDoc[]> {
  const entries = await entriesOf(store).find(groupRange(sandboxId)).sort({ _id: 1 }).limit(10_000).toArray();
  const docs: PreviewDoc[] = [];
  for (const e of entries) {
    const hostname = memberOf(e._id);
    const doc = await previewsOf(store).findOne({ _id: hostname });
    if (doc && doc.sandboxId === sandboxId) docs.push(doc);
    else if (settled(e.at)) await entriesOf(store).deleteOne({ _id: e._id });
  }
  return docs.sort((a, b) => a.port - b.port || a._id.localeCompare(b._id));
}

export { BACKFILLED };

/** Gives every preview recorded before sandbox-preview entries existed its entry, once per database. Answers how many. */
export async function backfillPreviewEntries(store: Store): Promise<number> {
  return backfillOnce(entriesOf(store), { _id: BACKFILLED, at: new Date() }, async () => {
    const docs = await previewsOf(store)
      .find({}, { projection: { _id: 1, sandboxId: 1 } })
      .toArray();
    for (const d of docs) await insertEntry(store, entryKey(d.sandboxId, d._id));
    return docs.length;
  });
}

async function insertEntry(store: Store, _id: string): Promise<void> {
  await insertEntries(entriesOf(store), [{ _id, at: new Date() }]);
}

/** The preview served at `hostname` (lowercase, no port), or null. */
export function findPreview(store: Store, hostname: string): Promise<PreviewDoc | null> {
  return previewsOf(store).findOne({ _id: hostname });
}

/** Records a preview, its sandbox-preview entry first (a duplicate hostname throws the store's duplicate-key error). */
export async function insertPreview(store: Store, doc: PreviewDoc): Promise<void> {
  await insertEntry(store, entryKey(doc.sandboxId, doc._id));
  await previewsOf(store).insertOne(doc);
}

/** Removes a preview, then its sandbox-preview entry. */
export async function deletePreview(store: Store, doc: Pick<PreviewDoc, '_id' | 'sandboxId'>): Promise<void> {
  await previewsOf(store).deleteOne({ _id: doc._id });
  await entriesOf(store).deleteOne({ _id: entryKey(doc.sandboxId, doc._id) });
}
