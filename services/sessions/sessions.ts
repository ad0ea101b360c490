import type { z } from 'zod';
import type { CreateSessionBody } from '../../contract/schemas';
import { snapshotRefOf } from '../checkpoints/snapshots';
import type { HostClient } from '../../sandbox';
import { ApiError, conflict, notFound } from '../../contract/errors';
import { derivedId, randomId } from '../../lib/ids';
import { sandboxIdForSession } from '../../lib/naming';
import { assertWebhookTarget, sealWebhook, webhookSpec } from '../webhooks/webhook-rules';
import { isDuplicateKey, type AgentDoc, type SessionDoc, type SessionStatus } from '../../store';
import { runSpecOf } from './run-spec';
import { encodeCursor } from '../../store/page';
import {
  deleteSession,
  insertSession,
  knownCreation,
  newSessionDoc,
  readSession,
  readSessions,
  recordSessionEnd,
  rememberCreated,
  sessionCreationsAfter,
  listSession,
  sessionHostOf,
} from '../../store/sessions';
import { readSessionLog, sessionLogDoc, type SessionLogDoc } from '../../store/session-logs';

export type { SessionLogDoc } from '../../store/session-logs';
import { AGENT_ID, ORG_ID, SESSION_STATUS, sessionSummary, type SessionWorkflowArgs } from '../../workflows/defs';
import type { AgentService } from '../agents/agents';
import type { ServiceDeps } from '../deps';
import { endWorkflowAndWait, startWorkflowOnce, waitForClose } from '../workflow-control';

const TERMINAL = new Set(['completed', 'failed']);
/** Listing reads creation records in chunks of this many, and at most this many per request. */
const LIST_CHUNK = 100;
const LIST_SCAN_LIMIT = 2000;
/** Inputs up to this many characters of JSON go in the workflow's arguments; larger ones stay in MongoDB only. */
const INLINE_INPUT_MAX = 4096;
/** How often a follow asks the sandbox host for new output (its wait for the entrypoint's exit paces it). */
const FOLLOW_POLL_MS = 500;

/** Whether a session has ended (completed or failed). */
export const isTerminal = (s: SessionDoc): boolean => TERMINAL.has(s.status);

/** Where a followed log is written (the HTTP response, chunked). */
export interface LogWriter {
  write(chunk: string | Buffer): void;
  end(): void;
  /** True once the reader has gone away. */
  readonly closed: boolean;
}

/** Which output of a session's entrypoint. */
export type LogStream = 'stdout' | 'stderr' | 'all';

/** Sessions: one sandbox running an agent on an input, each a workflow. */
export interface SessionService {
  /**
   * Creates a session and starts its workflow. With an idempotency key, a second request answers
   * the session the first created (`created: false`; 409 if it was for another agent).
   */
  create(
    orgId: string,
    agentId: string,
    body: z.infer<typeof CreateSessionBody>,
    idempotencyKey: string | undefined,
  ): Promise<{ session: SessionDoc; created: boolean }>;
  /** A page of an agent's sessions, newest first, optionally of one status. */
  list(
    orgId: string,
    agentId: string,
    q: { status?: SessionStatus; limit: number; cursor?: string },
  ): Promise<{ sessions: SessionDoc[]; next_cursor: string | null }>;
  /** Reads a session of the organisation and agent, or throws 404. */
  get(orgId: string, agentId: string, id: string): Promise<SessionDoc>;
  /**
   * With `wait` seconds, answers once the session has ended or the time is up (or `signal`
   * aborts), whichever comes first. The wait is one long poll on the workflow's close in Temporal.
   */
  getWaiting(orgId: string, agentId: string, id: string, wait: number | undefined, signal: AbortSignal): Promise<SessionDoc>;
  /** As getWaiting, then 409 unless the session has ended. */
  getEnded(orgId: string, agentId: string, id: string, wait: number | undefined, signal: AbortSignal): Promise<SessionDoc>;
  /**
   * A session's log: the stored one once it has ended, else the sandbox host's (409 while it has
   * no sandbox yet, or while it is ending).
   */
  readLog(s: SessionDoc): Promise<SessionLogDoc | null>;
  /** Follows a running session's output to `out` until it ends (see followLog). */
  followLog(s: SessionDoc, stream: LogStream, ndjson: boolean, out: LogWriter): Promise<void>;
  /** Ends a session: cancels its workflow and waits up to 15 s; returns it as it is then. */
  end(orgId: string, agentId: string, id: string): Promise<SessionDoc>;
}

