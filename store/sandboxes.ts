import { isDuplicateKey, type Store } from './index';
import { MongoBulkWriteError, MongoServerError } from 'mongodb';
import { GroupWriter } from './group-writer';
import { addToList, addToLists, listName, listUnlisted, pageListed } from './listing';

/**
 * A sandbox created through /api/sandboxes (or an instance's): which organisation owns it and
 * which host runs it. `_id` is the sandbox id (`sb-…`), so every lookup is by `_id`.
 * Caller-supplied objects (metadata, envs) are stored as JSON text (see AgentDoc).
 */
export interface SandboxDoc {
  _id: string;
  orgId: string;
  hostId: string;
  status: 'running' | 'hibernated' | 'stopped' | 'error';
  /** While hibernated: the layer its files were saved to, and when. */
  hibernation?: { layerId: string; at: Date } | null;
  /** What an idle `timeout` does: kill (default) or hibernate. */
  onTimeout?: 'kill' | 'hibernate';
  templateID: string;
  /** JSON text of the caller's metadata object. */
  metadata: string;
  /** Where it came from, when not the base image. */
  fromCheckpoint: string | null;
  snapshot: string | null;
  /** The patches of its checkpoint it has, in the order applied (absent in records from before: every patch runs at each wake). */
  patchesApplied?: { id: string; sequence: number }[];
  /** The patch that stopped the chain (it and those after it are not applied; the next wake retries it), or null. */
  patchFailed?: { id: string; sequence: number; exitCode: number; outputTail: string; at: Date } | null;
  /** Idle timeout in seconds, 0 = none. */
  timeout: number;
  /** Effective limits (defaults filled in); null in records written before limits were recorded. */
  memoryMB: number | null;
  /** CPUs of CFS quota; 0 = no quota (an equal cpu.shares weight). */
  cpuCount: number | null;
  /** Size of the writable layer in MB; absent in records written before it existed. */
  diskMB?: number | null;
  /** The instance that owns it, if any. */
  instanceId: string | null;
  /** Its egress policy (absent in records written before policies were recorded: the default, `internet`). */
  network?: { egress: 'internet' | 'none' | { allow: string[] } } | null;
  /** The secret store it was created with, if any. */
  secretStore?: string | null;
  /** Who its processes run as; absent: root (a sandbox recorded before the option existed). */
  user?: 'root' | 'sandbox';
  /**
   * True from its create until a preview is made for it: its delete then looks for no previews (one
   * read fewer). Absent in records from before, and once a preview was made: the delete looks.
   */
  noPreviews?: boolean;
  /** Last time a caller used it (exec, files, previews); the idle timeout counts from here. */
  lastActiveAt?: Date;
  createdAt: Date;
  updatedAt: Date;
}

export const sandboxesOf = (store: Store) => store.db.collection<SandboxDoc>('sandboxes');

/** The organisation's sandbox, or null (another organisation's sandbox is null too). */
export async function findOrgSandbox(store: Store, orgId: string, id: string): Promise<SandboxDoc | null> {
  const doc = await sandboxesOf(store).findOne({ _id: id });
  return doc && doc.orgId === orgId ? doc : null;
}

const LIVE: SandboxDoc['status'][] = ['running', 'hibernated'];
const isLive = (doc: SandboxDoc) => LIVE.includes(doc.status);

/**
 * The list of an organisation's live (running or hibernated) sandboxes (store/listing.ts). A sandbox
 * is listed when recorded live; its key is dropped when the list meets it stopped (a state it never
 * leaves) or gone, so the list holds the live ones and those stopped since it was last read.
 */
const liveList = (orgId: string) => listName('sandboxes', orgId);
const listedAs = (doc: Pick<SandboxDoc, '_id' | 'createdAt'>) => ({ _id: doc._id, created_at: doc.createdAt });

async function listLive(store: Store, doc: SandboxDoc): Promise<void> {
  if (isLive(doc)) await addToList(store, liveList(doc.orgId), [listedAs(doc)]);
}

/** The group writer of new sandboxes' records, one per store (see insertSandbox). */
const inserts = new WeakMap<Store, GroupWriter<SandboxDoc>>();

