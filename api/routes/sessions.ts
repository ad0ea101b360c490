import { z } from 'zod';
import type { Response } from 'express';
import type { RouteTable } from '../http';
import { idempotencyKeyOf } from '../idempotency';
import { CreateSessionBody, Cursor, Limit, WaitSeconds, Session, SessionParams, SessionResult, SessionStatusEnum, AgentParams } from '../../contract/schemas';
import { sessionResultView, sessionView } from '../../services/views';
import { isTerminal, type LogStream, type LogWriter, type SessionLogDoc, type SessionService } from '../../services/sessions/sessions';
import { LogsQuery } from '../../contract/schemas';

/**
 * Writes a session's log: text/plain (the output as it was printed) by default, or NDJSON, one
 * `{ stream, time, line }` per line, when the caller accepts application/x-ndjson. Whether the kept
 * part starts after the beginning is said in `X-SAP-Log-Truncated` (the streams cut) and each
 * stream's whole size in `X-SAP-Log-Bytes`.
 */
function sendLog(ndjson: boolean, stream: LogStream, log: SessionLogDoc | null, res: Response): void {
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
/** Aborts when the caller goes away (the response closes). */
function abortOnClose(res: Response): AbortSignal {
  const abort = new AbortController();
  res.on('close', () => abort.abort());
  return abort.signal;
}

/** The response as a LogWriter: a chunked text/plain or NDJSON answer, closed when the caller goes away. */
function logWriter(res: Response, ndjson: boolean): LogWriter {
  let closed = false;
  res.on('close', () => (closed = true));
  res.status(200).type(ndjson ? 'application/x-ndjson' : 'text/plain; charset=utf-8');
  res.setHeader('Cache-Control', 'no-store');
  res.flushHeaders();
  return {
    write: (chunk) => void res.write(chunk),
    end: () => void res.end(),
    get closed() {
      return closed;
    },
  };
}

/** /v1/agents/{agentId}/sessions: create, list, read, result, end. */
export function registerSessionRoutes(t: RouteTable, sessions: SessionService): void {
  t.add({
    method: 'post',
    path: '/v1/agents/:agentId/sessions',
    tag: 'sessions',
    summary: 'Start a session: one sandbox runs the agent on the input. Send Idempotency-Key to make retries safe.',
    params: AgentParams,
    body: CreateSessionBody,
    responses: {
      201: { description: 'The session, status creating', schema: Session },
      200: { description: 'The session an earlier request with the same Idempotency-Key created', schema: Session },
    },
    errors: [409, 413],
    handler: async ({ params, body, org, req, res }) => {
      const key = idempotencyKeyOf(req);
      const { session, created } = await sessions.create(org.id, params.agentId, body, key);
      res.status(created ? 201 : 200).json(sessionView(session));
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
      const { sessions: page, next_cursor } = await sessions.list(org.id, params.agentId, query);
      res.json({ sessions: page.map(sessionView), next_cursor });
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
      res.json(sessionView(await sessions.getWaiting(org.id, params.agentId, params.id, query.wait, abortOnClose(res))));
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
      const s = await sessions.getEnded(org.id, params.agentId, params.id, query.wait, abortOnClose(res));
      res.json(sessionResultView(s));
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
      const s = await sessions.get(org.id, params.agentId, params.id);
      const ndjson = /application\/x-ndjson/.test(req.headers.accept ?? '');
      if (query.follow && !isTerminal(s)) return sessions.followLog(s, query.stream, ndjson, logWriter(res, ndjson));
      const log = await sessions.readLog(s);
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
      res.json(sessionView(await sessions.end(org.id, params.agentId, params.id)));
    },
  });
}
