/**
 * Exec sessions: a command started inside a sandbox, kept by the sandbox host (which holds the
 * process, its scrollback and its WebSocket clients), recorded here in MongoDB.
 *
 * Defaults: `timeout` none (the command runs until it exits or is killed); `maxRunAfterDisconnect`
 * none (the command outlives every client). `exec/run` waits at most `timeout` seconds, default 60.
 */
import { trace } from '../../lib/trace';
import { randomBytes } from 'node:crypto';
import { ApiError, notFound } from '../../contract/errors';
import type { HostClient } from '../../sandbox';
import type { ExecSessionInfo } from '../../sandbox';
import { countOpenExecs, deleteExec, ensureExecIndexes, ExecDoc, findExec, insertExec, listOpenExecs, listSandboxExecs } from '../../store/exec';
import { type ExecLive, killAndWait, liveExec, liveExecsOf, liveFields, type LiveFields, signalName } from './exec-live';
import { fromHostError } from '../hosts/host-errors';
import { HostExecStream, pipeExecStream, type ExecStreamOut } from './exec-stream';
import type { SandboxDeps } from '../deps';

/** What a start asks for (the parsed body). */
export interface ExecStartRequest {
  cmd: string;
  args: string[];
  envs: Record<string, string>;
  cwd?: string;
  timeout?: number;
  maxRunAfterDisconnect?: number;
}

/** The public form of an exec session. */
export type ExecSessionState = { sessionID: string; sandboxID: string; command: string; args: string[]; startedAt: string } & LiveFields;

/**
 * How long an organisation's count of running exec sessions is used without a new query, while it is
 * below half of EXEC_SESSIONS_PER_ORG (see createExecService's counts). Within one API process the
 * limit stays exact; across API processes it was and stays approximate (a count and a start race).
 */
const COUNT_FRESH_MS = 2000;
/**
 * A start within this long of the last count takes it as it is (plus the starts since); a later one
 * refreshes it in the background. Counting at every start put a query of 3–8 ms beside each start's
 * own record insert, and the store serves them one after the other.
 */
const COUNT_REFRESH_MS = 500;

/** How long GET …/result waits for a running command before answering `running: true` (the client polls again). */
export const RESULT_WAIT_MS = 1000;

function view(doc: ExecDoc, info: ExecSessionInfo | null): ExecSessionState {
  return {
    sessionID: doc._id,
    sandboxID: doc.sandboxId,
    command: doc.command,
    args: doc.args,
    startedAt: doc.startedAt.toISOString(),
    ...liveFields(info, doc),
  };
}