/** One write of many new sandboxes (an unordered insert, then their keys in the live lists): each one's error, or undefined. */
async function insertSandboxes(store: Store, docs: SandboxDoc[]): Promise<(unknown | undefined)[]> {
  if (docs.length === 1) {
    await sandboxesOf(store).insertOne(docs[0]!);
    await listLive(store, docs[0]!);
    return [undefined];
  }
  const errors: (unknown | undefined)[] = docs.map(() => undefined);
  try {
    await sandboxesOf(store).insertMany(docs, { ordered: false });
  } catch (err) {
    if (!(err instanceof MongoBulkWriteError)) throw err;
    const failed = [err.writeErrors].flat();
    if (failed.length === 0) throw err;
    for (const e of failed) errors[e.index] = new MongoServerError({ message: e.errmsg ?? 'write failed', code: e.code });
  }
  const written = docs.filter((d, i) => errors[i] === undefined && isLive(d));
  await addToLists(
    store,
    written.map((d) => ({ list: liveList(d.orgId), item: listedAs(d) })),
  );
  return errors;
}

/**
 * Records a new sandbox. Records created at the same time are written together (group commit:
 * see store/group-writer.ts), so a burst of creates costs the store a few writes, not two each.
 */
export function insertSandbox(store: Store, doc: SandboxDoc): Promise<void> {
  let writer = inserts.get(store);
  if (!writer) inserts.set(store, (writer = new GroupWriter((docs) => insertSandboxes(store, docs))));
  return writer.add(doc);
}

/** Records a sandbox hibernated (status `hibernated`, its layer) and returns it as recorded. */
export async function recordHibernation(store: Store, doc: SandboxDoc, layerId: string): Promise<SandboxDoc> {
  const now = new Date();
  const hibernation = { layerId, at: now };
  await sandboxesOf(store).updateOne({ _id: doc._id }, { $set: { status: 'hibernated', hibernation, updatedAt: now } });
  return { ...doc, status: 'hibernated', hibernation, updatedAt: now };
}

/** Removes a sandbox's record (a create that failed on its host). */
export async function deleteSandboxRecord(store: Store, id: string): Promise<void> {
  await sandboxesOf(store).deleteOne({ _id: id });
}

/**
 * Sets fields of a sandbox's record. One recorded live again is listed again: under `listed` (its
 * organisation and creation time, which never change) when the caller has them, else as read back.
 */
export async function updateSandbox(store: Store, id: string, set: Partial<SandboxDoc>, listed?: Pick<SandboxDoc, 'orgId' | 'createdAt'>): Promise<void> {
  await sandboxesOf(store).updateOne({ _id: id }, { $set: set });
  if (set.status && LIVE.includes(set.status)) {
    if (listed) {
      await addToList(store, liveList(listed.orgId), [listedAs({ _id: id, createdAt: listed.createdAt })]);
      return;
    }
    const doc = await findSandbox(store, id);
    if (doc) await listLive(store, doc);
  }
}

/**
 * The organisation's running and hibernated sandboxes, newest first (at most 1000): read from its
 * list of live sandboxes, so the cost does not grow with the sandboxes it ever had.
 */
export async function listLiveOrgSandboxes(store: Store, orgId: string): Promise<SandboxDoc[]> {
  const load = async (id: string) => {
    const doc = await findSandbox(store, id);
    // Not live (stopped, gone) or not this organisation's: its key is dropped from the list.
    return doc && doc.orgId === orgId && isLive(doc) ? { ...doc, created_at: doc.createdAt } : null;
  };
  const { page } = await pageListed(store, liveList(orgId), undefined, 1000, load);
  return page.map(({ created_at: _, ...doc }) => doc);
}

/** Lists the live sandboxes recorded before they were listed by key, once per database; returns how many it read. */
export function listUnlistedSandboxes(store: Store): Promise<number> {
  const live = sandboxesOf(store).find({ status: { $in: LIVE } }, { projection: { orgId: 1, createdAt: 1 } });
  const items = (async function* () {
    for await (const d of live) yield { ...d, created_at: d.createdAt };
  })();
  return listUnlisted(store, 'migrated:sandboxes-listed', items, (d) => ({ list: liveList(d.orgId), id: d._id }));
}

/** A running or hibernated sandbox of the organisation that stands on checkpoint `checkpointId` (its id only), or null. */
export function findSandboxOnCheckpoint(store: Store, orgId: string, checkpointId: string): Promise<{ _id: string } | null> {
  return sandboxesOf(store).findOne({ orgId, fromCheckpoint: checkpointId, status: { $in: ['running', 'hibernated'] } }, { projection: { _id: 1 } });
}

