/**
 * The per-organisation storage quota of checkpoints and snapshots (ORG_STORAGE_QUOTA_MB, overridden
 * per organisation by settings.storageQuotaMB), as a caller who wants to fill the hosts' disks would
 * try: one capture larger than the room left, many captures at once, image builds, a file that is
 * larger than the disk says (sparse). What a capture will add is reserved before it copies anything,
 * so the quota is never passed. Each test uses an organisation of its own with a quota of a few MiB
 * (the sandboxes write a few MB); the other tests' organisations keep the default.
 */
import fs from 'node:fs';
import path from 'node:path';
import { api, eventually, T, unique, withMongo, type Res } from '../../helpers/env';
import { hostSh, newSandbox } from '../../helpers/sandboxes';
import { otherOrgKey } from '../../helpers/checkpoints';
import { connectStore } from '../../../store';
import { checkpointsOf, deleteCheckpointRecords } from '../../../store/checkpoints';
import { BACKFILLED, backfillStorageEntries, readStorageEntries, storageEntriesOf } from '../../../store/storage-entries';

jest.setTimeout(300_000);

const MIB = 1024 * 1024;

interface Org {
  id: string;
  key: string;
  sandboxes: string[];
  checkpoints: Array<[string, string]>;
  snapshots: string[];
}
const orgs: Org[] = [];

/** A fresh organisation whose quota is `mb` MiB. */
async function orgWithQuota(mb: number): Promise<Org> {
  const id = unique('quota');
  const key = await otherOrgKey(id);
  await setQuota(id, mb);
  const org: Org = { id, key, sandboxes: [], checkpoints: [], snapshots: [] };
  orgs.push(org);
  return org;
}

const setQuota = (orgId: string, mb: number) =>
  withMongo((c) =>
    c
      .db()
      .collection('orgs')
      .updateOne({ _id: orgId as never }, { $set: { 'settings.storageQuotaMB': mb } }),
  );

afterAll(async () => {
  for (const o of orgs) {
    // Every snapshot of the organisation: the image cache's own (image-…) too.
    const listed = await api('GET', '/api/snapshots', { key: o.key }).catch(() => null);
    const names = new Set([...o.snapshots, ...(Array.isArray(listed?.body) ? listed.body.map((s: { name: string }) => s.name) : [])]);
    for (const s of names) await api('DELETE', `/api/snapshots/${s}`, { key: o.key }).catch(() => undefined);
    for (const [sb, cp] of o.checkpoints) await api('DELETE', `/api/sandboxes/${sb}/checkpoints/${cp}`, { key: o.key }).catch(() => undefined);
    for (const sb of o.sandboxes) await api('DELETE', `/api/sandboxes/${sb}`, { key: o.key }).catch(() => undefined);
  }
  await withMongo((c) =>
    c
      .db()
      .collection('storage_holds')
      .deleteMany({ orgId: { $in: orgs.map((o) => o.id) } }),
  );
});

type Usage = { usedBytes: number; reservedBytes: number; quotaBytes: number | null; checkpoints: number; snapshots: number };
const usage = async (o: Pick<Org, 'key'>): Promise<Usage> => {
  const r = await api('GET', '/api/usage', { key: o.key });
  expect(r.status).toBe(200);
  return r.body.storage as Usage;
};

/** The organisation's checkpoint records, failed ones included. */
const records = (o: Org) =>
  withMongo((c) =>
    c
      .db()
      .collection<{ _id: string; status?: string; sizeBytes?: number | null }>('checkpoints')
      .find({ orgId: o.id })
      .project<{ _id: string; status?: string }>({ _id: 1, status: 1 })
      .toArray(),
  );

/** The layers (and copies under way) on the test host's disk. */
const layersOnDisk = (): string[] => {
  try {
    return fs.readdirSync(path.join(T.dataDir(), 'layers')).filter((n) => n.startsWith('cp-'));
  } catch {
    return [];
  }
};

