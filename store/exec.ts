import type { Store } from './index';

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
const agentSessionsOf = (store: Store) => store.db.collection<AgentSessionDoc>('sandbox_agent_sessions');

/** Indexes for the per-sandbox lists (MongoDB uses them; FerretDB scans regardless). */
export async function ensureExecIndexes(store: Store): Promise<void> {
  await execSessionsOf(store).createIndex({ sandboxId: 1, startedAt: -1 });
  await execSessionsOf(store).createIndex({ orgId: 1, exitedAt: 1 });
  await agentSessionsOf(store).createIndex({ sandboxId: 1, startedAt: -1 });
}

/** A session record of either kind: `exec` (es-…) or `agent` (as-…). */
export type SessionKind = 'exec' | 'agent';

/** Records a new exec session. */
export async function insertExec(store: Store, doc: ExecDoc): Promise<void> {
  await execSessionsOf(store).insertOne(doc);
}

/** Removes an exec session's record (one whose command the host did not start). */
export async function deleteExec(store: Store, id: string): Promise<void> {
  await execSessionsOf(store).deleteOne({ _id: id });
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

/** How many of the organisation's exec sessions have no recorded exit, counting at most `limit`. */
export function countOpenExecs(store: Store, orgId: string, limit: number): Promise<number> {
  return execSessionsOf(store).countDocuments({ orgId, exitedAt: null }, { limit });
}

/** The organisation's exec sessions without a recorded exit (the fields an exit check needs). */
export function listOpenExecs(store: Store, orgId: string): Promise<Pick<ExecDoc, '_id' | 'sandboxId' | 'exitedAt' | 'oomKilled'>[]> {
  return execSessionsOf(store)
    .find({ orgId, exitedAt: null }, { projection: { _id: 1, sandboxId: 1, exitedAt: 1, oomKilled: 1 } })
    .toArray();
}

/** Sets fields (exit, oomKilled, agentSessionID) of a session record of either kind. */
export async function updateSession(store: Store, kind: SessionKind, id: string, fields: Record<string, unknown>): Promise<boolean> {
  const coll = kind === 'exec' ? execSessionsOf(store) : agentSessionsOf(store);
  const r = await (coll as ReturnType<typeof execSessionsOf>).updateOne({ _id: id }, { $set: fields });
  return r.matchedCount > 0;
}
