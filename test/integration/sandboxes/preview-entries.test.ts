/**
 * Sandbox-preview entries (store/previews.ts) against the real store: a sandbox's previews are read by
 * their entries (one `_id` range), a delete removes both, an entry without its preview is skipped and,
 * once a minute old, removed; previews recorded before entries existed get theirs once.
 */
import { T, unique } from '../../helpers/env';
import { connectStore, type Store } from '../../../store';
import { BACKFILLED, backfillPreviewEntries, deletePreview, insertPreview, listSandboxPreviews, type PreviewDoc } from '../../../store/previews';

describe('sandbox-preview entries', () => {
  let store: Store;
  const sandboxId = `sb-${unique('pe').replace(/[^a-z0-9]/g, '')}`;
  const entries = () => store.db.collection<{ _id: string; at: Date }>('sandbox_previews');
  const previews = () => store.db.collection<PreviewDoc>('previews');
  const preview = (port: number): PreviewDoc => {
    const hostname = `${port}-${sandboxId}.preview.test`;
    return { _id: hostname, id: `pv-${port}`, orgId: 'org-pe', sandboxId, hostId: 'h', port, domain: null, hostname, auth: null, createdAt: new Date() };
  };
  const mine = () =>
    entries()
      .find({ _id: { $gt: `${sandboxId}\u0001`, $lt: `${sandboxId}\u0002` } })
      .toArray();

  beforeAll(async () => {
    store = await connectStore(T.mongo(), { ensureIndexes: false });
  });
  afterAll(async () => {
    if (!store) return;
    await previews().deleteMany({ sandboxId });
    await entries().deleteMany({ _id: { $gt: `${sandboxId}\u0001`, $lt: `${sandboxId}\u0002` } });
    await store.close();
  });

  it('lists a sandbox’s previews by their entries; a delete removes both; a stray entry is skipped, and removed once old', async () => {
    await insertPreview(store, preview(8001));
    await insertPreview(store, preview(3000));
    expect((await listSandboxPreviews(store, sandboxId)).map((p) => p.port)).toEqual([3000, 8001]);
    await deletePreview(store, preview(8001));
    expect((await listSandboxPreviews(store, sandboxId)).map((p) => p.port)).toEqual([3000]);
    expect((await mine()).map((e) => e._id)).toEqual([`${sandboxId}\u0001${preview(3000)._id}`]);
    // Strays: one a minute old (removed when read), one just written (a create in flight: kept).
    await entries().insertMany([
      { _id: `${sandboxId}\u0001old.preview.test`, at: new Date(Date.now() - 3_600_000) },
      { _id: `${sandboxId}\u0001new.preview.test`, at: new Date() },
    ]);
    expect((await listSandboxPreviews(store, sandboxId)).map((p) => p.port)).toEqual([3000]);
    expect((await mine()).map((e) => e._id).sort()).toEqual([`${sandboxId}\u0001${preview(3000)._id}`, `${sandboxId}\u0001new.preview.test`].sort());
  });

  it('gives previews recorded before entries existed theirs, once per database', async () => {
    await previews().insertOne(preview(9000));
    await entries().deleteOne({ _id: BACKFILLED });
    expect(await backfillPreviewEntries(store)).toBeGreaterThanOrEqual(1);
    expect((await listSandboxPreviews(store, sandboxId)).map((p) => p.port)).toEqual([3000, 9000]);
    expect(await backfillPreviewEntries(store)).toBe(0);
  });
});
