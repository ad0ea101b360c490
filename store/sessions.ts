import { MongoBulkWriteError } from 'mongodb';
import type { Store, SessionDoc } from './index';
import type { SessionEnd, SessionOutcome } from '../contract/workflows';
import { isDuplicateKey } from './index';
import { addToList, listedAfter, listingsOf, listName, removeFromList, removeListed } from './listing';
import { encodeCursor } from './page';

/**
 * A session's state is written insert-only, in three documents keyed by the session id:
 * - `sessions`: the creation record (input, metadata), never updated;
 * - `session_progress`: inserted when its entrypoint has started (status `running`);
 * - `session_results`: inserted once when it ends (status, result, outcome).
 * FerretDB answers `_id` lookups and inserts in about a millisecond whatever the size of the
 * collection, but its updates and deletes scan the collection: they grow with it. Inserting
 * keeps the per-session cost constant, and a duplicate key makes each transition happen once.
 */
export interface SessionProgressDoc {
  _id: string;
  sandbox_id: string;
  started_at: Date;
}

export interface SessionResultDoc {
  _id: string;
  status: 'completed' | 'failed';
  /** JSON text of the agent's result object, or null. */
  result: string | null;
  outcome: SessionOutcome | null;
  completed_at: Date;
  /**
   * Where and when the entrypoint started, for a session that ended before it was marked running
   * (a short one: no progress record was written).
   */
  sandbox_id?: string;
  started_at?: Date;
}

export const sessionProgressOf = (store: Store) => store.db.collection<SessionProgressDoc>('session_progress');
export const sessionResultsOf = (store: Store) => store.db.collection<SessionResultDoc>('session_results');

/** A session as callers see it: its creation record with its progress and result applied. */
export function mergeSession(doc: SessionDoc, progress: SessionProgressDoc | null, result: SessionResultDoc | null): SessionDoc {
  const started = progress?.started_at ?? result?.started_at ?? null;
  const completed = result?.completed_at ?? null;
  return {
    ...doc,
    status: result ? result.status : progress ? 'running' : doc.status,
    sandbox_id: progress?.sandbox_id ?? result?.sandbox_id ?? doc.sandbox_id,
    started_at: started ?? doc.started_at,
    completed_at: completed ?? doc.completed_at,
    result: result ? result.result : doc.result,
    outcome: result ? result.outcome : doc.outcome,
    updated_at: completed ?? started ?? doc.updated_at,
  };
}

/**
 * What this process already knows of sessions, which never changes once known: a session that has
 * ended (everything), and one that has started (its creation and progress records). Polling a
 * running session then costs one lookup, and reading an ended one none.
 */
interface Known {
  doc: SessionDoc;
  progress: SessionProgressDoc | null;
  ended: SessionDoc | null;
}
const KNOWN_MAX = 20_000;
const knownByStore = new WeakMap<Store, Map<string, Known>>();

function knownOf(store: Store): Map<string, Known> {
  let m = knownByStore.get(store);
  if (!m) knownByStore.set(store, (m = new Map()));
  return m;
}

/** Sessions with more input and metadata than this are not kept in memory (inputs may be MiBs). */
const KNOWN_MAX_TEXT = 16 * 1024;

function remember(store: Store, id: string, k: Known): void {
  if ((k.doc.input?.length ?? 0) + (k.doc.metadata?.length ?? 0) + (k.ended?.result?.length ?? 0) > KNOWN_MAX_TEXT) return;
  const m = knownOf(store);
  m.delete(id);
  m.set(id, k);
  if (m.size > KNOWN_MAX) m.delete(m.keys().next().value as string);
}

/**
 * Remembers a session this process has just created, so that reading it back costs no lookup of
 * its creation record.
 */
export function rememberCreated(store: Store, doc: SessionDoc): void {
  remember(store, doc._id, { doc, progress: null, ended: null });
}

/** The creation record of a session this process knows, without any lookup; null if unknown. */
export function knownCreation(store: Store, id: string): SessionDoc | null {
  return knownOf(store).get(id)?.doc ?? null;
}

/** Reads a session with its current state (at most three `_id` lookups, in parallel); null if unknown. */
export async function readSession(store: Store, id: string): Promise<SessionDoc | null> {
  const known = knownOf(store).get(id);
  if (known?.ended) return known.ended;
  if (known) {
    // The result first: an ending that records its start needs no progress lookup.
    const result = await sessionResultsOf(store).findOne({ _id: id });
    const progress = known.progress ?? (result?.started_at ? null : await sessionProgressOf(store).findOne({ _id: id }));
    const merged = mergeSession(known.doc, progress, result);
    if (result) remember(store, id, { ...known, progress, ended: merged });
    else if (progress && !known.progress) remember(store, id, { ...known, progress });
    return merged;
  }
  const [doc, progress, result] = await Promise.all([
    store.sessions.findOne({ _id: id }),
    sessionProgressOf(store).findOne({ _id: id }),
    sessionResultsOf(store).findOne({ _id: id }),
  ]);
  if (!doc) return null;
  const merged = mergeSession(doc, progress, result);
  remember(store, id, { doc, progress, ended: result ? merged : null });
  return merged;
}

