import { z } from 'zod';
import { sessionSummary } from '../../workflows/summary';
import type { Response } from 'express';
import { WorkflowExecutionAlreadyStartedError, WorkflowNotFoundError } from '@temporalio/client';
import { WorkflowIdReusePolicy } from '@temporalio/common';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import { CreateSessionBody, Cursor, Limit, WaitSeconds, Session, SessionParams, SessionResult, SessionStatusEnum, AgentParams } from '../../contract/schemas';
import { ApiError, conflict, invalid, notFound } from '../../lib/errors';
import { derivedId, randomId } from '../../lib/ids';
import { AgentDoc, fromJsonText, isDuplicateKey, runSpecOf, SessionDoc } from '../../store';
import { knownCreation, readSession, readSessions, recordSessionEnd, rememberCreated, sessionHostOf } from '../../store/sessions';
import type { HostClient } from '../../sandbox';
import { getAgent, getAgentToRun } from './agents';
import { sessionLogDoc, sessionLogsOf, type SessionLogDoc } from '../../store/session-logs';
import { sandboxIdForSession } from '../../lib/naming';
import { assertWebhookTarget, sealWebhook, webhookSpec } from '../../lib/webhooks';
import { snapshotRefOf } from './snapshots';
import { afterCursor, encodeCursor } from '../cursor';
import type { SessionWorkflowArgs } from '../../workflows/session';
import { AGENT_ID, ORG_ID, SESSION_STATUS } from '../../workflows/search-attributes';

/** The public form of a session (2.1), plus `outcome` once it has ended. */
export function sessionView(s: SessionDoc): z.infer<typeof Session> {
  return {
    id: s._id,
    agent_id: s.agent_id,
    status: s.status,
    input: fromJsonText(s.input) ?? {},
    result: fromJsonText(s.result),
    preview_url: s.preview_url,
    metadata: fromJsonText(s.metadata) ?? {},
    outcome: s.outcome,
    created_at: s.created_at.toISOString(),
    updated_at: s.updated_at.toISOString(),
  };
}

const TERMINAL = new Set(['completed', 'failed']);

const LogsQuery = z.object({
  stream: z.enum(['stdout', 'stderr', 'all']).default('all').describe('Which output (default all: both, interleaved as written)'),
  follow: z
    .enum(['true', 'false', '1', '0'])
    .default('false')
    .transform((v) => v === 'true' || v === '1')
    .describe('Stream the output while the session runs (chunked), ending when the session ends'),
});

/** How often a follow asks the sandbox host for new output (its wait for the entrypoint's exit paces it). */
const FOLLOW_POLL_MS = 500;

/**
 * Follows a session's output (`?follow=true`): writes what is already there, then what comes, as a
 * chunked response, and ends when the session has ended and its stored log is written out. New
 * output is read from the sandbox host (the sandbox's id derives from the session's, so even a
 * session still creating is followed without reading MongoDB); each step waits on the host for the
 * entrypoint's exit for up to FOLLOW_POLL_MS. After the exit it waits for the session's workflow
 * to close (one long poll on Temporal), then writes what the stored log has beyond what was sent
 * (chunks carry their offsets in their stream): nothing is lost or written twice at the end.
 */
