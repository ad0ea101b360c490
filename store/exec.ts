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

export const execSessionsOf = (store: Store) => store.db.collection<ExecDoc>('exec_sessions');
export const agentSessionsOf = (store: Store) => store.db.collection<AgentSessionDoc>('sandbox_agent_sessions');

/** Indexes for the per-sandbox lists (MongoDB uses them; FerretDB scans regardless). */
export async function ensureExecIndexes(store: Store): Promise<void> {
  await execSessionsOf(store).createIndex({ sandboxId: 1, startedAt: -1 });
  await execSessionsOf(store).createIndex({ orgId: 1, exitedAt: 1 });
  await agentSessionsOf(store).createIndex({ sandboxId: 1, startedAt: -1 });
}
