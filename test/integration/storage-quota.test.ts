/**
 * The per-organisation storage quota of checkpoints and snapshots (ORG_STORAGE_QUOTA_MB, overridden
 * per organisation by settings.storageQuotaMB), as a caller who wants to fill the hosts' disks would
 * try: checkpoint after checkpoint, snapshots from images and from checkpoints. The test uses an
 * organisation of its own with a 1 MiB quota, so the other tests' organisations keep the default.
 */
import { api, unique, withMongo } from '../helpers/env';
import { hostSh, newSandbox } from '../helpers/sandboxes';
import { otherOrgKey } from '../helpers/checkpoints';

jest.setTimeout(240_000);

const MIB = 1024 * 1024;
let key = '';
let org = '';
const sandboxes: string[] = [];
const checkpoints: Array<[string, string]> = [];

beforeAll(async () => {
  org = unique('quota');
  key = await otherOrgKey(org);
  await withMongo((c) =>
    c
      .db()
      .collection('orgs')
      .updateOne({ _id: org as never }, { $set: { 'settings.storageQuotaMB': 1 } }),
  );
});

afterAll(async () => {
  for (const [sb, cp] of checkpoints) await api('DELETE', `/api/sandboxes/${sb}/checkpoints/${cp}`, { key }).catch(() => undefined);
  for (const sb of sandboxes) await api('DELETE', `/api/sandboxes/${sb}`, { key }).catch(() => undefined);
});

const usage = async (k = key) => {
  const r = await api('GET', '/api/usage', { key: k });
  expect(r.status).toBe(200);
  return r.body.storage as { usedBytes: number; quotaBytes: number | null; checkpoints: number; snapshots: number };
};

describe('storage quota', () => {
  it('keeps the capture that crosses the quota, then refuses every new checkpoint and snapshot with 507 until some are deleted', async () => {
    const sb = await newSandbox({}, { key });
    sandboxes.push(sb);
    expect(await usage()).toEqual({ usedBytes: 0, quotaBytes: MIB, checkpoints: 0, snapshots: 0 });
    await hostSh(sb, 'mkdir -p /workspace && head -c 3000000 /dev/urandom > /workspace/blob');

    const first = await api('POST', `/api/sandboxes/${sb}/checkpoints`, { key, body: {} });
    expect(first.status).toBe(201);
    checkpoints.push([sb, first.body.id]);
    expect(first.body.sizeBytes).toBeGreaterThanOrEqual(3_000_000);
    const after = await usage();
    expect(after).toEqual({ usedBytes: first.body.sizeBytes, quotaBytes: MIB, checkpoints: 1, snapshots: 0 });

    // Over the quota now: each way of writing more is refused, and leaves nothing behind.
    const attempts: Array<[string, () => Promise<{ status: number; body: any }>]> = [
      ['checkpoint', () => api('POST', `/api/sandboxes/${sb}/checkpoints`, { key, body: { name: 'second' } })],
      [
        'snapshot from an image',
        () =>
          api('POST', '/api/snapshots', {
            key,
            body: { name: unique('q-img'), image: { base: 'base', steps: [{ type: 'run', args: { commands: ['true'] } }] } },
          }),
      ],
      ['snapshot of a checkpoint', () => api('POST', '/api/snapshots', { key, body: { name: unique('q-cp'), checkpointId: first.body.id } })],
    ];
    const passed: string[] = [];
    for (const [what, call] of attempts) {
      const r = await call();
      if (r.status !== 507 || r.body?.error?.type !== 'insufficient_storage' || !/storage quota/.test(r.body.error.message))
        passed.push(`${what}: ${r.status} ${JSON.stringify(r.body)}`);
      if (r.status === 201 && what === 'checkpoint') checkpoints.push([sb, r.body.id]);
    }
    expect(passed).toEqual([]);
    expect(await usage()).toEqual(after);
    expect((await api('GET', '/api/snapshots', { key })).body).toEqual([]);

    // Deleting frees the room: the quota is about what is stored.
    expect((await api('DELETE', `/api/sandboxes/${sb}/checkpoints/${first.body.id}`, { key })).status).toBe(200);
    checkpoints.shift();
    expect(await usage()).toEqual({ usedBytes: 0, quotaBytes: MIB, checkpoints: 0, snapshots: 0 });
    await hostSh(sb, 'rm /workspace/blob');
    const again = await api('POST', `/api/sandboxes/${sb}/checkpoints`, { key, body: {} });
    expect(again.status).toBe(201);
    checkpoints.push([sb, again.body.id]);
  });

  it("shows each organisation its own use only; the default organisation's quota is the operator's default", async () => {
    const mine = await usage();
    expect(mine.checkpoints).toBe(1);
    const fresh = await otherOrgKey(unique('quota-other'));
    expect(await usage(fresh)).toEqual({ usedBytes: 0, quotaBytes: 10_240 * MIB, checkpoints: 0, snapshots: 0 });
    expect((await api('GET', '/api/usage', { key: null })).status).toBe(401);
  });
});