async function followLog(deps: ApiDeps, s: SessionDoc, stream: 'stdout' | 'stderr' | 'all', ndjson: boolean, res: Response): Promise<void> {
  const sent = { stdout: 0, stderr: 0 };
  const partial = { stdout: '', stderr: '' };
  let closed = false;
  res.on('close', () => (closed = true));
  res.status(200).type(ndjson ? 'application/x-ndjson' : 'text/plain; charset=utf-8');
  res.setHeader('Cache-Control', 'no-store');
  res.flushHeaders();
  const emit = (s: 'stdout' | 'stderr', offset: number, data: Buffer, at: number | null) => {
    const skip = Math.max(0, sent[s] - offset);
    if (skip >= data.length) return;
    const fresh = data.subarray(skip);
    sent[s] = offset + data.length;
    if (stream !== 'all' && stream !== s) return;
    if (!ndjson) {
      res.write(fresh);
      return;
    }
    const text = partial[s] + fresh.toString('utf8');
    const lines = text.split('\n');
    partial[s] = lines.pop() ?? '';
    for (const line of lines) res.write(`${JSON.stringify({ stream: s, time: at === null ? null : new Date(at).toISOString(), line })}\n`);
  };
  const sandboxId = sandboxIdForSession(s._id);
  const handle = deps.temporal.workflow.getHandle(s._id);
  const client = await sessionHostClient(deps, s._id);
  const readHost = async (): Promise<boolean> => {
    try {
      const log = await client.entrypointLog(sandboxId, deps.cfg.SESSION_LOG_MAX_BYTES || 1, sent);
      for (const c of log.chunks) emit(c.stream, c.offset, Buffer.from(c.data, 'base64'), c.at);
      return true;
    } catch {
      return false; // not created yet, or gone already
    }
  };
  /** Waits up to `ms` for the session's workflow to close; true when it has. */
  const ended = async (ms: number): Promise<boolean> => {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), ms);
    try {
      await deps.temporal.withAbortSignal(abort.signal, () => handle.result());
      return true;
    } catch (err) {
      return !abort.signal.aborted || err instanceof WorkflowNotFoundError;
    } finally {
      clearTimeout(timer);
    }
  };
  while (!closed) {
    let st;
    try {
      st = await client.entrypointStatus(sandboxId, { waitMs: FOLLOW_POLL_MS });
    } catch {
      st = null;
    }
    await readHost();
    if (st?.state === 'exited' || (!st && (await ended(FOLLOW_POLL_MS)))) break;
    // A sandbox whose entrypoint is not started yet answers at once: wait before asking again.
    if (st?.state === 'none') await new Promise((r) => setTimeout(r, FOLLOW_POLL_MS));
  }
  if (!closed) await ended(60_000);
  if (!closed) {
    const stored = await sessionLogsOf(deps.store).findOne({ _id: s._id });
    for (const c of stored?.chunks ?? []) {
      if (c.o !== undefined) emit(c.s, c.o, Buffer.from(c.d, 'utf8'), c.t ? c.t.getTime() : null);
    }
    for (const k of ['stdout', 'stderr'] as const) {
      if (ndjson && partial[k] && (stream === 'all' || stream === k)) res.write(`${JSON.stringify({ stream: k, time: null, line: partial[k] })}\n`);
    }
  }
  res.end();
}

/**
 * Writes a session's log: text/plain (the output as it was printed) by default, or NDJSON, one
 * `{ stream, time, line }` per line, when the caller accepts application/x-ndjson. Whether the kept
 * part starts after the beginning is said in `X-SAP-Log-Truncated` (the streams cut) and each
 * stream's whole size in `X-SAP-Log-Bytes`.
 */
function sendLog(ndjson: boolean, stream: 'stdout' | 'stderr' | 'all', log: SessionLogDoc | null, res: Response): void {
  const chunks = (log?.chunks ?? []).filter((c) => stream === 'all' || c.s === stream);
  const cut = (['stdout', 'stderr'] as const).filter((k) => (stream === 'all' || stream === k) && log?.truncated[k]);
  res.setHeader('X-SAP-Log-Truncated', cut.join(',') || 'none');
  res.setHeader('X-SAP-Log-Bytes', `stdout=${log?.bytes.stdout ?? 0},stderr=${log?.bytes.stderr ?? 0}`);
  if (ndjson) {
    res.type('application/x-ndjson');
    const lines: string[] = [];
    for (const c of chunks) {
      const parts = c.d.split('\n');
      if (parts[parts.length - 1] === '') parts.pop();
      for (const line of parts) lines.push(JSON.stringify({ stream: c.s, time: c.t ? c.t.toISOString() : null, line }));
    }
    res.send(lines.length ? `${lines.join('\n')}\n` : '');
    return;
  }
  res.type('text/plain; charset=utf-8').send(chunks.map((c) => c.d).join(''));
}
/** Listing reads creation records in chunks of this many, and at most this many per request. */
const LIST_CHUNK = 100;
const LIST_SCAN_LIMIT = 2000;
const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,255}$/;