/** The exec session operations of the API, over the live-session registry. */
export function createExecService(deps: SandboxDeps, live: ExecLive) {
  /**
   * Exec sessions this process is starting, per organisation, until their open-exec entry is written
   * (then the store counts them): counted with the recorded ones against EXEC_SESSIONS_PER_ORG.
   */
  const startingByOrg = new Map<string, Set<{ recorded: boolean; id: string }>>();

  /**
   * Per organisation, its last count of running exec sessions (runningExecsOfOrg), when it was read,
   * and how many sessions this process has started since: while that count is recent and far below the
   * limit, a start does not wait for a new one (a query of ~3–8 ms on the exec's first byte), it
   * refreshes it in the background. Near the limit every start counts first.
   */
  const counts = new Map<string, { n: number; at: number; since: number; refreshing: boolean }>();

  /** Counts the organisation's running sessions and remembers the figure (see counts). */
  async function countNow(orgId: string, max: number): Promise<number> {
    const entry = counts.get(orgId);
    const before = entry?.since ?? 0;
    const n = await runningExecsOfOrg(orgId, max);
    if (counts.size >= 10_000 && !counts.has(orgId)) counts.clear();
    const now = counts.get(orgId);
    // Starts this process made while counting are not all in the figure: they stay counted locally.
    counts.set(orgId, { n, at: Date.now(), since: Math.max(0, (now?.since ?? 0) - before), refreshing: false });
    return n;
  }

  /** The running sessions to check a start against: a recent figure when far below `max`, else a fresh count. */
  async function runningForStart(orgId: string, max: number, unrecorded: () => number): Promise<number> {
    const c = counts.get(orgId);
    if (c && Date.now() - c.at < COUNT_FRESH_MS && c.n + c.since + unrecorded() < max / 2) {
      c.since++;
      if (!c.refreshing && Date.now() - c.at >= COUNT_REFRESH_MS) {
        c.refreshing = true;
        countNow(orgId, max).catch((err: unknown) => {
          c.refreshing = false;
          c.at = 0;
          deps.logger.warn({ err }, 'exec sessions not counted');
        });
      }
      return c.n + c.since - 1;
    }
    const n = await countNow(orgId, max);
    counts.get(orgId)!.since++;
    return n;
  }

  async function orgExec(orgId: string, sandboxId: string, id: string): Promise<ExecDoc> {
    const doc = await findExec(deps.store, id);
    if (!doc || doc.orgId !== orgId || doc.sandboxId !== sandboxId) throw notFound(`exec session ${id}`);
    return doc;
  }

  /**
   * How many of the organisation's exec sessions run. The store's records without an exit are
   * counted first; only when they reach `max` are they checked against their hosts (an exit nobody
   * looked at is recorded then), so the count holds across API processes and costs a query normally.
   * A session whose sandbox or host is gone counts as exited.
   */
  async function runningExecsOfOrg(orgId: string, max: number): Promise<number> {
    // This process's starts not yet marked counted are counted by the caller: left out here, judged
    // once the store has answered (the caller reads them with no wait in between), so a start whose
    // entry the store already shows is counted once, not twice.
    const uncounted = () => new Set([...(startingByOrg.get(orgId) ?? [])].filter((s) => !s.recorded).map((s) => s.id));
    const ids = await countOpenExecs(deps.store, orgId, max + (startingByOrg.get(orgId)?.size ?? 0));
    const skip = uncounted();
    const open = ids.filter((id) => !skip.has(id)).length;
    if (open < max) return open;
    const docs = await listOpenExecs(deps.store, orgId);
    const runningIds: string[] = [];
    const bySandbox = new Map<string, typeof docs>();
    for (const d of docs) bySandbox.set(d.sandboxId, [...(bySandbox.get(d.sandboxId) ?? []), d]);
    for (const [sandboxId, list] of bySandbox) {
      let byId: Map<string, ExecSessionInfo> | null;
      try {
        byId = await liveExecsOf(await live.sandboxHost(orgId, sandboxId), sandboxId);
      } catch (err) {
        // The sandbox is gone: so are its commands. An unreachable host: not counted, not recorded.
        if (err instanceof ApiError && err.type === 'not_found') byId = new Map();
        else continue;
      }
      for (const d of list) {
        const info = byId.get(d._id) ?? null;
        if (info?.running) runningIds.push(d._id);
        else await live.recordExit('exec', d._id, info ? info.exitCode : null, info?.exitedAt ? new Date(info.exitedAt) : new Date(), info?.oomKilled);
      }
    }
    const skipNow = uncounted();
    return runningIds.filter((id) => !skipNow.has(id)).length;
  }

  async function startAndRecord(
    host: HostClient,
    orgId: string,
    sandboxId: string,
    body: ExecStartRequest,
    mine: { recorded: boolean; id: string },
  ): Promise<{ doc: ExecDoc; info: ExecSessionInfo }> {
    // The id is chosen here, so the record is written while the host starts the command (one round
    // trip less before the answer); whichever fails undoes the other.
    const doc: ExecDoc = {
      _id: mine.id,
      orgId,
      sandboxId,
      command: body.cmd,
      args: body.args,
      startedAt: new Date(),
      exitedAt: null,
      exitCode: null,
    };
    // The host's request goes out first: the record's encoding and write happen while the host works.
    const startedP = host.createExec(sandboxId, { ...body, sessionID: doc._id }).finally(() => trace(sandboxId, 'api:exec-host-answered'));
    const [started, recorded] = await Promise.allSettled([
      startedP,
      insertExec(deps.store, doc, () => {
        mine.recorded = true;
      }).finally(() => trace(sandboxId, 'api:exec-recorded')),
    ]);
    if (recorded.status === 'rejected') {
      if (started.status === 'fulfilled') await host.killExec(sandboxId, started.value.sessionID).catch(() => undefined);
      throw recorded.reason;
    }
    if (started.status === 'rejected') {
      await deleteExec(deps.store, doc).catch((err: unknown) =>
        deps.logger.warn({ err, execId: doc._id }, 'could not remove the record of an exec that did not start'),
      );
      throw fromHostError(started.reason, `sandbox ${sandboxId}`);
    }
    const info = started.value;
    if (info.sessionID !== doc._id) {
      // A host of an older version chose its own id: the record follows it.
      await deleteExec(deps.store, doc).catch(() => undefined);
      doc._id = info.sessionID;
      await insertExec(deps.store, doc).catch(async (err: unknown) => {
        await host.killExec(sandboxId, info.sessionID).catch(() => undefined);
        throw err;
      });
    }
    live.rememberTarget(doc._id, { orgId, sandboxId, execId: doc._id, kind: 'exec' });
    return { doc, info };
  }

  /** Starts an exec session on the sandbox's host and records it (the command is killed if the record fails); 429 over EXEC_SESSIONS_PER_ORG. */
  async function startRecorded(
    orgId: string,
    sandboxId: string,
    body: ExecStartRequest,
    id = `es-${randomBytes(8).toString('hex')}`,
  ): Promise<{ doc: ExecDoc; info: ExecSessionInfo; host: HostClient }> {
    trace(sandboxId, 'api:exec-start');
    const host = await live.sandboxHost(orgId, sandboxId);
    trace(sandboxId, 'api:exec-host-found');
    const max = deps.cfg.EXEC_SESSIONS_PER_ORG;
    const unrecordedNow = () => [...(startingByOrg.get(orgId) ?? [])].filter((s) => !s.recorded).length;
    const recorded = await runningForStart(orgId, max, unrecordedNow);
    // Read after the count (no await between this and the add): a start whose record the count may
    // include is marked recorded, so it is not counted twice.
    const unrecorded = unrecordedNow();
    trace(sandboxId, 'api:exec-counted');
    if (recorded + unrecorded >= max) {
      throw new ApiError('rate_limited', `the organisation already runs ${max} exec sessions (EXEC_SESSIONS_PER_ORG); wait for one to exit or kill one`);
    }
    let starting = startingByOrg.get(orgId);
    if (!starting) startingByOrg.set(orgId, (starting = new Set()));
    const mine = { recorded: false, id };
    starting.add(mine);
    try {
      return { ...(await startAndRecord(host, orgId, sandboxId, body, mine)), host };
    } finally {
      starting.delete(mine);
      if (starting.size === 0) startingByOrg.delete(orgId);
    }
  }

  return {
    /** Creates the store's indexes (best effort, in the background). */
    ensureIndexes(): void {
      ensureExecIndexes(deps.store).catch((err: unknown) => deps.logger.warn({ err }, 'exec indexes not created'));
    },

    /** Starts a command as an exec session. */
    async start(orgId: string, sandboxId: string, body: ExecStartRequest): Promise<ExecSessionState> {
      const { doc, info } = await startRecorded(orgId, sandboxId, body);
      return view(doc, info);
    },

    /**
     * Starts a command as an exec session and answers it with a `pipe` that reads its output into
     * `out` until it exits (see ./exec-stream.ts): the start's errors are thrown before anything is
     * streamed.
     */
    async startStreamed(
      orgId: string,
      sandboxId: string,
      body: ExecStartRequest,
    ): Promise<{ session: ExecSessionState; pipe: (out: ExecStreamOut) => Promise<void> }> {
      // The host's stream is opened with the create (the host waits for the start): one round trip.
      const id = `es-${randomBytes(8).toString('hex')}`;
      const stream = new HostExecStream(await live.sandboxHost(orgId, sandboxId), sandboxId, id);
      let started;
      try {
        started = await startRecorded(orgId, sandboxId, body, id);
      } catch (err) {
        stream.abandon();
        throw err;
      }
      let attached = stream;
      if (started.doc._id !== id) {
        // A host of an older version chose its own id: attach to that one.
        stream.abandon();
        attached = new HostExecStream(started.host, sandboxId, started.doc._id);
      }
      const stallMs = deps.cfg.EXEC_WS_STALL_SECONDS * 1000;
      return { session: view(started.doc, started.info), pipe: (out) => pipeExecStream(live, attached, out, stallMs) };
    },

    /** Starts a command to completion in the background; answers its id. */
    async startAsync(orgId: string, sandboxId: string, body: ExecStartRequest): Promise<string> {
      const { doc } = await startRecorded(orgId, sandboxId, body);
      return doc._id;
    },

    /** The sandbox's exec sessions, newest first, with their live state. */
    async list(orgId: string, sandboxId: string): Promise<ExecSessionState[]> {
      const host = await live.sandboxHost(orgId, sandboxId);
      const rows = await live.listWithLive(host, orgId, sandboxId, 'exec', listSandboxExecs(deps.store, sandboxId), (d) => d._id);
      return rows.map(({ doc, info }) => view(doc, info));
    },

    /** Runs a short command to completion; a non-zero exit is a result. */
    async run(orgId: string, sandboxId: string, body: ExecStartRequest & { timeout: number; stdin?: string }) {
      trace(sandboxId, 'api:exec-run');
      const host = await live.sandboxHost(orgId, sandboxId);
      trace(sandboxId, 'api:exec-host-found');
      try {
        const r = await host.execRun(sandboxId, body);
        trace(sandboxId, 'api:exec-ran');
        return {
          exitCode: r.exitCode,
          stdout: r.stdout,
          stderr: r.stderr,
          ...(r.oomKilled ? { oomKilled: true as const } : {}),
          ...(r.truncated ? { truncated: true as const } : {}),
        };
      } catch (err) {
        throw fromHostError(err, `sandbox ${sandboxId}`);
      }
    },

    /** The exit code and output of an exec session; waits up to RESULT_WAIT_MS for a running one to exit. */
    async result(orgId: string, sandboxId: string, id: string) {
      const host = await live.sandboxHost(orgId, sandboxId);
      const doc = await orgExec(orgId, sandboxId, id);
      let r;
      try {
        r = await host.execResult(sandboxId, doc._id, { waitMs: RESULT_WAIT_MS });
      } catch (err) {
        if ((err as { status?: number }).status === 404) {
          // The host no longer has it (restarted, or the sandbox is gone): what the record says.
          return {
            execId: doc._id,
            running: false,
            exitCode: doc.exitCode,
            timedOut: false,
            stdout: '',
            stderr: '',
            error: 'its output is no longer kept (the sandbox or its host restarted)',
          };
        }
        throw fromHostError(err, `exec session ${doc._id}`);
      }
      live.noteExit('exec', doc._id, r, doc);
      return {
        execId: doc._id,
        running: r.running,
        exitCode: r.exitCode,
        timedOut: r.timedOut,
        stdout: r.stdout,
        stderr: r.stderr,
        ...(r.truncated ? { truncated: true as const } : {}),
      };
    },

    /** An exec session with its live state. */
    async get(orgId: string, sandboxId: string, id: string): Promise<ExecSessionState> {
      const host = await live.sandboxHost(orgId, sandboxId);
      const doc = await orgExec(orgId, sandboxId, id);
      const info = await liveExec(host, sandboxId, doc._id);
      live.noteExit('exec', doc._id, info, doc);
      return view(doc, info);
    },

    /** Signals an exec session (default SIGKILL) and answers once it exited (or after 2 s). */
    async kill(orgId: string, sandboxId: string, id: string, signal: string | number | undefined): Promise<ExecSessionState> {
      const host = await live.sandboxHost(orgId, sandboxId);
      const doc = await orgExec(orgId, sandboxId, id);
      const info = await killAndWait(host, sandboxId, doc._id, signalName(signal));
      live.noteExit('exec', doc._id, info, doc);
      return view(doc, info);
    },
  };
}

/** The exec session operations (see createExecService). */
export type ExecService = ReturnType<typeof createExecService>;
