import { constants as osConstants } from 'node:os';
import type { Socket } from 'node:net';
import type express from 'express';
import type { Request } from 'express';
import { WebSocket } from 'ws';
import { z } from 'zod';
import type { Authenticator } from '../auth';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import { parseOrThrow } from '../http';
import { ApiError, notFound } from '../../lib/errors';
import type { Logger } from '../../lib/logger';
import type { HostClient } from '../../sandbox';
import { writeRawFrame } from '../../sandbox';
import type { ExecSessionInfo } from '../../sandbox';
import { agentSessionsOf, ensureExecIndexes, ExecDoc, execSessionsOf } from '../../store/exec';
import { findOrgSandbox, touchSandbox } from '../../store/sandboxes';
import { SandboxParams } from './sandboxes';

/*
 * Exec sessions: a command started inside a sandbox, kept by the sandbox host (which holds the
 * process, its scrollback and its WebSocket clients), recorded here in MongoDB. The API relays
 * every public WebSocket client to the host through a socket of its own, so each public client is
 * exactly one host client and `attachedClients` (read from the host) counts them.
 *
 * Defaults: `timeout` none (the command runs until it exits or is killed); `maxRunAfterDisconnect`
 * none (the command outlives every client). `exec/run` waits at most `timeout` seconds, default 60.
 */

const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');
const MAX_SECONDS = 30 * 24 * 3600;

export const ExecSessionParams = SandboxParams.extend({
  sessionID: z.string().regex(/^es-[a-z0-9]{1,64}$/, 'must be an exec session id (es-…)'),
});

export const CreateExecBody = z
  .object({
    cmd: z.string().min(1).max(4096),
    args: z.array(z.string().max(128 * 1024)).max(4096).default([]),
    envs: z.record(EnvName, z.string().max(128 * 1024)).default({}),
    cwd: z.string().startsWith('/', 'must be an absolute path').max(4096).optional(),
    timeout: z.number().int().positive().max(MAX_SECONDS).optional().describe('Seconds before the command is killed; default none'),
    maxRunAfterDisconnect: z
      .number()
      .int()
      .min(0)
      .max(MAX_SECONDS)
      .optional()
      .describe('Seconds the command keeps running after its last client detached; default none (it keeps running)'),
  })
  .openapi('CreateExecSession');

export const RunExecBody = CreateExecBody.omit({ maxRunAfterDisconnect: true })
  .extend({
    timeout: z.number().int().positive().max(3600).default(60).describe('Seconds before the command is killed; default 60'),
    stdin: z.string().max(1024 * 1024).optional(),
  })
  .openapi('RunExec');

export const KillBody = z
  .object({ signal: z.union([z.string().max(16), z.number().int().min(1).max(64)]).optional().describe('Name (SIGTERM) or number; default SIGKILL') })
  .default({});

export const ExecSessionView = z
  .object({
    sessionID: z.string(),
    sandboxID: z.string(),
    command: z.string(),
    args: z.array(z.string()),
    running: z.boolean(),
    exitCode: z.number().int().nullable(),
    startedAt: z.string(),
    exitedAt: z.string().nullable(),
    attachedClients: z.number().int(),
    oomKilled: z
      .boolean()
      .optional()
      .describe("Once exited: whether the sandbox's memory limit made the kernel kill a process of it while the command ran (present when the host reports it)"),
  })
  .openapi('ExecSession');

export const RunResultView = z
  .object({
    exitCode: z.number().int(),
    stdout: z.string(),
    stderr: z.string(),
    oomKilled: z.literal(true).optional().describe("Present (true) when the sandbox's memory limit made the kernel kill a process while the command ran"),
    truncated: z
      .literal(true)
      .optional()
      .describe('Present (true) when stdout or stderr printed more than EXEC_RUN_OUTPUT_MAX_BYTES (default 1 MiB): each holds its first bytes only'),
  })
  .openapi('ExecRunResult');

type View = z.infer<typeof ExecSessionView>;

/** A sandbox's owner and host never change, so they are cached (the host says whether it is running). */
const owners = new Map<string, { orgId: string; hostId: string }>();

/**
 * The organisation's sandbox and its host client, or 404 (another organisation's sandbox is 404).
 * Marks the sandbox used (resets its idle timeout) without waiting for the write.
 */
export async function sandboxHost(deps: ApiDeps, orgId: string, sandboxId: string): Promise<HostClient> {
  let owner = owners.get(sandboxId);
  if (!owner) {
    const doc = await findOrgSandbox(deps.store, orgId, sandboxId);
    if (!doc) throw notFound(`sandbox ${sandboxId}`);
    owner = { orgId: doc.orgId, hostId: doc.hostId };
    if (owners.size > 10_000) owners.clear();
    owners.set(sandboxId, owner);
  }
  if (owner.orgId !== orgId) throw notFound(`sandbox ${sandboxId}`);
  touchSandbox(deps.store, sandboxId).catch((err: unknown) => deps.logger.warn({ err, sandboxId }, 'touchSandbox failed'));
  return deps.hosts.get(owner.hostId);
}