/** Reads a session of the caller's organisation and agent, or throws 404. */
async function getSession(deps: ApiDeps, orgId: string, agentId: string, id: string): Promise<SessionDoc> {
  const s = await readSession(deps.store, id);
  if (!s || s.orgId !== orgId || s.agent_id !== agentId) throw notFound(`session ${id}`);
  return s;
}

/**
 * With `wait` seconds, answers once the session has ended or the time is up, whichever comes
 * first. The wait is one long poll on the session workflow's close event in Temporal (no polling
 * of MongoDB), ended early when the caller goes away; the answer is read from MongoDB as usual.
 */
async function getSessionWaiting(deps: ApiDeps, orgId: string, agentId: string, id: string, wait: number | undefined, res: Response): Promise<SessionDoc> {
  if (!wait) return getSession(deps, orgId, agentId, id);
  // A session this process created needs no read before the wait: its organisation is known, and
  // the wait returns at once when the workflow has closed already.
  const known = knownCreation(deps.store, id);
  if (!known || known.orgId !== orgId || known.agent_id !== agentId) {
    const s = await getSession(deps, orgId, agentId, id);
    if (TERMINAL.has(s.status)) return s;
  }
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), wait * 1000);
  const gone = () => abort.abort();
  res.on('close', gone);
  try {
    await deps.temporal.withAbortSignal(abort.signal, () => deps.temporal.workflow.getHandle(id).result());
  } catch {
    // Timed out, caller gone, or the workflow failed or is unknown: the stored state says which.
  } finally {
    clearTimeout(timer);
    res.off('close', gone);
  }
  return getSession(deps, orgId, agentId, id);
}

/** Inputs up to this many characters of JSON go in the workflow's arguments; larger ones stay in MongoDB only. */
const INLINE_INPUT_MAX = 4096;

/** Starts the session's workflow; starting one that already exists is not an error. */
async function startWorkflow(deps: ApiDeps, s: SessionDoc, agent: AgentDoc): Promise<void> {
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
  try {
    await deps.temporal.workflow.start('sessionWorkflow', {
      taskQueue: deps.cfg.TASK_QUEUE,
      workflowId: s._id,
      staticSummary: sessionSummary(s.agent_id, s._id, s.input),
      args: [args],
      workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
      typedSearchAttributes: [
        { key: AGENT_ID, value: s.agent_id },
        { key: SESSION_STATUS, value: 'creating' },
        { key: ORG_ID, value: s.orgId },
      ],
    });
  } catch (err) {
    if (err instanceof WorkflowExecutionAlreadyStartedError) return;
    throw err;
  }
}

/** The sandbox host running a session: the one that claimed its latest run (several hosts), else the only one. */
async function sessionHostClient(deps: ApiDeps, sessionId: string): Promise<HostClient> {
  const hostId = await sessionHostOf(deps.store, sessionId);
  return hostId ? deps.hosts.get(hostId) : (await deps.hosts.pick()).client;
}