/** Reads the state of many sessions at once; unknown ids are left out. */
export async function readSessions(store: Store, docs: SessionDoc[]): Promise<SessionDoc[]> {
  return Promise.all(
    docs.map(async (doc) => {
      const [progress, result] = await Promise.all([sessionProgressOf(store).findOne({ _id: doc._id }), sessionResultsOf(store).findOne({ _id: doc._id })]);
      return mergeSession(doc, progress, result);
    }),
  );
}

/** Records that the session's entrypoint has started. Doing it twice is a no-op. */
export async function markSessionRunning(store: Store, id: string, sandboxId: string, at = new Date()): Promise<void> {
  try {
    await sessionProgressOf(store).insertOne({ _id: id, sandbox_id: sandboxId, started_at: at });
  } catch (err) {
    if (!isDuplicateKey(err)) throw err;
  }
}

/**
 * Records how a session ended. Only the first record counts: a retry or a second ending never
 * overwrites it. Returns whether this call recorded it.
 */

export async function recordSessionEnd(store: Store, id: string, end: SessionEnd, started?: { sandboxId: string; at: Date }): Promise<boolean> {
  try {
    await sessionResultsOf(store).insertOne({
      _id: id,
      status: end.status,
      result: end.result === null ? null : JSON.stringify(end.result),
      outcome: end.outcome,
      completed_at: new Date(),
      ...(started ? { sandbox_id: started.sandboxId, started_at: started.at } : {}),
    });
    return true;
  } catch (err) {
    if (isDuplicateKey(err)) return false;
    throw err;
  }
}

/** Which host provisions a run of a session (`<sessionId>#<run>`): the first to claim it. */
interface SessionClaimDoc {
  _id: string;
  hostId: string;
  at: Date;
}

/**
 * Claims run `run` of a session for host `hostId` before its sandbox is created, and answers the host
 * that holds the claim (this one, or one that claimed it first). A provisioning retried on another
 * host (a workflow task that timed out, say) thus goes back to the host that may have started the
 * entrypoint instead of starting it a second time. One insert (`_id`-keyed).
 */
export async function claimSessionRun(store: Store, sessionId: string, run: number, hostId: string): Promise<string> {
  const col = store.db.collection<SessionClaimDoc>('session_claims');
  const _id = `${sessionId}#${run}`;
  try {
    await col.insertOne({ _id, hostId, at: new Date() });
    return hostId;
  } catch (err) {
    if (!isDuplicateKey(err)) throw err;
  }
  const held = await col.findOne({ _id });
  return held?.hostId ?? hostId;
}

/** The host of a session's latest claimed run (runs 0-3), or null when none was claimed (one host). */
export async function sessionHostOf(store: Store, sessionId: string): Promise<string | null> {
  const ids = [0, 1, 2, 3].map((run) => `${sessionId}#${run}`);
  const claims = await store.db
    .collection<SessionClaimDoc>('session_claims')
    .find({ _id: { $in: ids } })
    .toArray();
  claims.sort((a, b) => b._id.localeCompare(a._id));
  return claims[0]?.hostId ?? null;
}

/** A session's creation record: what is known at creation (input and metadata as JSON text), the rest empty. */
export function newSessionDoc(
  f: Pick<SessionDoc, '_id' | 'orgId' | 'agent_id' | 'input' | 'metadata' | 'created_at'> & Partial<Pick<SessionDoc, 'idempotency_key' | 'webhook'>>,
): SessionDoc {
  return {
    status: 'creating',
    result: null,
    preview_url: null,
    outcome: null,
    sandbox_id: null,
    ...f,
    idempotency_key: f.idempotency_key ?? null,
    updated_at: f.created_at,
    started_at: null,
    completed_at: null,
  };
}

/** Stores a session's creation record; throws MongoDB's duplicate-key error when its id is taken. */
export async function insertSession(store: Store, doc: SessionDoc): Promise<void> {
  await store.sessions.insertOne(doc);
  await addToList(store, sessionList(doc.orgId, doc.agent_id), [doc]);
}

/** The list of an agent's sessions (store/listing.ts). */
export const sessionList = (orgId: string, agentId: string) => listName('sessions', orgId, agentId);

/** Makes sure an existing session is in its agent's list (a retried creation whose first try stopped between the two writes). */
export async function listSession(store: Store, doc: SessionDoc): Promise<void> {
  await addToList(store, sessionList(doc.orgId, doc.agent_id), [doc]);
}