export function createSessionService(deps: ServiceDeps, agents: Pick<AgentService, 'get' | 'getToRun'>): SessionService {
  const get = async (orgId: string, agentId: string, id: string): Promise<SessionDoc> => {
    const s = await readSession(deps.store, id);
    if (!s || s.orgId !== orgId || s.agent_id !== agentId) throw notFound(`session ${id}`);
    return s;
  };

  /** Starts the session's workflow; starting one that already exists is not an error. */
  const startWorkflow = async (s: SessionDoc, agent: AgentDoc): Promise<void> => {
    const args: SessionWorkflowArgs = {
      sessionId: s._id,
      orgId: s.orgId,
      agentId: s.agent_id,
      run: runSpecOf(agent, deps.secrets),
      // A small input travels with the workflow (one MongoDB read less per session, and visible in the Temporal UI).
      ...(s.input.length <= INLINE_INPUT_MAX ? { input: s.input } : {}),
    };
    if (agent.snapshot) args.run.snapshotRef = await snapshotRefOf(deps, s.orgId, agent.snapshot);
    const hook = s.webhook ?? agent.webhook;
    if (hook) args.run.webhook = webhookSpec(hook, deps.cfg);
    await startWorkflowOnce(deps.temporal, 'sessionWorkflow', {
      taskQueue: deps.cfg.TASK_QUEUE,
      workflowId: s._id,
      staticSummary: sessionSummary(s.agent_id, s._id),
      args: [args],
      typedSearchAttributes: [
        { key: AGENT_ID, value: s.agent_id },
        { key: SESSION_STATUS, value: 'creating' },
        { key: ORG_ID, value: s.orgId },
      ],
    });
  };

  /** The sandbox host running a session: the one that claimed its latest run (several hosts), else the only one. */
  const sessionHostClient = async (sessionId: string): Promise<HostClient> => {
    const hostId = await sessionHostOf(deps.store, sessionId);
    return hostId ? deps.hosts.get(hostId) : (await deps.hosts.pick()).client;
  };

  const getWaiting = async (orgId: string, agentId: string, id: string, wait: number | undefined, signal: AbortSignal): Promise<SessionDoc> => {
    if (!wait) return get(orgId, agentId, id);
    // A session this process created needs no read before the wait: its organisation is known, and
    // the wait returns at once when the workflow has closed already.
    const known = knownCreation(deps.store, id);
    if (!known || known.orgId !== orgId || known.agent_id !== agentId) {
      const s = await get(orgId, agentId, id);
      if (TERMINAL.has(s.status)) return s;
    }
    // Timed out, caller gone, or the workflow failed or is unknown: the stored state says which.
    await waitForClose(deps.temporal, id, wait * 1000, signal);
    return get(orgId, agentId, id);
  };

  return {
    async create(orgId, agentId, body, key) {
      if (body.webhook) await assertWebhookTarget(deps.cfg, body.webhook.url, 'body.webhook.url');
      const agent = await agents.getToRun(orgId, agentId);
      const doc: SessionDoc = newSessionDoc({
        _id: key ? `sess_${derivedId(orgId, 'session', key)}` : `sess_${randomId()}`,
        orgId,
        agent_id: agent.id,
        input: JSON.stringify(body.input),
        metadata: JSON.stringify(body.metadata),
        idempotency_key: key ?? null,
        ...(body.webhook ? { webhook: sealWebhook(deps.secrets, orgId, body.webhook) } : {}),
        created_at: new Date(),
      });
      try {
        await insertSession(deps.store, doc);
      } catch (err) {
        if (!key || !isDuplicateKey(err)) throw err;
        const existing = await readSession(deps.store, doc._id);
        if (!existing) throw err;
        if (existing.agent_id !== agent.id) throw conflict('Idempotency-Key was already used for a session of another agent');
        await listSession(deps.store, existing);
        // The first request may have died between storing and starting: make sure it runs.
        if (existing.status === 'creating') await startWorkflow(existing, agent);
        return { session: existing, created: false };
      }
      try {
        await startWorkflow(doc, agent);
      } catch (err) {
        await deleteSession(deps.store, doc);
        if (err instanceof ApiError) throw err;
        throw new ApiError('unavailable', `could not start the session workflow: ${(err as Error).message}`);
      }
      rememberCreated(deps.store, doc);
      return { session: doc, created: true };
    },

    async list(orgId, agentId, q) {
      await agents.get(orgId, agentId);
      // A session's status lives in its progress and result records, so the status filter is
      // applied after reading them, a chunk of creation records at a time.
      const page: SessionDoc[] = [];
      let cursor = q.cursor;
      let more = true;
      let scanned = 0;
      const size = q.status ? LIST_CHUNK : q.limit + 1;
      while (page.length < q.limit && more && scanned < LIST_SCAN_LIMIT) {
        const chunk = await sessionCreationsAfter(deps.store, orgId, agentId, cursor, size);
        more = chunk.next !== undefined;
        scanned += size;
        const sessions = await readSessions(deps.store, chunk.docs);
        for (const [i, s] of sessions.entries()) {
          if (q.status && s.status !== q.status) continue;
          page.push(s);
          if (page.length === q.limit) {
            // The page is full: the next one starts after this session (if anything follows it).
            more = more || i < sessions.length - 1;
            cursor = encodeCursor({ t: s.created_at.toISOString(), id: s._id });
            break;
          }
        }
        if (page.length < q.limit) cursor = chunk.next;
      }
      return { sessions: page, next_cursor: more ? (cursor ?? null) : null };
    },

    get,
    getWaiting,

    async getEnded(orgId, agentId, id, wait, signal) {
      const s = await getWaiting(orgId, agentId, id, wait, signal);
      if (!TERMINAL.has(s.status)) throw conflict(`session ${s._id} is still ${s.status}; its result is not available yet`);
      return s;
    },

    async readLog(s) {
      if (TERMINAL.has(s.status)) return readSessionLog(deps.store, s._id);
      // While it runs, the log is on the sandbox host that runs it.
      if (!s.sandbox_id) throw conflict(`session ${s._id} is still ${s.status}: it has no output yet`);
      const client = await sessionHostClient(s._id);
      try {
        return sessionLogDoc(s._id, await client.entrypointLog(s.sandbox_id, deps.cfg.SESSION_LOG_MAX_BYTES || 1));
      } catch (err) {
        const e = err as { status?: number };
        if (e.status === 404) throw conflict(`session ${s._id} is ending: ask again in a moment`);
        throw err;
      }
    },

    /**
     * Writes what is already there, then what comes, and ends when the session has ended and its
     * stored log is written out. New output is read from the sandbox host (the sandbox's id derives
     * from the session's, so even a session still creating is followed without reading MongoDB);
     * each step waits on the host for the entrypoint's exit for up to FOLLOW_POLL_MS. After the exit
     * it waits for the session's workflow to close (one long poll on Temporal), then writes what the
     * stored log has beyond what was sent (chunks carry their offsets in their stream): nothing is
     * lost or written twice at the end.
     */
    async followLog(s, stream, ndjson, out) {
      const sent = { stdout: 0, stderr: 0 };
      const partial = { stdout: '', stderr: '' };
      const emit = (k: 'stdout' | 'stderr', offset: number, data: Buffer, at: number | null) => {
        const skip = Math.max(0, sent[k] - offset);
        if (skip >= data.length) return;
        const fresh = data.subarray(skip);
        sent[k] = offset + data.length;
        if (stream !== 'all' && stream !== k) return;
        if (!ndjson) {
          out.write(fresh);
          return;
        }
        const text = partial[k] + fresh.toString('utf8');
        const lines = text.split('\n');
        partial[k] = lines.pop() ?? '';
        for (const line of lines) out.write(`${JSON.stringify({ stream: k, time: at === null ? null : new Date(at).toISOString(), line })}\n`);
      };
      const sandboxId = sandboxIdForSession(s._id);
      const client = await sessionHostClient(s._id);
      const readHost = async (): Promise<boolean> => {
        try {
          const log = await client.entrypointLog(sandboxId, deps.cfg.SESSION_LOG_MAX_BYTES || 1, sent);
          for (const c of log.chunks) emit(c.stream, c.offset, Buffer.from(c.data, 'base64'), c.at);
          return true;
        } catch {
          return false; // not created yet, or gone already
        }
      };
      while (!out.closed) {
        let st;
        try {
          st = await client.entrypointStatus(sandboxId, { waitMs: FOLLOW_POLL_MS });
        } catch {
          st = null;
        }
        await readHost();
        if (st?.state === 'exited' || (!st && (await waitForClose(deps.temporal, s._id, FOLLOW_POLL_MS)))) break;
        // A sandbox whose entrypoint is not started yet answers at once: wait before asking again.
        if (st?.state === 'none') await new Promise((r) => setTimeout(r, FOLLOW_POLL_MS));
      }
      if (!out.closed) await waitForClose(deps.temporal, s._id, 60_000);
      if (!out.closed) {
        const stored = await readSessionLog(deps.store, s._id);
        for (const c of stored?.chunks ?? []) {
          if (c.o !== undefined) emit(c.s, c.o, Buffer.from(c.d, 'utf8'), c.t ? c.t.getTime() : null);
        }
        for (const k of ['stdout', 'stderr'] as const) {
          if (ndjson && partial[k] && (stream === 'all' || stream === k)) out.write(`${JSON.stringify({ stream: k, time: null, line: partial[k] })}\n`);
        }
      }
      out.end();
    },

    async end(orgId, agentId, id) {
      const s = await get(orgId, agentId, id);
      if (TERMINAL.has(s.status)) return s;
      const found = await endWorkflowAndWait(deps.temporal, s._id, (h) => h.cancel());
      if (!found) {
        // No workflow was ever started for it: end the record here.
        await recordSessionEnd(deps.store, s._id, {
          status: 'failed',
          result: null,
          outcome: { reason: 'cancelled', exit_code: null, message: 'session ended by request' },
        });
      }
      return get(orgId, agentId, id);
    },
  };
}