async function sandboxWith(o: Org, script: string): Promise<string> {
  const sb = await newSandbox({}, { key: o.key, created: o.sandboxes });
  await hostSh(sb, `mkdir -p /workspace && ${script}`);
  return sb;
}

async function capture(o: Org, sb: string): Promise<Res> {
  const r = await api('POST', `/api/sandboxes/${sb}/checkpoints`, { key: o.key, body: {} });
  if (r.status === 201) o.checkpoints.push([sb, r.body.id]);
  return r;
}

/** The status, error type and whether the message speaks of the quota: what a refusal answers. */
const answer = (r: Pick<Res, 'status' | 'body'>) => ({
  status: r.status,
  type: r.body?.error?.type,
  quota: /storage quota/.test(String(r.body?.error?.message)),
});
const REFUSED = { status: 507, type: 'insufficient_storage', quota: true };

const image = (script: string) => ({ base: 'base', steps: [{ type: 'run', args: { commands: [script] } }] });

describe('storage quota', () => {
  it('refuses a checkpoint that would pass the quota before copying anything (no record, no layer); a full organisation gets 507 for every new one', async () => {
    const o = await orgWithQuota(8);
    const sb = await sandboxWith(o, 'head -c 6000000 /dev/urandom > /workspace/blob');
    expect(await usage(o)).toEqual({ usedBytes: 0, reservedBytes: 0, quotaBytes: 8 * MIB, checkpoints: 0, snapshots: 0 });

    const first = await capture(o, sb);
    expect(first.status).toBe(201);
    expect(first.body.sizeBytes).toBeGreaterThanOrEqual(6_000_000);
    const after = await usage(o);
    expect(after).toEqual({ usedBytes: first.body.sizeBytes, reservedBytes: 0, quotaBytes: 8 * MIB, checkpoints: 1, snapshots: 0 });

    // 6 MB stored, 6 MB more in the sandbox's layer, 8 MiB of quota: the second copy would pass it.
    const layers = layersOnDisk();
    const second = await capture(o, sb);
    expect(answer(second)).toEqual(REFUSED);
    expect(second.body.error.message).toMatch(/this capture would add \d+\.\d MiB/);
    expect(await records(o)).toEqual([{ _id: first.body.id, status: 'ready' }]);
    expect(layersOnDisk().filter((n) => !layers.includes(n))).toEqual([]);
    expect(await usage(o)).toEqual(after);

    // A quota lowered below what is stored: every way of storing more is refused, and leaves nothing.
    await setQuota(o.id, 4);
    const attempts: Array<[string, () => Promise<Res>]> = [
      ['checkpoint', () => capture(o, sb)],
      ['snapshot from an image', () => api('POST', '/api/snapshots', { key: o.key, body: { name: unique('q-img'), image: image('true') } })],
      ['snapshot of a checkpoint', () => api('POST', '/api/snapshots', { key: o.key, body: { name: unique('q-cp'), checkpointId: first.body.id } })],
    ];
    const passed: string[] = [];
    for (const [what, call] of attempts) {
      const r = await call();
      if (r.status === 201 || r.status === 202) o.snapshots.push(r.body.name);
      if (JSON.stringify(answer(r)) !== JSON.stringify(REFUSED)) passed.push(`${what}: ${r.status} ${JSON.stringify(r.body)}`);
    }
    expect(passed).toEqual([]);
    expect(await usage(o)).toEqual({ ...after, quotaBytes: 4 * MIB });
    expect((await api('GET', '/api/snapshots', { key: o.key })).body).toEqual([]);

    // Deleting frees the room: the quota is about what is stored.
    await setQuota(o.id, 8);
    expect((await api('DELETE', `/api/sandboxes/${sb}/checkpoints/${first.body.id}`, { key: o.key })).status).toBe(200);
    o.checkpoints.shift();
    expect(await usage(o)).toEqual({ usedBytes: 0, reservedBytes: 0, quotaBytes: 8 * MIB, checkpoints: 0, snapshots: 0 });
    expect((await capture(o, sb)).status).toBe(201);
  });

  it('use is read from the storage entries; an entry a crash left (no record) never refuses: at the quota the records decide, and the entry is removed', async () => {
    const o = await orgWithQuota(8);
    const sb = await sandboxWith(o, 'head -c 3000000 /dev/urandom > /workspace/blob');
    const first = await capture(o, sb);
    expect(first.status).toBe(201);
    const entries = () =>
      withMongo((c) =>
        c
          .db()
          .collection<{ _id: string; bytes: number }>('storage_entries')
          .find({ _id: { $gt: `${o.id}\u0001`, $lt: `${o.id}\u0002` } })
          .toArray(),
      );
    // One entry per checkpoint, counting its size.
    expect(await entries()).toEqual([expect.objectContaining({ _id: `${o.id}\u0001${first.body.id}`, bytes: first.body.sizeBytes })]);
    // What an API killed between an entry and its record leaves: an entry of 7 MiB with no record, written long ago.
    const stray = `${o.id}\u0001cp-${unique('stray').replace(/[^a-z0-9]/g, '')}`;
    await withMongo((c) =>
      c
        .db()
        .collection('storage_entries')
        .insertOne({ _id: stray as never, bytes: 7 * MIB, at: new Date(Date.now() - 3_600_000) }),
    );
    // The entries alone would refuse (3 + 7 MiB of 8); the records say 3 MiB are stored: admitted.
    const second = await capture(o, sb);
    expect(second.status).toBe(201);
    expect((await entries()).map((e) => e._id).sort()).toEqual([`${o.id}\u0001${first.body.id}`, `${o.id}\u0001${second.body.id}`].sort());
    expect(await usage(o)).toMatchObject({ usedBytes: first.body.sizeBytes + second.body.sizeBytes, checkpoints: 2 });
    // An entry ahead of its record (a size written first, its record's write in flight) is left as it is by a
    // reading of the records; once a minute old it is corrected to its record.
    const firstId = `${o.id}\u0001${first.body.id}`;
    const setEntry = (at: Date) =>
      withMongo((c) =>
        c
          .db()
          .collection('storage_entries')
          .updateOne({ _id: firstId as never }, { $set: { bytes: 7 * MIB, at } }),
      );
    await setEntry(new Date());
    expect(await usage(o)).toMatchObject({ usedBytes: first.body.sizeBytes + second.body.sizeBytes });
    expect((await entries()).find((e) => e._id === firstId)?.bytes).toBe(7 * MIB);
    await setEntry(new Date(Date.now() - 3_600_000));
    await usage(o);
    expect((await entries()).find((e) => e._id === firstId)?.bytes).toBe(first.body.sizeBytes);
    // Deleting a checkpoint removes its entry.
    expect((await api('DELETE', `/api/sandboxes/${sb}/checkpoints/${first.body.id}`, { key: o.key })).status).toBe(200);
    o.checkpoints.shift();
    expect((await entries()).map((e) => e._id)).toEqual([`${o.id}\u0001${second.body.id}`]);
  });

  it('gives checkpoints recorded before storage entries existed theirs (once per database, at the API start)', async () => {
    const o = await orgWithQuota(8);
    const legacy = `cp-${unique('legacy').replace(/[^a-z0-9]/g, '')}`;
    const store = await connectStore(T.mongo(), { ensureIndexes: false });
    try {
      await checkpointsOf(store).insertOne({
        _id: legacy,
        orgId: o.id,
        sandboxId: 'sb-legacy',
        hostId: 'h',
        name: legacy,
        layerId: legacy,
        parents: [],
        patchSeq: 0,
        sizeBytes: 5 * MIB,
        createdAt: new Date(),
      });
      await storageEntriesOf(store).deleteOne({ _id: BACKFILLED });
      expect(await backfillStorageEntries(store)).toBeGreaterThanOrEqual(1);
      expect((await readStorageEntries(store, o.id)).get(legacy)).toMatchObject({ bytes: 5 * MIB });
      expect(await backfillStorageEntries(store)).toBe(0);
      // Counted: 5 of 8 MiB are used, so a capture of 6 MB is refused.
      const sb = await sandboxWith(o, 'head -c 6000000 /dev/urandom > /workspace/blob');
      expect(answer(await capture(o, sb))).toEqual(REFUSED);
    } finally {
      await deleteCheckpointRecords(store, legacy);
      await store.close();
    }
  });

  it('never lets captures at the same time pass the quota together', async () => {
    const o = await orgWithQuota(16);
    // Four sandboxes of 6 MB each, 16 MiB of quota: two fit, not three.
    const sbs: string[] = [];
    for (let i = 0; i < 4; i++) sbs.push(await newSandbox({}, { key: o.key, created: o.sandboxes }));
    await Promise.all(sbs.map((sb) => hostSh(sb, 'mkdir -p /workspace && head -c 6000000 /dev/urandom > /workspace/blob')));
    const layers = layersOnDisk();

    const results = await Promise.all(sbs.map((sb) => capture(o, sb)));
    const taken = results.filter((r) => r.status === 201);
    const others = results.filter((r) => r.status !== 201).map(answer);
    expect(others).toEqual(others.map(() => REFUSED));
    expect(taken.length).toBeGreaterThanOrEqual(1);
    const stored = taken.reduce((n, r) => n + (r.body.sizeBytes as number), 0);
    expect(stored).toBeLessThanOrEqual(16 * MIB);
    const now = await usage(o);
    expect(now).toEqual({ usedBytes: stored, reservedBytes: 0, quotaBytes: 16 * MIB, checkpoints: taken.length, snapshots: 0 });
    // The refused captures left no layer behind.
    expect(
      layersOnDisk()
        .filter((n) => !layers.includes(n))
        .sort(),
    ).toEqual(taken.map((r) => r.body.id).sort());
  });

  it('refuses a copy that turns out larger than its reservation (a sparse file), deletes it and gives the reservation back: the next capture that fits is taken', async () => {
    const o = await orgWithQuota(8);
    // 20 MB of apparent size and almost no blocks: the disk reports little, the copy measures 20 MB.
    const sb = await sandboxWith(o, 'truncate -s 20M /workspace/sparse');
    const layers = layersOnDisk();
    const r = await capture(o, sb);
    expect(answer(r)).toEqual(REFUSED);
    expect(await records(o)).toEqual([{ _id: expect.any(String), status: 'failed' }]);
    expect(layersOnDisk().filter((n) => !layers.includes(n))).toEqual([]);
    expect(await usage(o)).toEqual({ usedBytes: 0, reservedBytes: 0, quotaBytes: 8 * MIB, checkpoints: 0, snapshots: 0 });

    await hostSh(sb, 'rm /workspace/sparse && head -c 2000000 /dev/urandom > /workspace/small');
    const next = await capture(o, sb);
    expect(next.status).toBe(201);
    expect(await usage(o)).toEqual({ usedBytes: next.body.sizeBytes, reservedBytes: 0, quotaBytes: 8 * MIB, checkpoints: 1, snapshots: 0 });
  });

  it('refuses an image build whose result would pass the quota (sandbox create: 507; snapshot build: failed with the quota error), storing nothing; one that fits is built', async () => {
    const o = await orgWithQuota(4);
    const layers = layersOnDisk();
    const big = image(`head -c 6000000 /dev/urandom > /root/blob-${unique('b')}`);

    const create = await api('POST', '/api/sandboxes', { key: o.key, body: { image: big } });
    if (create.status === 201) o.sandboxes.push(create.body.sandboxID);
    expect(answer(create)).toEqual(REFUSED);

    const name = unique('q-build');
    const build = await api('POST', '/api/snapshots', { key: o.key, body: { name, image: image(`head -c 6000000 /dev/urandom > /root/blob-${name}`) } });
    expect(build.status).toBe(202);
    o.snapshots.push(name);
    const done = await eventually(async () => {
      const s = await api('GET', `/api/snapshots/${name}`, { key: o.key });
      return s.body.status !== 'building' && s.body;
    }, 240_000);
    expect({ status: done.status, quota: /storage quota/.test(done.error) }).toEqual({ status: 'failed', quota: true });

    expect(await records(o)).toEqual([]);
    expect(layersOnDisk().filter((n) => !layers.includes(n))).toEqual([]);
    expect(await usage(o)).toMatchObject({ usedBytes: 0, reservedBytes: 0, checkpoints: 0 });

    const small = unique('q-small');
    expect(
      (await api('POST', '/api/snapshots', { key: o.key, body: { name: small, image: image('head -c 1000000 /dev/urandom > /root/small') } })).status,
    ).toBe(202);
    o.snapshots.push(small);
    const ok = await eventually(async () => {
      const s = await api('GET', `/api/snapshots/${small}`, { key: o.key });
      return s.body.status !== 'building' && s.body;
    }, 240_000);
    expect({ status: ok.status, error: ok.error }).toEqual({ status: 'ready', error: null });
    const u = await usage(o);
    expect(u).toMatchObject({ reservedBytes: 0, checkpoints: 1 });
    expect(u.usedBytes).toBeGreaterThanOrEqual(1_000_000);
    expect(u.usedBytes).toBeLessThanOrEqual(4 * MIB);
  });

  it('keeps the room of a capture whose API process died until its reservation lapses, then sweeps it away', async () => {
    const o = await orgWithQuota(8);
    const sb = await sandboxWith(o, 'head -c 1000000 /dev/urandom > /workspace/blob');
    // What a capture leaves when its API process dies between reserving and releasing: its admitted hold.
    const holds = () => withMongo((c) => c.db().collection('storage_holds').find({ orgId: o.id }).toArray());
    const hold = (expiresAt: Date) =>
      withMongo((c) =>
        c
          .db()
          .collection('storage_holds')
          .replaceOne(
            { _id: `${o.id}/0000000000-crashed/cp-crashed` as never },
            { orgId: o.id, holdId: 'cp-crashed', bytes: 8 * MIB, state: 'admitted', decideBy: new Date(Date.now() - 60_000), expiresAt },
            { upsert: true },
          ),
      );
    await hold(new Date(Date.now() + 10 * 60_000));
    const held = await capture(o, sb);
    expect(answer(held)).toEqual(REFUSED);
    expect(held.body.error.message).toMatch(/captures under way hold 8\.0 MiB/);
    expect(await usage(o)).toMatchObject({ usedBytes: 0, reservedBytes: 8 * MIB });

    await hold(new Date(Date.now() - 1000));
    expect(await usage(o)).toMatchObject({ usedBytes: 0, reservedBytes: 0 });
    expect((await capture(o, sb)).status).toBe(201);
    // The lapsed hold was swept away, and the capture's own released.
    expect(await holds()).toEqual([]);
  });

  it("shows each organisation its own use only; the default organisation's quota is the operator's default", async () => {
    const [mine] = orgs;
    expect((await usage(mine!)).checkpoints).toBeGreaterThanOrEqual(1);
    const fresh = await otherOrgKey(unique('quota-other'));
    expect(await usage({ key: fresh })).toEqual({ usedBytes: 0, reservedBytes: 0, quotaBytes: 10_240 * MIB, checkpoints: 0, snapshots: 0 });
    expect((await api('GET', '/api/usage', { key: null })).status).toBe(401);
  });
});