/** Deletes a session's creation record (its workflow could not be started). */
export async function deleteSession(store: Store, doc: SessionDoc): Promise<void> {
  await store.sessions.deleteOne({ _id: doc._id });
  await removeFromList(store, sessionList(doc.orgId, doc.agent_id), doc);
}

/**
 * The creation records of up to `size` of an agent's sessions after `cursor`, newest first (their
 * state not merged in), and the cursor after the last of those `size` (absent when there were
 * fewer: the end of the list). Listed sessions that are gone are left out.
 */
export async function sessionCreationsAfter(
  store: Store,
  orgId: string,
  agentId: string,
  cursor: string | undefined,
  size: number,
): Promise<{ docs: SessionDoc[]; next?: string }> {
  const listed = await listedAfter(store, sessionList(orgId, agentId), cursor, size);
  const found = await Promise.all(listed.map((l) => store.sessions.findOne({ _id: l.id })));
  // A key whose session is gone, or that was written for another creation time, is left out.
  const fits = (d: SessionDoc | null, i: number): d is SessionDoc =>
    d !== null && d.orgId === orgId && d.agent_id === agentId && d.created_at.getTime() === listed[i]!.created_at.getTime();
  const docs = found.filter(fits);
  // Such a key is stale (a session is stored before its key): removed.
  const list = sessionList(orgId, agentId);
  await removeListed(
    store,
    listed.filter((_, i) => !fits(found[i] ?? null, i)).map((item) => ({ list, item })),
  );
  const last = listed[listed.length - 1];
  if (listed.length < size || !last) return { docs };
  return { docs, next: encodeCursor({ t: last.created_at.toISOString(), id: last.id }) };
}

/** Stores many sessions' creation records at once; records that exist already are left as they are. */
export async function insertSessionsOnce(store: Store, docs: SessionDoc[]): Promise<void> {
  if (docs.length === 0) return;
  let dups: string[] = [];
  try {
    await store.sessions.insertMany(docs, { ordered: false });
  } catch (err) {
    const dupOnly = err instanceof MongoBulkWriteError && [err.writeErrors].flat().every((e) => e.code === 11000);
    if (!dupOnly) throw err;
    dups = [err.writeErrors].flat().flatMap((e) => (docs[e.index] ? [docs[e.index]!._id] : []));
  }
  // A session stored by an earlier try keeps its creation time: list it by the stored record.
  const stored = dups.length
    ? new Map((await Promise.all(dups.map((id) => store.sessions.findOne({ _id: id })))).flatMap((d) => (d ? [[d._id, d]] : [])))
    : null;
  const byList = new Map<string, SessionDoc[]>();
  for (const d of docs) {
    const item = stored?.get(d._id) ?? d;
    const list = sessionList(item.orgId, item.agent_id);
    byList.set(list, [...(byList.get(list) ?? []), item]);
  }
  for (const [list, items] of byList) await addToList(store, list, items);
}

/** Deletes the sessions among `ids` that are still `creating` (never started), and their listing keys; returns how many. */
export async function deleteUnstartedSessions(store: Store, ids: string[]): Promise<number> {
  const filter = { _id: { $in: ids }, status: 'creating' as const };
  const found = await store.sessions.find(filter, { projection: { _id: 1, orgId: 1, agent_id: 1, created_at: 1 } }).toArray();
  if (found.length === 0) return 0;
  const r = await store.sessions.deleteMany({ _id: { $in: found.map((d) => d._id) }, status: 'creating' });
  await removeListed(
    store,
    found.map((d) => ({ list: sessionList(d.orgId, d.agent_id), item: { id: d._id, created_at: d.created_at } })),
  );
  return r.deletedCount;
}

/** A session's input (JSON text) from its creation record; null when there is none. */
export async function sessionInputOf(store: Store, id: string): Promise<{ input: string } | null> {
  return store.sessions.findOne({ _id: id }, { projection: { input: 1 } });
}

/** A session's result record; null while it has not ended. */
export function readSessionResult(store: Store, id: string): Promise<SessionResultDoc | null> {
  return sessionResultsOf(store).findOne({ _id: id });
}

/**
 * Lists the sessions stored before sessions were listed (store/listing.ts), once per database
 * (a marker in `listings` says it is done). Returns how many sessions it read.
 */
export async function listUnlistedSessions(store: Store): Promise<number> {
  const marker = { _id: 'migrated:sessions-listed' };
  if (await listingsOf(store).findOne(marker)) return 0;
  let n = 0;
  let batch: SessionDoc[] = [];
  const flush = async () => {
    await insertSessionsOnce(store, batch);
    batch = [];
  };
  for await (const d of store.sessions.find({})) {
    batch.push(d);
    n++;
    if (batch.length === 1000) await flush();
  }
  await flush();
  try {
    await listingsOf(store).insertOne(marker);
  } catch (err) {
    if (!isDuplicateKey(err)) throw err;
  }
  return n;
}