/** Maps a host failure to the API's vocabulary. */
export function fromHostError(err: unknown, what: string): ApiError {
  if (err instanceof ApiError) return err;
  const e = err as { name?: string; type?: string; message?: string; status?: number };
  if (e?.name === 'HostError') {
    if (e.type === 'not_found') return new ApiError('not_found', e.message ?? `${what} not found`);
    if (e.type === 'conflict') return new ApiError('conflict', e.message ?? `${what}: conflict`);
    if (e.type === 'invalid_request') return new ApiError('invalid_request', e.message ?? 'invalid request');
    if (e.type === 'payload_too_large') return new ApiError('payload_too_large', e.message ?? 'too large');
    if (e.type === 'unavailable') return new ApiError('unavailable', e.message ?? `${what}: the sandbox host is busy; retry`);
    if (e.type === 'rate_limited') return new ApiError('rate_limited', e.message ?? 'too many');
    return new ApiError('bad_gateway', `sandbox host failed: ${e.message ?? 'unknown error'}`);
  }
  return new ApiError('unavailable', `sandbox host unreachable: ${e?.message ?? String(err)}`);
}

/** The host's live state of an exec session; null once the host no longer knows it. */
export async function liveExec(host: HostClient, sandboxId: string, execId: string): Promise<ExecSessionInfo | null> {
  try {
    return await host.getExec(sandboxId, execId);
  } catch (err) {
    if ((err as { name?: string; status?: number }).name === 'HostError' && (err as { status: number }).status === 404) return null;
    throw fromHostError(err, `exec session ${execId}`);
  }
}

/** The host's live exec sessions of a sandbox by id; empty when the host no longer knows the sandbox. */
export async function liveExecsOf(host: HostClient, sandboxId: string): Promise<Map<string, ExecSessionInfo>> {
  const live = await host.listExec(sandboxId).catch((err: unknown) => {
    if ((err as { status?: number }).status === 404) return [] as ExecSessionInfo[];
    throw fromHostError(err, `sandbox ${sandboxId}`);
  });
  return new Map(live.map((i) => [i.sessionID, i]));
}

const recordedExits = new Set<string>();
const recordedOom = new Set<string>();

/**
 * Sets `fields` in a session's record once per session per process (`seen` remembers which; a failed
 * write is forgotten so that the next look retries). `kind` picks the collection.
 */
async function recordOnce(deps: ApiDeps, kind: 'exec' | 'agent', id: string, seen: Set<string>, fields: Record<string, unknown>): Promise<void> {
  if (seen.has(id)) return;
  if (seen.size > 100_000) seen.clear();
  seen.add(id);
  const coll = kind === 'exec' ? execSessionsOf(deps.store) : agentSessionsOf(deps.store);
  try {
    await (coll as ReturnType<typeof execSessionsOf>).updateOne({ _id: id }, { $set: fields });
  } catch (err) {
    seen.delete(id);
    deps.logger.warn({ err, id }, 'could not record an exec exit');
  }
}

/** Stores an exit (and oomKilled when known) in the record, once per session per process. */
export function recordExit(
  deps: ApiDeps,
  kind: 'exec' | 'agent',
  id: string,
  exitCode: number | null,
  exitedAt: Date,
  oomKilled?: boolean,
): Promise<void> {
  return recordOnce(deps, kind, id, recordedExits, { exitedAt, exitCode, ...(oomKilled !== undefined ? { oomKilled } : {}) });
}

/** Live fields of a session from the host's answer, or from the record when the host forgot it. */
export function liveFields(
  info: ExecSessionInfo | null,
  rec: { exitCode: number | null; exitedAt: Date | null; oomKilled?: boolean },
): { running: boolean; exitCode: number | null; exitedAt: string | null; attachedClients: number; oomKilled?: boolean } {
  if (info) {
    const oomKilled = info.oomKilled ?? rec.oomKilled;
    return {
      running: info.running,
      exitCode: info.exitCode,
      exitedAt: info.exitedAt ?? (info.running ? null : (rec.exitedAt?.toISOString() ?? null)),
      attachedClients: info.attachedClients,
      ...(oomKilled !== undefined ? { oomKilled } : {}),
    };
  }
  return {
    running: false,
    exitCode: rec.exitCode,
    exitedAt: rec.exitedAt?.toISOString() ?? null,
    attachedClients: 0,
    ...(rec.oomKilled !== undefined ? { oomKilled: rec.oomKilled } : {}),
  };
}

