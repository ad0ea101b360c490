/**
 * Open-exec entries (store/exec.ts) against the real store: an organisation's running exec sessions are
 * counted from them (one `_id` range), an exit removes its entry, and entries an API killed between two
 * writes left behind are removed when the organisation's sessions are checked, without counting.
 */
import { T, unique } from '../../helpers/env';
import { connectStore, type Store } from '../../../store';
import { BACKFILLED, backfillOpenExecs, countOpenExecs, deleteExec, insertExec, listOpenExecs, updateSession, type ExecDoc } from '../../../store/exec';

describe('open-exec entries', () => {
  let store: Store;
  const org = unique('open-execs');
  const open = () => store.db.collection<{ _id: string; at: Date }>('open_execs');
  const records = () => store.db.collection<ExecDoc>('exec_sessions');
  const doc = (id: string): ExecDoc => ({
    _id: id,
    orgId: org,
    sandboxId: 'sb-x',
    command: 'sleep',
    args: ['1'],
    startedAt: new Date(),
    exitedAt: null,
    exitCode: null,
  });
  const ids: string[] = [];
  const newId = () => {
    const id = `es-${unique('o').replace(/[^a-z0-9]/g, '')}`;
    ids.push(id);
    return id;
  };

  beforeAll(async () => {
    store = await connectStore(T.mongo(), { ensureIndexes: false });
  });
  afterAll(async () => {
    if (!store) return;
    await records().deleteMany({ _id: { $in: ids } });
    await open().deleteMany({ _id: { $in: ids.map((i) => `${org}\u0001${i}`) } });
    await store.close();
  });

  it('counts the sessions without an exit; an exit or a start that failed removes its entry', async () => {
    const [a, b, c] = [newId(), newId(), newId()];
    let counted = false;
    await insertExec(store, doc(a), () => (counted = true));
    expect(counted).toBe(true);
    await insertExec(store, doc(b));
    await insertExec(store, doc(c));
    expect((await countOpenExecs(store, org, 100)).sort()).toEqual([a, b, c].sort());
    expect(await countOpenExecs(store, org, 2)).toHaveLength(2);
    expect(await updateSession(store, 'exec', a, { exitedAt: new Date(), exitCode: 0 })).toBe(true);
    await deleteExec(store, { _id: b, orgId: org });
    expect(await countOpenExecs(store, org, 100)).toHaveLength(1);
    expect((await listOpenExecs(store, org)).map((d) => d._id)).toEqual([c]);
    // No record: nothing written, nothing removed.
    expect(await updateSession(store, 'exec', newId(), { exitedAt: new Date(), exitCode: 0 })).toBe(false);
    await updateSession(store, 'exec', c, { exitedAt: new Date(), exitCode: 0 });
    expect(await countOpenExecs(store, org, 100)).toHaveLength(0);
  });

  it('removes, when the sessions are checked, an entry whose exit was recorded and one whose record never came (a minute on), never a start in flight', async () => {
    const [exited, never, inFlight] = [newId(), newId(), newId()];
    // An API killed between the exit's record and its entry's removal; one killed between an entry and its record; a start in flight.
    await records().insertOne({ ...doc(exited), exitedAt: new Date(), exitCode: 0 });
    const old = new Date(Date.now() - 3_600_000);
    await open().insertMany([
      { _id: `${org}\u0001${exited}`, at: old },
      { _id: `${org}\u0001${never}`, at: old },
      { _id: `${org}\u0001${inFlight}`, at: new Date() },
    ]);
    expect(await countOpenExecs(store, org, 100)).toHaveLength(3);
    expect(await listOpenExecs(store, org)).toEqual([]);
    expect(
      (
        await open()
          .find({ _id: { $gt: `${org}\u0001`, $lt: `${org}\u0002` } })
          .toArray()
      ).map((e) => e._id),
    ).toEqual([`${org}\u0001${inFlight}`]);
  });

  it('gives the sessions recorded before entries existed theirs, once per database', async () => {
    const legacy = newId();
    await records().insertOne(doc(legacy));
    await open().deleteOne({ _id: BACKFILLED });
    expect(await backfillOpenExecs(store)).toBeGreaterThanOrEqual(1);
    expect(await countOpenExecs(store, org, 100)).toHaveLength(2); // the legacy one, and the start in flight above
    expect(await backfillOpenExecs(store)).toBe(0);
  });
});
