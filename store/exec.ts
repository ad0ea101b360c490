import type { Store } from './index';
import { BACKFILLED, backfillOnce, entryKey, groupRange, insertEntries, memberOf, settled } from './entry-keys';

/**
 * An exec session started through the public API. The process itself lives on the sandbox host
 * (in its memory); this record keeps who owns it and how it ended. `_id` is the host's session id
 * (`es-…`), so every lookup is by `_id`. `running` and `attachedClients` are never stored: they
 * are read from the host at read time.
 */
export interface ExecDoc {
  _id: string;
  orgId: string;
  sandboxId: string;
  command: string;
  args: string[];
  startedAt: Date;
  /** Set once the API has seen the command exit (from the host's own exit time when it has one). */
  exitedAt: Date | null;
  exitCode: number | null;
  /** Set with the exit when the host reported it: whether the sandbox's memory limit got a process OOM-killed meanwhile. */
  oomKilled?: boolean;
}

/**
 * An agent session (`as-…`): an agent runner started inside a sandbox as exec session `execId`.
 * `options` is the JSON text of the request's options (caller-supplied objects are stored as text).
 */
export interface AgentSessionDoc {
  _id: string;
  orgId: string;
  sandboxId: string;
  execId: string;
  /** Where the runner writes the agent SDK's session id, inside the sandbox. */
  stateFile: string;
  options: string;
  /** The agent SDK's own session id once the runner reported it; '' before. */
  agentSessionID: string;
  startedAt: Date;
  exitedAt: Date | null;
  exitCode: number | null;
  /** As ExecDoc.oomKilled. */
  oomKilled?: boolean;
}

const execSessionsOf = (store: Store) => store.db.collection<ExecDoc>('exec_sessions');

/**
 * Open-exec entries: one small document per exec session without a recorded exit, keyed by the
 * organisation and the session (./entry-keys). How many an organisation runs is then one `_id`
 * range read, where a filter on `orgId` and `exitedAt` scans
 * every exec session ever recorded, exited ones included, and grows with them all. An entry is
 * written with its record and removed after the exit is recorded. An entry whose record has an exit,
 * or never got one (an API killed in between), is removed when the organisation's sessions are
 * checked against their hosts (listOpenExecs); a record whose entry was not written (the same) is
 * not counted until it exits: at most the starts in flight when an API dies.
 */
interface OpenExecDoc {
  _id: string;
  /** When it was written: one without a record is removed only once no start in flight can explain it. */
  at: Date;
}
const openExecsOf = (store: Store) => store.db.collection<OpenExecDoc>('open_execs');
const agentSessionsOf = (store: Store) => store.db.collection<AgentSessionDoc>('sandbox_agent_sessions');

/** Indexes for the per-sandbox lists (MongoDB uses them; FerretDB scans regardless). */
export async function ensureExecIndexes(store: Store): Promise<void> {
  await execSessionsOf(store).createIndex({ sandboxId: 1, startedAt: -1 });
  await execSessionsOf(store).createIndex({ orgId: 1, exitedAt: 1 });
  await agentSessionsOf(store).createIndex({ sandboxId: 1, startedAt: -1 });
}

/** A session record of either kind: `exec` (es-…) or `agent` (as-…). */
export type SessionKind = 'exec' | 'agent';

/**
 * Records a new exec session: its open-exec entry and its record, written at the same time (the
 * start's answer waits for them; one after the other cost its first byte 1.5 ms). `counted` is called
 * once the entry is written: from then on countOpenExecs counts the session.
 */
export async function insertExec(store: Store, doc: ExecDoc, counted?: () => void): Promise<void> {
  await Promise.all([
    doc.exitedAt === null ? insertOpenExec(store, doc.orgId, doc._id).then(() => counted?.()) : counted?.(),
    execSessionsOf(store).insertOne(doc),
  ]);
}

async function insertOpenExec(store: Store, orgId: string, execId: string): Promise<void> {
  await insertEntries(openExecsOf(store), [{ _id: entryKey(orgId, execId), at: new Date() }]);
}

/** Removes an exec session's record (one whose command the host did not start), then its open-exec entry. */
export async function deleteExec(store: Store, doc: Pick<ExecDoc, '_id' | 'orgId'>): Promise<void> {
  await execSessionsOf(store).deleteOne({ _id: doc._id });
  await openExecsOf(store).deleteOne({ _id: entryKey(doc.orgId, doc._id) });
}