/** /v1/agents/{agentId}/sessions: create, list, read, result, end. */
export function registerSessionRoutes(t: RouteTable, deps: ApiDeps): void {
  t.add({
    method: 'post',
    path: '/v1/agents/:agentId/sessions',
    tag: 'sessions',
    summary: 'Start a session: one sandbox runs the agent on the input. Send Idempotency-Key to make retries safe.',
    params: AgentParams,
    body: CreateSessionBody,
    responses: { 201: { description: 'The session, status creating', schema: Session }, 200: { description: 'The session an earlier request with the same Idempotency-Key created', schema: Session } },
    errors: [409, 413],
    handler: async ({ params, body, org, req, res }) => {
      const key = req.header('idempotency-key');
      if (key !== undefined && !IDEMPOTENCY_KEY.test(key)) throw invalid('header Idempotency-Key: must be 1-255 printable ASCII characters');
      if (body.webhook) await assertWebhookTarget(deps.cfg, body.webhook.url, 'body.webhook.url');
      const agent = await getAgentToRun(deps, org.id, params.agentId);
      const now = new Date();
      const doc: SessionDoc = {
        _id: key ? `sess_${derivedId(org.id, 'session', key)}` : `sess_${randomId()}`,
        orgId: org.id,
        agent_id: agent.id,
        status: 'creating',
        input: JSON.stringify(body.input),
        metadata: JSON.stringify(body.metadata),
        result: null,
        preview_url: null,
        outcome: null,
        sandbox_id: null,
        idempotency_key: key ?? null,
        ...(body.webhook ? { webhook: sealWebhook(deps.secrets, org.id, body.webhook) } : {}),
        created_at: now,
        updated_at: now,
        started_at: null,
        completed_at: null,
      };
      try {
        await deps.store.sessions.insertOne(doc);
      } catch (err) {
        if (!key || !isDuplicateKey(err)) throw err;
        const existing = await readSession(deps.store, doc._id);
        if (!existing) throw err;
        if (existing.agent_id !== agent.id) throw conflict('Idempotency-Key was already used for a session of another agent');
        // The first request may have died between storing and starting: make sure it runs.
        if (existing.status === 'creating') await startWorkflow(deps, existing, agent);
        res.status(200).json(sessionView(existing));
        return;
      }
      try {
        await startWorkflow(deps, doc, agent);
      } catch (err) {
        await deps.store.sessions.deleteOne({ _id: doc._id });
        if (err instanceof ApiError) throw err;
        throw new ApiError('unavailable', `could not start the session workflow: ${(err as Error).message}`);
      }
      rememberCreated(deps.store, doc);
      res.status(201).json(sessionView(doc));
    },
  });

  t.add({
    method: 'get',
    path: '/v1/agents/:agentId/sessions',
    tag: 'sessions',
    summary: 'List sessions, newest first',
    params: AgentParams,
    query: z.object({ status: SessionStatusEnum.optional(), limit: Limit, cursor: Cursor.optional() }),
    responses: { 200: { description: 'A page of sessions', schema: z.object({ sessions: z.array(Session), next_cursor: z.string().nullable() }) } },
    handler: async ({ params, query, org, res }) => {
      await getAgent(deps, org.id, params.agentId);
      // A session's status lives in its progress and result records, so the status filter is
      // applied after reading them, a chunk of creation records at a time.
      const page: SessionDoc[] = [];
      let cursor = query.cursor;
      let more = true;
      let scanned = 0;
      const size = query.status ? LIST_CHUNK : query.limit + 1;
      while (page.length < query.limit && more && scanned < LIST_SCAN_LIMIT) {
        const chunk = await deps.store.sessions
          .find({ orgId: org.id, agent_id: params.agentId, ...afterCursor(cursor) })
          .sort({ created_at: -1, _id: -1 })
          .limit(size)
          .toArray();
        more = chunk.length === size;
        scanned += chunk.length;
        for (const s of await readSessions(deps.store, chunk)) {
          cursor = encodeCursor({ t: s.created_at.toISOString(), id: s._id });
          if (query.status && s.status !== query.status) continue;
          page.push(s);
          if (page.length === query.limit) {
            more = more || chunk[chunk.length - 1]!._id !== s._id;
            break;
          }
        }
      }
      const next = more ? (cursor ?? null) : null;
      res.json({ sessions: page.map(sessionView), next_cursor: next });
    },
  });

  t.add({
    method: 'get',
    path: '/v1/agents/:agentId/sessions/:id',
    tag: 'sessions',
    summary: 'Get a session (served from MongoDB: works while every worker is down). ?wait=N waits up to N s (max 60) for it to end.',
    params: SessionParams,
    query: z.object({ wait: WaitSeconds }),
    responses: { 200: { description: 'The session', schema: Session } },
    handler: async ({ params, query, org, res }) => {
      res.json(sessionView(await getSessionWaiting(deps, org.id, params.agentId, params.id, query.wait, res)));
    },
  });

  t.add({
    method: 'get',
    path: '/v1/agents/:agentId/sessions/:id/result',
    tag: 'sessions',
    summary: "Get a finished session's result: 409 while it is creating or running. ?wait=N waits up to N s (max 60) for it to end.",
    params: SessionParams,
    query: z.object({ wait: WaitSeconds }),
    responses: { 200: { description: 'What the agent wrote to /tmp/agent_result.json (null if nothing), and how it ended', schema: SessionResult } },
    errors: [409],
    handler: async ({ params, query, org, res }) => {
      const s = await getSessionWaiting(deps, org.id, params.agentId, params.id, query.wait, res);
      if (!TERMINAL.has(s.status)) throw conflict(`session ${s._id} is still ${s.status}; its result is not available yet`);
      res.json({
        status: s.status,
        data: fromJsonText(s.result),
        completed_at: (s.completed_at ?? s.updated_at).toISOString(),
        reason: s.outcome?.reason ?? null,
        exit_code: s.outcome?.exit_code ?? null,
        message: s.outcome?.message ?? null,
      });
    },
  });

  t.add({
    method: 'get',
    path: '/v1/agents/:agentId/sessions/:id/logs',
    tag: 'sessions',
    summary:
      "The entrypoint's stdout and stderr, in the order written: the last SESSION_LOG_MAX_BYTES of each, kept after the sandbox is gone. text/plain, or NDJSON ({stream, time, line}) with Accept: application/x-ndjson",
    params: SessionParams,
    query: LogsQuery,
    responses: {
      200: { description: 'The output (empty when the session printed nothing)', schema: z.string(), contentType: 'text/plain' },
    },
    errors: [409],
    handler: async ({ params, query, org, req, res }) => {
      const s = await getSession(deps, org.id, params.agentId, params.id);
      const ndjson = /application\/x-ndjson/.test(req.headers.accept ?? '');
      if (query.follow && !TERMINAL.has(s.status)) return followLog(deps, s, query.stream, ndjson, res);
      let log: SessionLogDoc | null;
      if (TERMINAL.has(s.status)) {
        log = await sessionLogsOf(deps.store).findOne({ _id: s._id });
      } else {
        // While it runs, the log is on the sandbox host that runs it.
        if (!s.sandbox_id) throw conflict(`session ${s._id} is still ${s.status}: it has no output yet`);
        const client = await sessionHostClient(deps, s._id);
        try {
          log = sessionLogDoc(s._id, await client.entrypointLog(s.sandbox_id, deps.cfg.SESSION_LOG_MAX_BYTES || 1));
        } catch (err) {
          const e = err as { status?: number };
          if (e.status === 404) throw conflict(`session ${s._id} is ending: ask again in a moment`);
          throw err;
        }
      }
      sendLog(ndjson, query.stream, log, res);
    },
  });

  t.add({
    method: 'delete',
    path: '/v1/agents/:agentId/sessions/:id',
    tag: 'sessions',
    summary: 'End a session: its workflow is cancelled and its sandbox destroyed; it becomes failed (cancelled)',
    params: SessionParams,
    responses: { 200: { description: 'The session after it ended (unchanged if it had already ended)', schema: Session } },
    handler: async ({ params, org, res }) => {
      const s = await getSession(deps, org.id, params.agentId, params.id);
      if (TERMINAL.has(s.status)) {
        res.json(sessionView(s));
        return;
      }
      const handle = deps.temporal.workflow.getHandle(s._id);
      try {
        await handle.cancel();
        await Promise.race([handle.result().catch(() => undefined), new Promise((r) => setTimeout(r, 15_000).unref())]);
      } catch (err) {
        if (!(err instanceof WorkflowNotFoundError)) throw err;
        // No workflow was ever started for it: end the record here.
        await recordSessionEnd(deps.store, s._id, { status: 'failed', result: null, outcome: { reason: 'cancelled', exit_code: null, message: 'session ended by request' } });
      }
      res.json(sessionView(await getSession(deps, org.id, params.agentId, params.id)));
    },
  });
}
