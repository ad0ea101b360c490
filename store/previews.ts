import type { Collection } from 'mongodb';
import type { Store } from './index';

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

/** The previews of a sandbox, by port (not a hot path: a scan on FerretDB). */
export async function listSandboxPreviews(store: Store, sandboxId: string): Promise<PreviewDoc[]> {
  const docs = await previewsOf(store).find({ sandboxId }).toArray();
  return docs.sort((a, b) => a.port - b.port || a._id.localeCompare(b._id));
}

/** The preview served at `hostname` (lowercase, no port), or null. */
export function findPreview(store: Store, hostname: string): Promise<PreviewDoc | null> {
  return previewsOf(store).findOne({ _id: hostname });
}

/** Records a preview (a duplicate hostname throws the store's duplicate-key error). */
export async function insertPreview(store: Store, doc: PreviewDoc): Promise<void> {
  await previewsOf(store).insertOne(doc);
}

/** Removes the preview served at `hostname`. */
export async function deletePreview(store: Store, hostname: string): Promise<void> {
  await previewsOf(store).deleteOne({ _id: hostname });
}