/**
 * Persists an exit the host reports (or the host's loss of the session) if the record lacks it; and
 * the host's oomKilled when the exit was recorded without it (from the WebSocket's exit frame).
 */
export function noteExit(deps: ApiDeps, kind: 'exec' | 'agent', id: string, info: ExecSessionInfo | null, rec: { exitedAt: Date | null; oomKilled?: boolean }): void {
  if (info && info.running) return;
  if (rec.exitedAt) {
    if (info?.oomKilled !== undefined && rec.oomKilled === undefined) void recordOnce(deps, kind, id, recordedOom, { oomKilled: info.oomKilled });
    return;
  }
  const at = info?.exitedAt ? new Date(info.exitedAt) : new Date();
  void recordExit(deps, kind, id, info ? info.exitCode : null, at, info?.oomKilled);
}

function view(doc: ExecDoc, info: ExecSessionInfo | null): View {
  return {
    sessionID: doc._id,
    sandboxID: doc.sandboxId,
    command: doc.command,
    args: doc.args,
    startedAt: doc.startedAt.toISOString(),
    ...liveFields(info, doc),
  };
}

async function orgExec(deps: ApiDeps, orgId: string, sandboxId: string, id: string): Promise<ExecDoc> {
  const doc = await execSessionsOf(deps.store).findOne({ _id: id });
  if (!doc || doc.orgId !== orgId || doc.sandboxId !== sandboxId) throw notFound(`exec session ${id}`);
  return doc;
}

/** A signal name the host accepts (SIGTERM), from a name with or without SIG, or a number. */
export function signalName(signal: string | number | undefined): string | undefined {
  if (signal === undefined) return undefined;
  const table = osConstants.signals as Record<string, number>;
  if (typeof signal === 'number') {
    const name = Object.keys(table).find((k) => table[k] === signal);
    if (!name) throw new ApiError('invalid_request', `body.signal: unknown signal ${signal}`);
    return name;
  }
  const name = signal.toUpperCase().startsWith('SIG') ? signal.toUpperCase() : `SIG${signal.toUpperCase()}`;
  if (!(name in table)) throw new ApiError('invalid_request', `body.signal: unknown signal ${signal}`);
  return name;
}

/** Signals an exec session, then waits up to 2 s for it to exit; returns the host's last answer. */
export async function killAndWait(host: HostClient, sandboxId: string, execId: string, signal: string | undefined): Promise<ExecSessionInfo | null> {
  let info: ExecSessionInfo | null;
  try {
    info = await host.killExec(sandboxId, execId, signal);
  } catch (err) {
    if ((err as { status?: number }).status === 404) return null;
    throw fromHostError(err, `exec session ${execId}`);
  }
  const deadline = Date.now() + 2000;
  while (info?.running && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 20));
    info = await liveExec(host, sandboxId, execId);
  }
  return info;
}

/**
 * Exec sessions this process is starting, per organisation, until their record is written (then the
 * store counts them): counted with the recorded ones against EXEC_SESSIONS_PER_ORG.
 */
const startingByOrg = new Map<string, Set<{ recorded: boolean }>>();

/**
 * How many of the organisation's exec sessions run. The store's records without an exit are
 * counted first; only when they reach `max` are they checked against their hosts (an exit nobody
 * looked at is recorded then), so the count holds across API processes and costs a query normally.
 * A session whose sandbox or host is gone counts as exited.
 */
async function runningExecsOfOrg(deps: ApiDeps, orgId: string, max: number): Promise<number> {
  const coll = execSessionsOf(deps.store);
  const open = await coll.countDocuments({ orgId, exitedAt: null }, { limit: max });
  if (open < max) return open;
  const docs = await coll.find({ orgId, exitedAt: null }, { projection: { _id: 1, sandboxId: 1, exitedAt: 1, oomKilled: 1 } }).toArray();
  const bySandbox = new Map<string, typeof docs>();
  for (const d of docs) bySandbox.set(d.sandboxId, [...(bySandbox.get(d.sandboxId) ?? []), d]);
  let running = 0;
  for (const [sandboxId, list] of bySandbox) {
    let live: Map<string, ExecSessionInfo> | null;
    try {
      live = await liveExecsOf(await sandboxHost(deps, orgId, sandboxId), sandboxId);
    } catch (err) {
      // The sandbox is gone: so are its commands. An unreachable host: not counted, not recorded.
      if (err instanceof ApiError && err.type === 'not_found') live = new Map();
      else continue;
    }
    for (const d of list) {
      const info = live.get(d._id) ?? null;
      if (info?.running) running++;
      else await recordExit(deps, 'exec', d._id, info ? info.exitCode : null, info?.exitedAt ? new Date(info.exitedAt) : new Date(), info?.oomKilled);
    }
  }
  return running;
}

