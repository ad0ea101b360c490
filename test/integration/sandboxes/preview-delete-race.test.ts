/**
 * A preview's create racing its sandbox's delete. The create runs here, in a PreviewService of its own
 * (a second API process, on the stack's store and host); the delete goes through the stack's API while
 * the create's port is opening, after the create marked the record and before it inserts its preview.
 * So the delete destroys the sandbox and looks for previews before the preview's record exists.
 */
import { HostClient } from '../../../sandbox/host-contract/client';
import { connectStore, type Store } from '../../../store';
import { findSandbox } from '../../../store/sandboxes';
import { PreviewService } from '../../../services/sandboxes/previews';
import type { SandboxDeps } from '../../../services/deps';
import { createLogger } from '../../../lib/logger';
import { ApiError } from '../../../contract/errors';
import { api, T } from '../../helpers/env';
import { newSandbox } from '../../helpers/sandboxes';

let store: Store;
let host: HostClient;

beforeAll(async () => {
  store = await connectStore(T.mongo(), { ensureIndexes: false });
  host = new HostClient({ url: T.hostUrl(), token: T.hostToken() });
});

afterAll(async () => {
  await store.close();
});

/** A PreviewService whose host runs `meanwhile` once the port is open, before the create goes on. */
function previewsWith(meanwhile: (sandboxId: string) => Promise<void>): PreviewService {
  const racing = Object.create(host) as HostClient;
  racing.portForward = async (id: string, port: number) => {
    const opened = await host.portForward(id, port);
    await meanwhile(id);
    return opened;
  };
  const deps = {
    store,
    hosts: { get: async () => racing },
    cfg: { PREVIEW_DOMAIN: 'preview.localhost', PREVIEW_TRANSPORT: 'auto' },
    logger: createLogger('preview-race', 'silent'),
  } as unknown as SandboxDeps;
  return new PreviewService(deps);
}

const previewsOf = (sandboxId: string) => store.db.collection('previews').find({ sandboxId }).toArray();
/** The sandbox's preview entries (store/previews.ts: `_id` starts with the sandbox's id). */
const entriesOf = async (sandboxId: string) =>
  (await store.db.collection<{ _id: string }>('sandbox_previews').find({}).toArray()).filter((e) => e._id.startsWith(sandboxId));

describe("a preview's create racing its sandbox's delete", () => {
  it('leaves no preview of the deleted sandbox, and answers 409', async () => {
    const sb = await newSandbox();
    const previews = previewsWith(async (id) => {
      expect((await api('DELETE', `/api/sandboxes/${id}`)).status).toBe(200);
    });
    const doc = (await findSandbox(store, sb))!;
    const err = await previews.create(doc, { port: 8000 }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ApiError);
    expect((err as ApiError).status).toBe(409);
    expect((err as ApiError).message).toBe(`sandbox ${sb} is stopped`);
    expect(await previewsOf(sb)).toEqual([]);
    expect(await entriesOf(sb)).toEqual([]);
    expect((await findSandbox(store, sb))?.status).toBe('stopped');
  });

  it('keeps the preview when nothing races it', async () => {
    const sb = await newSandbox();
    try {
      const previews = previewsWith(async () => undefined);
      const made = await previews.create((await findSandbox(store, sb))!, { port: 8000 });
      expect(await previewsOf(sb)).toEqual([expect.objectContaining({ _id: made.doc._id, sandboxId: sb, port: 8000 })]);
    } finally {
      expect((await api('DELETE', `/api/sandboxes/${sb}`)).status).toBe(200);
    }
    // The stack's delete removes it as before.
    expect(await previewsOf(sb)).toEqual([]);
  });
});