/** Records a new agent session. */
export async function insertAgentSession(store: Store, doc: AgentSessionDoc): Promise<void> {
  await agentSessionsOf(store).insertOne(doc);
}

/** An exec session's record by id, or null. */
export function findExec(store: Store, id: string): Promise<ExecDoc | null> {
  return execSessionsOf(store).findOne({ _id: id });
}

/** An agent session's record by id, or null. */
export function findAgentSession(store: Store, id: string): Promise<AgentSessionDoc | null> {
  return agentSessionsOf(store).findOne({ _id: id });
}

/** A sandbox's exec sessions, newest first (at most 1000). */
export function listSandboxExecs(store: Store, sandboxId: string): Promise<ExecDoc[]> {
  return execSessionsOf(store).find({ sandboxId }).sort({ startedAt: -1 }).limit(1000).toArray();
}

/** A sandbox's agent sessions, newest first (at most 1000). */
export function listSandboxAgentSessions(store: Store, sandboxId: string): Promise<AgentSessionDoc[]> {
  return agentSessionsOf(store).find({ sandboxId }).sort({ startedAt: -1 }).limit(1000).toArray();
}

/** The ids of the organisation's exec sessions without a recorded exit (by their open-exec entries), at most `limit`. */
export async function countOpenExecs(store: Store, orgId: string, limit: number): Promise<string[]> {
  const docs = await openExecsOf(store).find(groupRange(orgId)).sort({ _id: 1 }).limit(limit).toArray();
  return docs.map((d) => memberOf(d._id));
}

/**
 * The organisation's exec sessions without a recorded exit (the fields an exit check needs), read
 * by their open-exec entries (at most 100,000); an entry whose record has an exit, or has none, is removed.
 */
export async function listOpenExecs(store: Store, orgId: string): Promise<Pick<ExecDoc, '_id' | 'sandboxId' | 'exitedAt' | 'oomKilled'>[]> {
  const entries = await openExecsOf(store).find(groupRange(orgId)).sort({ _id: 1 }).limit(100_000).toArray();
  const out: Pick<ExecDoc, '_id' | 'sandboxId' | 'exitedAt' | 'oomKilled'>[] = [];
  for (let i = 0; i < entries.length; i += 50) {
    await Promise.all(
      entries.slice(i, i + 50).map(async (e) => {
        const id = memberOf(e._id);
        const doc = await execSessionsOf(store).findOne({ _id: id }, { projection: { _id: 1, sandboxId: 1, exitedAt: 1, oomKilled: 1 } });
        if (doc && doc.exitedAt === null) out.push(doc);
        // An exit recorded but its entry left, or an entry whose record was never written (or was
        // removed) long ago: an API died between the two writes.
        else if (doc || settled(e.at)) await openExecsOf(store).deleteOne({ _id: e._id });
      }),
    );
  }
  return out;
}

/**
 * Sets fields (exit, oomKilled, agentSessionID) of a session record of either kind; false when there
 * is no record. An exec's recorded exit removes its open-exec entry (after the record's write).
 */
export async function updateSession(store: Store, kind: SessionKind, id: string, fields: Record<string, unknown>): Promise<boolean> {
  if (kind === 'exec' && fields.exitedAt) {
    const before = await execSessionsOf(store).findOneAndUpdate({ _id: id }, { $set: fields }, { returnDocument: 'before' });
    if (!before) return false;
    await openExecsOf(store).deleteOne({ _id: entryKey(before.orgId, id) });
    return true;
  }
  const coll = kind === 'exec' ? execSessionsOf(store) : agentSessionsOf(store);
  const r = await (coll as ReturnType<typeof execSessionsOf>).updateOne({ _id: id }, { $set: fields });
  return r.matchedCount > 0;
}

export { BACKFILLED };

/**
 * Gives every exec session without a recorded exit, recorded before open-exec entries existed, its
 * entry: once per database (a marker says it was done). Answers how many it wrote.
 */
export async function backfillOpenExecs(store: Store): Promise<number> {
  return backfillOnce(openExecsOf(store), { _id: BACKFILLED, at: new Date() }, async () => {
    const open = await execSessionsOf(store)
      .find({ exitedAt: null }, { projection: { _id: 1, orgId: 1 } })
      .toArray();
    for (const d of open) await insertOpenExec(store, d.orgId, d._id);
    return open.length;
  });
}