/** Starts an exec session on the sandbox's host and records it (the command is killed if the record fails). */
async function startRecordedExec(deps: ApiDeps, orgId: string, sandboxId: string, body: z.infer<typeof CreateExecBody>): Promise<{ doc: ExecDoc; info: ExecSessionInfo }> {
  const host = await sandboxHost(deps, orgId, sandboxId);
  const max = deps.cfg.EXEC_SESSIONS_PER_ORG;
  const recorded = await runningExecsOfOrg(deps, orgId, max);
  // Read after the count (no await between this and the add): a start whose record the count may
  // include is marked recorded, so it is not counted twice.
  const unrecorded = [...(startingByOrg.get(orgId) ?? [])].filter((s) => !s.recorded).length;
  if (recorded + unrecorded >= max) {
    throw new ApiError('rate_limited', `the organisation already runs ${max} exec sessions (EXEC_SESSIONS_PER_ORG); wait for one to exit or kill one`);
  }
  let starting = startingByOrg.get(orgId);
  if (!starting) startingByOrg.set(orgId, (starting = new Set()));
  const mine = { recorded: false };
  starting.add(mine);
  try {
    return await startAndRecord(deps, host, orgId, sandboxId, body, mine);
  } finally {
    starting.delete(mine);
    if (starting.size === 0) startingByOrg.delete(orgId);
  }
}

async function startAndRecord(
  deps: ApiDeps,
  host: HostClient,
  orgId: string,
  sandboxId: string,
  body: z.infer<typeof CreateExecBody>,
  mine: { recorded: boolean },
): Promise<{ doc: ExecDoc; info: ExecSessionInfo }> {
  let info: ExecSessionInfo;
  try {
    info = await host.createExec(sandboxId, body);
  } catch (err) {
    throw fromHostError(err, `sandbox ${sandboxId}`);
  }
  const doc: ExecDoc = {
    _id: info.sessionID,
    orgId,
    sandboxId,
    command: body.cmd,
    args: body.args,
    startedAt: new Date(info.startedAt),
    exitedAt: null,
    exitCode: null,
  };
  try {
    await execSessionsOf(deps.store).insertOne(doc);
    mine.recorded = true;
  } catch (err) {
    await host.killExec(sandboxId, info.sessionID).catch(() => undefined);
    throw err;
  }
  rememberTarget(doc._id, { orgId, sandboxId, execId: doc._id, kind: 'exec' });
  return { doc, info };
}

/** How long GET …/result waits for a running command before answering `running: true` (the client polls again). */
const RESULT_WAIT_MS = 1000;

export const ExecResultView = z
  .object({
    execId: z.string(),
    running: z.boolean(),
    exitCode: z.number().int().nullable(),
    timedOut: z.boolean().describe('Killed by its timeout'),
    stdout: z.string().describe('The last 1 MiB of its stdout (so far, while running)'),
    stderr: z.string(),
    truncated: z.literal(true).optional().describe('Present (true) when a stream printed more than its last 1 MiB kept here'),
    error: z.string().optional(),
  })
  .openapi('ExecResult');