/** A running sandbox of the organisation started from snapshot `snapshotId` (its id only), or null. */
export function findRunningSandboxOfSnapshot(store: Store, orgId: string, snapshotId: string): Promise<{ _id: string } | null> {
  return sandboxesOf(store).findOne({ orgId, snapshot: snapshotId, status: 'running' }, { projection: { _id: 1 } });
}

/** Records a sandbox (created, or about to be); a record that exists already is left as it is. */
export async function insertSandboxOnce(store: Store, doc: SandboxDoc): Promise<void> {
  try {
    await sandboxesOf(store).insertOne(doc);
  } catch (err) {
    if (!isDuplicateKey(err)) throw err;
    return;
  }
  await listLive(store, doc);
}

/** Reads a sandbox's record; null when there is none. */
export function findSandbox(store: Store, id: string): Promise<SandboxDoc | null> {
  return sandboxesOf(store).findOne({ _id: id });
}

/**
 * Notes that running sandbox `id` gets a preview (its delete will look for previews); answers its
 * record, or null when it is not running.
 */
export async function markSandboxPreviewed(store: Store, id: string): Promise<SandboxDoc | null> {
  // By `_id` alone (see markSandboxStoppedOnce); the mark left on a record that is not running only
  // makes its next delete look for previews.
  const doc = await sandboxesOf(store).findOneAndUpdate({ _id: id }, { $unset: { noPreviews: '' } }, { returnDocument: 'after' });
  return doc?.status === 'running' ? doc : null;
}

/**
 * Records a sandbox stopped and answers its record as it was before (null: there is none). A record
 * stopped already keeps its `updatedAt` (written back, on that rare path). The filter is the `_id`
 * alone: FerretDB answers that from its index, and a filter with any other field scans every record.
 */
export async function markSandboxStoppedOnce(store: Store, id: string, at = new Date()): Promise<SandboxDoc | null> {
  const before = await sandboxesOf(store).findOneAndUpdate({ _id: id }, { $set: { status: 'stopped', updatedAt: at } }, { returnDocument: 'before' });
  if (before?.status === 'stopped') await sandboxesOf(store).updateOne({ _id: id }, { $set: { updatedAt: before.updatedAt } });
  return before;
}

/** Records a sandbox stopped; answers its record as it is then, or null when there is none. */
export function markSandboxStopped(store: Store, id: string, at = new Date()): Promise<SandboxDoc | null> {
  return sandboxesOf(store).findOneAndUpdate({ _id: id }, { $set: { status: 'stopped', updatedAt: at } }, { returnDocument: 'after' });
}

/** The instances whose sandboxes run on host `hostId`. */
export async function instancesOnHost(store: Store, hostId: string): Promise<string[]> {
  const docs = await sandboxesOf(store)
    .find({ hostId, status: 'running', instanceId: { $ne: null } }, { projection: { instanceId: 1 } })
    .toArray();
  return docs.flatMap((d) => (d.instanceId ? [d.instanceId] : []));
}

/** The records of sandboxes `ids` (their status, owner instance and creation time only). */
export function findSandboxStates(store: Store, ids: string[]): Promise<Pick<SandboxDoc, '_id' | 'status' | 'instanceId' | 'createdAt'>[]> {
  if (ids.length === 0) return Promise.resolve([]);
  return sandboxesOf(store)
    .find({ _id: { $in: ids } }, { projection: { _id: 1, status: 1, instanceId: 1, createdAt: 1 } })
    .toArray();
}

/** The ids of the sandboxes recorded running on host `hostId` and created before `before`. */
export async function runningSandboxIdsOnHost(store: Store, hostId: string, before: Date): Promise<string[]> {
  const docs = await sandboxesOf(store)
    .find({ hostId, status: 'running', createdAt: { $lt: before } }, { projection: { _id: 1 } })
    .toArray();
  return docs.map((d) => d._id);
}

/** Records sandboxes `ids` as `status` (those still recorded running only: a kill or hibernate recorded meanwhile stays). */
export async function markRunningSandboxes(store: Store, ids: string[], status: 'stopped' | 'error', at = new Date()): Promise<void> {
  if (ids.length === 0) return;
  await sandboxesOf(store).updateMany({ _id: { $in: ids }, status: 'running' }, { $set: { status, updatedAt: at } });
}