/** /api/sandboxes/:id/exec: start, list, read, kill, run (the OpenComputer API's shapes). */
export function registerExecRoutes(t: RouteTable, deps: ApiDeps): void {
  ensureExecIndexes(deps.store).catch((err: unknown) => deps.logger.warn({ err }, 'exec indexes not created'));

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/exec',
    tag: 'exec',
    summary: 'Start a command in the sandbox as an exec session; attach with the WebSocket at /api/sandboxes/{id}/exec/{sessionID}',
    params: SandboxParams,
    body: CreateExecBody,
    responses: { 201: { description: 'The running exec session', schema: ExecSessionView } },
    errors: [409, 429, 502, 503],
    handler: async ({ params, body, org, res }) => {
      const { doc, info } = await startRecordedExec(deps, org.id, params.id, body);
      res.status(201).json(view(doc, info));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/exec',
    tag: 'exec',
    summary: "List the sandbox's exec sessions, newest first",
    params: SandboxParams,
    responses: { 200: { description: 'Exec sessions', schema: z.array(ExecSessionView) } },
    handler: async ({ params, org, res }) => {
      const host = await sandboxHost(deps, org.id, params.id);
      const [docs, byId] = await Promise.all([
        execSessionsOf(deps.store).find({ sandboxId: params.id }).sort({ startedAt: -1 }).limit(1000).toArray(),
        liveExecsOf(host, params.id),
      ]);
      const out = docs
        .filter((d) => d.orgId === org.id)
        .map((d) => {
          const info = byId.get(d._id) ?? null;
          noteExit(deps, 'exec', d._id, info, d);
          return view(d, info);
        });
      res.json(out);
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/exec/run',
    tag: 'exec',
    summary: 'Run a short command to completion and return its exit code and output',
    params: SandboxParams,
    body: RunExecBody,
    responses: { 200: { description: 'Exit code and output (a non-zero exit is a result)', schema: RunResultView } },
    errors: [409, 429, 502, 503],
    handler: async ({ params, body, org, res }) => {
      const host = await sandboxHost(deps, org.id, params.id);
      try {
        const r = await host.execRun(params.id, body);
        res.json({ exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr, ...(r.oomKilled ? { oomKilled: true } : {}), ...(r.truncated ? { truncated: true } : {}) });
      } catch (err) {
        throw fromHostError(err, `sandbox ${params.id}`);
      }
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/exec/run-async',
    tag: 'exec',
    summary: 'Start a command to completion in the background; poll GET …/exec/{execId}/result for its exit code and output (the client’s exec.run)',
    params: SandboxParams,
    body: RunExecBody.omit({ stdin: true }),
    responses: { 201: { description: 'The handle to poll', schema: z.object({ execId: z.string(), sessionID: z.string() }) } },
    errors: [409, 429, 502, 503],
    handler: async ({ params, body, org, res }) => {
      const { doc } = await startRecordedExec(deps, org.id, params.id, { ...body, maxRunAfterDisconnect: undefined });
      res.status(201).json({ execId: doc._id, sessionID: doc._id });
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/exec/:sessionID/result',
    tag: 'exec',
    summary: `The exit code and output of an exec session; waits up to ${RESULT_WAIT_MS} ms for a running one to exit first`,
    params: ExecSessionParams,
    responses: { 200: { description: 'running: true until it exits', schema: ExecResultView } },
    errors: [502, 503],
    handler: async ({ params, org, res }) => {
      const host = await sandboxHost(deps, org.id, params.id);
      const doc = await orgExec(deps, org.id, params.id, params.sessionID);
      let r;
      try {
        r = await host.execResult(params.id, doc._id, { waitMs: RESULT_WAIT_MS });
      } catch (err) {
        if ((err as { status?: number }).status === 404) {
          // The host no longer has it (restarted, or the sandbox is gone): what the record says.
          res.json({ execId: doc._id, running: false, exitCode: doc.exitCode, timedOut: false, stdout: '', stderr: '', error: 'its output is no longer kept (the sandbox or its host restarted)' });
          return;
        }
        throw fromHostError(err, `exec session ${doc._id}`);
      }
      noteExit(deps, 'exec', doc._id, r, doc);
      res.json({ execId: doc._id, running: r.running, exitCode: r.exitCode, timedOut: r.timedOut, stdout: r.stdout, stderr: r.stderr, ...(r.truncated ? { truncated: true } : {}) });
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/exec/:sessionID',
    tag: 'exec',
    summary: 'Get an exec session (running, exitCode and attachedClients as of now)',
    params: ExecSessionParams,
    responses: { 200: { description: 'The exec session', schema: ExecSessionView } },
    handler: async ({ params, org, res }) => {
      const host = await sandboxHost(deps, org.id, params.id);
      const doc = await orgExec(deps, org.id, params.id, params.sessionID);
      const info = await liveExec(host, params.id, doc._id);
      noteExit(deps, 'exec', doc._id, info, doc);
      res.json(view(doc, info));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/exec/:sessionID/kill',
    tag: 'exec',
    summary: "Signal an exec session's processes (default SIGKILL); answers once it exited (or after 2 s)",
    params: ExecSessionParams,
    body: KillBody,
    responses: { 200: { description: 'The exec session', schema: ExecSessionView } },
    handler: async ({ params, body, org, res }) => {
      const host = await sandboxHost(deps, org.id, params.id);
      const doc = await orgExec(deps, org.id, params.id, params.sessionID);
      const info = await killAndWait(host, params.id, doc._id, signalName(body.signal));
      noteExit(deps, 'exec', doc._id, info, doc);
      res.json(view(doc, info));
    },
  });
}

/* ------------------------------------------------------------------------------------------------
 * WebSocket attach: /api/sandboxes/:id/exec/:sessionID (es-… or an agent session's as-…).
 * The key comes in X-API-Key or ?api_key=. A refused socket gets one text frame
 * {"error":{type,message}} and is closed with 1008 (policy violation); a bad client frame closes
 * it with 1003; a host failure with 1011. A session with EXEC_ATTACHES_PER_SESSION clients refuses
 * another with type rate_limited (429). A client that reads nothing is closed with 1008 and a reason
 * once more than EXEC_WS_BACKLOG_MAX_BYTES wait for it, or once it has held its stream paused
 * (backpressure) for EXEC_WS_STALL_SECONDS.
 * --------------------------------------------------------------------------------------------- */

const WsParams = SandboxParams.extend({
  sessionID: z.string().regex(/^(es|as)-[a-z0-9]{1,64}$/, 'must be an exec or agent session id (es-… or as-…)'),
});

/** Bytes queued toward one side above which the relay stops reading the other side; resumes below LOW. */
const RELAY_HIGH = 2 * 1024 * 1024;
const RELAY_LOW = 512 * 1024;

/** What a WebSocket attaches to; immutable, so cached. */
export interface AttachTarget {
  orgId: string;
  sandboxId: string;
  execId: string;
  kind: 'exec' | 'agent';
}
const targets = new Map<string, AttachTarget>();

async function attachTarget(deps: ApiDeps, sessionID: string): Promise<(AttachTarget & { exitCode: number | null }) | null> {
  const hit = targets.get(sessionID);
  if (hit) return { ...hit, exitCode: null };
  let t: (AttachTarget & { exitCode: number | null }) | null = null;
  if (sessionID.startsWith('es-')) {
    const d = await execSessionsOf(deps.store).findOne({ _id: sessionID });
    if (d) t = { orgId: d.orgId, sandboxId: d.sandboxId, execId: d._id, kind: 'exec', exitCode: d.exitCode };
  } else {
    const d = await agentSessionsOf(deps.store).findOne({ _id: sessionID });
    if (d) t = { orgId: d.orgId, sandboxId: d.sandboxId, execId: d.execId, kind: 'agent', exitCode: d.exitCode };
  }
  if (t) rememberTarget(sessionID, { orgId: t.orgId, sandboxId: t.sandboxId, execId: t.execId, kind: t.kind });
  return t;
}

/** Caches where a session id attaches (called on creation, so a first attach needs no lookup). */
export function rememberTarget(sessionID: string, t: AttachTarget): void {
  if (targets.size > 10_000) targets.clear();
  targets.set(sessionID, t);
}

/*
 * The public socket comes from express-ws, which bundles ws 7: no pause()/resume() and no
 * isBinary argument on 'message' (text arrives as a string). These work with both ws 7 and 8.
 */
type AnySocket = WebSocket & { _socket?: { pause(): void; resume(): void } };
function pauseSocket(ws: AnySocket): void {
  if (typeof (ws as { pause?: unknown }).pause === 'function') ws.pause();
  else ws._socket?.pause();
}
function resumeSocket(ws: AnySocket): void {
  if (typeof (ws as { resume?: unknown }).resume === 'function') ws.resume();
  else ws._socket?.resume();
}

export function closeWith(ws: WebSocket, code: number, type: string, message: string): void {
  if (ws.readyState !== WebSocket.OPEN) {
    ws.terminate();
    return;
  }
  ws.send(JSON.stringify({ error: { type, message } }));
  ws.close(code, `${type}: ${message}`.slice(0, 120));
  // Read the peer's close frame even if reading was paused (else the close waits for a timeout).
  resumeSocket(ws as AnySocket);
}

type EarlyFrame = [string | Buffer | ArrayBuffer | Buffer[], boolean | undefined];

/**
 * The first output frames wait until the client's connection is this old. The published
 * OpenComputer client sets its message handler only once its `open` event has been handled (it
 * awaits it), so frames that reach it in the same read as the 101 answer are dispatched before the
 * handler exists and lost: the scrollback, its end marker, or a finished session's exit. Holding
 * them briefly puts them in a later read. Costs at most this much on an attach.
 */
const FIRST_FRAME_HOLD_MS = 50;

/**
 * Relays a public client and the host's exec stream for the same session, with backpressure both
 * ways: reading one side pauses while the other side has more than RELAY_HIGH bytes queued.
 *
 * Host → client: the host's frames (unmasked server frames, no extension) are valid as they are
 * on the public socket, so each is written on it unchanged, as views of what was read from the
 * host (no decoding, re-encoding or copy); only the exit frame's code is read, to record it. The
 * frames go on the connection the client's WebSocket was upgraded on (`clientSocket`), whole frames
 * at a time, so they never interleave with what the ws library writes there (pongs, close frames).
 * Client → host: stdin frames are checked (binary, 0x00 first), then sent on, masked.
 *
 * A client that does not read is dropped (close 1008 with a reason): when more than
 * EXEC_WS_BACKLOG_MAX_BYTES are queued toward it, or when the host stream has stayed paused for it
 * EXEC_WS_STALL_SECONDS (else it would keep the command paused and its buffers held for ever).
 */
function relay(
  deps: ApiDeps,
  client: WebSocket,
  clientSocket: Socket,
  host: HostClient,
  target: { sandboxId: string; execId: string },
  sessionID: string,
  kind: 'exec' | 'agent',
  early: EarlyFrame[],
  log: Logger,
  touch: () => void,
  openedAt: number,
): void {
  const pending: Buffer[] = [];
  const held: Parameters<typeof writeRawFrame>[1][] = [];
  let afterHeld: (() => void) | undefined;
  let opened = false;
  let clientPausedByUs = false;
  let upstreamPausedByUs = false;
  let heldBytes = 0;
  let stallTimer: NodeJS.Timeout | undefined;
  let dropped = false;
  const backlogMax = deps.cfg.EXEC_WS_BACKLOG_MAX_BYTES;
  const stallMs = deps.cfg.EXEC_WS_STALL_SECONDS * 1000;

  /** Closes a client that does not read (1008 and why) and leaves the host's stream. */
  const drop = (why: string) => {
    if (dropped) return;
    dropped = true;
    clearTimeout(stallTimer);
    log.info({ sessionID, unsent: clientSocket.writableLength }, `exec relay: client dropped: ${why}`);
    upstream.close(1000, 'client left');
    if (client.readyState === WebSocket.OPEN) client.close(1008, `client not reading: ${why}`.slice(0, 120));
    // Its close frame waits behind what it did not read; ws drops the connection if it never answers.
  };
  /** Stops reading the host while the client has too much queued; drops the client if that lasts. */
  const pauseUpstreamFor = () => {
    if (upstreamPausedByUs) return;
    upstreamPausedByUs = true;
    upstream.pause();
    clientSocket.once('drain', resumeUpstream);
    stallTimer = setTimeout(() => drop(`its stream stayed paused ${deps.cfg.EXEC_WS_STALL_SECONDS} s (EXEC_WS_STALL_SECONDS)`), stallMs);
  };

  const resumeClient = () => {
    if (!clientPausedByUs) return;
    clientPausedByUs = false;
    resumeSocket(client);
  };
  const resumeUpstream = () => {
    clearTimeout(stallTimer);
    if (!upstreamPausedByUs || dropped) return;
    upstreamPausedByUs = false;
    upstream.resume();
  };

  const upstream = host.openExecStream(target.sandboxId, target.execId, {
    onOpen: () => {
      opened = true;
      for (const b of pending.splice(0)) upstream.send(b);
      // The client may have been paused while its frames waited for the host.
      if (!clientPausedByUs) watchUpstreamQueue();
      else if (upstream.bufferedAmount > RELAY_HIGH) upstream.onDrain(resumeClient);
      else resumeClient();
    },
    onFrame: (f) => {
      if (client.readyState !== WebSocket.OPEN) return;
      touch();
      if (f.first === 0x03 && f.payload && f.payload.length >= 5) void recordExit(deps, kind, sessionID, f.payload.readInt32BE(1), new Date());
      // Held until the client's connection is FIRST_FRAME_HOLD_MS old (see there), in order.
      const wait = openedAt + FIRST_FRAME_HOLD_MS - Date.now();
      if (held.length || wait > 0) {
        held.push(f.raw);
        heldBytes += f.length;
        // Do not read the host faster than frames can be held.
        if (heldBytes > RELAY_HIGH && !upstreamPausedByUs) {
          upstreamPausedByUs = true;
          upstream.pause();
        }
        if (held.length === 1) {
          setTimeout(() => {
            for (const raw of held.splice(0)) if (client.readyState === WebSocket.OPEN) writeRawFrame(clientSocket, raw);
            heldBytes = 0;
            if (upstreamPausedByUs && !dropped) {
              upstreamPausedByUs = false;
              if (clientSocket.writableLength > RELAY_HIGH) pauseUpstreamFor();
              else upstream.resume();
            }
            // A close that came while frames were held goes after them.
            afterHeld?.();
            afterHeld = undefined;
          }, Math.max(0, wait));
        }
        return;
      }
      writeRawFrame(clientSocket, f.raw);
      if (clientSocket.writableLength > backlogMax) drop(`more than ${backlogMax} bytes unsent (EXEC_WS_BACKLOG_MAX_BYTES)`);
      else if (clientSocket.writableLength > RELAY_HIGH) pauseUpstreamFor();
    },
    onClose: (code, reason) => {
      if (held.length) {
        afterHeld = () => upstreamClosed(code, reason);
        return;
      }
      upstreamClosed(code, reason);
    },
    onError: (err) => {
      log.warn({ err: err.message, sessionID }, 'exec relay: host socket failed');
      if (client.readyState !== WebSocket.OPEN) return;
      if (err.status === 404) closeWith(client, 1011, 'not_found', 'the exec session is no longer on its sandbox host');
      else if (err.status === 429) {
        closeWith(client, 1008, 'rate_limited', 'the exec session has as many attached clients as its host allows (EXEC_ATTACHES_PER_SESSION); detach one first');
      }
      else closeWith(client, 1011, 'bad_gateway', 'the sandbox host is unreachable');
    },
  });
  /** The host's end closed: the client's closes the same way (after any held frames). */
  function upstreamClosed(code: number, reason: string): void {
    if (client.readyState !== WebSocket.OPEN) return;
    if (code === 1000) client.close(1000, reason.slice(0, 120));
    // 1006: the host's end vanished without a close frame, as when the host process dies; its exec
    // sessions lived in its memory, so a restarted host does not have them.
    else if (code === 1006) closeWith(client, 1011, 'bad_gateway', 'the connection to the sandbox host dropped (a host that restarts loses its exec sessions)');
    else closeWith(client, 1011, 'bad_gateway', `the sandbox host closed the stream (${code})`);
  }

  /** Stops reading the client while too much is queued toward the host, until that is written. */
  const watchUpstreamQueue = () => {
    if (clientPausedByUs || upstream.bufferedAmount <= RELAY_HIGH) return;
    clientPausedByUs = true;
    pauseSocket(client);
    upstream.onDrain(resumeClient);
  };
  const toUpstream = (data: Buffer) => {
    upstream.send(data);
    watchUpstreamQueue();
  };

  const onMessage = (data: string | Buffer | ArrayBuffer | Buffer[], binaryFlag?: boolean) => {
    const isBinary = typeof binaryFlag === 'boolean' ? binaryFlag : typeof data !== 'string';
    const buf = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : typeof data === 'string' ? Buffer.from(data) : Buffer.from(data);
    if (!isBinary || buf.length === 0 || buf[0] !== 0x00) {
      const why = !isBinary ? 'text frames are not accepted' : buf.length === 0 ? 'empty frame' : `unknown stream 0x${buf[0]!.toString(16).padStart(2, '0')}`;
      closeWith(client, 1003, 'invalid_request', `bad frame: ${why}; send binary frames 0x00 + stdin bytes`);
      upstream.terminate();
      return;
    }
    if (!opened) {
      pending.push(buf);
      if (!clientPausedByUs && pending.reduce((n, b) => n + b.length, 0) > RELAY_HIGH) {
        clientPausedByUs = true;
        pauseSocket(client);
      }
      return;
    }
    if (upstream.open) toUpstream(buf);
  };
  client.on('message', onMessage);
  for (const [data, flag] of early) onMessage(data, flag);

  const detach = () => {
    clearTimeout(stallTimer);
    upstream.close(1000, 'client left');
  };
  client.on('close', detach);
  client.on('error', detach);
}

/**
 * Registers the WebSocket route (an express-ws route on the app). No-op when the app has no
 * WebSocket support (createApp without a server, in unit tests).
 */
export function registerExecSocket(app: express.Express, deps: ApiDeps, auth: Authenticator): void {
  const wsApp = app as express.Express & { ws?: (path: string, h: (ws: WebSocket, req: Request) => void) => void };
  if (typeof wsApp.ws !== 'function') return;
  const log = deps.logger.child({ route: 'exec-ws' });
  wsApp.ws('/api/sandboxes/:id/exec/:sessionID', (ws, req) => {
    // Keep what the client sends while we check (stdin may follow the open at once), and stop
    // reading more until the relay is set up.
    const openedAt = Date.now();
    const early: EarlyFrame[] = [];
    const keep = (data: EarlyFrame[0], flag?: boolean) => early.push([data, flag]);
    ws.on('message', keep);
    pauseSocket(ws);
    void (async () => {
      try {
        const org = await auth.authenticate(req);
        const params = parseOrThrow(WsParams, req.params, 'path');
        const target = await attachTarget(deps, params.sessionID);
        if (!target || target.orgId !== org.id || target.sandboxId !== params.id) throw notFound(`exec session ${params.sessionID}`);
        const host = await sandboxHost(deps, org.id, params.id);
        if (ws.readyState !== WebSocket.OPEN) return;
        ws.off('message', keep);
        // Streaming counts as use of the sandbox (touchSandbox writes at most once a minute).
        // Checked per frame, so skip the call (and its promise) for a second after each one.
        let touchedAt = 0;
        const touch = () => {
          const now = Date.now();
          if (now - touchedAt < 1000) return;
          touchedAt = now;
          void touchSandbox(deps.store, params.id).catch(() => undefined);
        };
        relay(deps, ws, req.socket, host, { sandboxId: params.id, execId: target.execId }, params.sessionID, target.kind, early, log, touch, openedAt);
        resumeSocket(ws);
      } catch (err) {
        const e = err instanceof ApiError ? err : fromHostError(err, 'exec session');
        closeWith(ws, e.status >= 500 ? 1011 : 1008, e.type, e.message);
      }
    })();
  });
}
