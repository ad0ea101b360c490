/**
 * Exec sessions: commands started inside a live sandbox (through the provider's nsenter path), kept by
 * the host, attachable by any number of WebSocket clients at `/sandboxes/:id/exec/:sessionId/ws`.
 *
 * WebSocket protocol: binary frames, first byte the kind (declared in ../host-contract/exec-frames.ts):
 * stdin one way, stdout, stderr, the exit code and the end of the scrollback the other. A new client
 * first gets the scrollback (the last 1 MiB of each stream, in the order produced), then FRAME_SCROLLBACK_END.
 * The routes, their schemas and the WebSocket's path are declared in ../host-contract/wire.ts.
 *
 * Limits: `timeout` (seconds) kills the command's process group with SIGKILL; default none.
 * `maxRunAfterDisconnect` (seconds) kills it that long after its last client left (counting starts
 * at the first disconnect, never before anyone attached); default none.
 * Backpressure: while any client has more than 1 MiB unsent, the command's stdout/stderr are paused.
 * Bounds (config/exec-limits.ts): at most EXEC_SESSIONS_PER_SANDBOX running sessions per sandbox and
 * EXEC_ATTACHES_PER_SESSION clients per session (more: 429 rate_limited); a client with more than
 * EXEC_WS_BACKLOG_MAX_BYTES unsent is closed (1008).
 *
 * Output is read into reused memory (./output-reader) and written straight on each client's socket
 * as a small header (with the stream byte) followed by the chunk (./frames): a chunk is not copied,
 * neither to send it nor to keep it in the scrollback (which holds the chunks themselves, trimmed by
 * views, until the command exits: then what it holds is copied out and the reused memory freed).
 */
import { trace } from '../../lib/trace';
import * as http from 'node:http';
import * as net from 'node:net';
import type { Socket } from 'node:net';
import { constants as osConstants } from 'node:os';
import type { Logger } from 'pino';
import { WebSocketServer } from 'ws';
import { HOST_ERROR_STATUS, isSandboxError, SandboxError } from '../../contract/errors';
import { SandboxCgroups } from '../proc-refs-and-cgroups';
import type { SandboxProvider } from '../driver';
import type { PipedProcess } from '../spawner';
import { randomBytes } from 'node:crypto';
import { EXEC_SESSION_ID, type ExecExit, type ExecExitsAnswer, type ExecRequest, type ExecRunResult } from '../host-contract/types';
import { EXEC_FRAMES_TYPE, hostPathPattern, hostRoutes, hostSockets, TUNNEL_PROTOCOL } from '../host-contract/wire';
import { HttpFramesClient } from './exec-frames-client';
import type { Serve } from './serve';
import { bearerMatchesHeader } from './auth';
import { splice } from '../../lib/splice';
import type { ExecLimits } from '../../config/exec-limits';

import { KEEP_EXITED, exitCodeOf, ExecSession } from './exec-session';

export { ExecSession } from './exec-session';

/** Attaches waiting for their session's start at once, per host (see ExecManager.whenStarted). */
export const START_WAITERS_MAX = 4096;

/** Exits kept for GET /exec-exits (the oldest dropped beyond). */
export const EXEC_EXITS_KEPT = 4096;

/** Owns the exec sessions of every sandbox on this host. */
export class ExecManager {
  private readonly sessions = new Map<string, Map<string, ExecSession>>();
  /** Exits as they happen, for the control plane to record them at once (GET /exec-exits). */
  private readonly exits: ExecExit[] = [];
  private exitSeq = 0;
  /** This run of the host: a reader of exits from an earlier run missed some. */
  readonly exitEpoch = randomBytes(6).toString('hex');
  private readonly exitWaiters = new Set<() => void>();
  /**
   * Attaches that came before their session's start (`awaitStartMs`), by `sandboxId/sessionId`: the
   * control plane sends a streamed start's create and attach at once (one round trip, not two).
   */
  private readonly startWaiters = new Map<string, Set<(s: ExecSession | null) => void>>();
  private startWaiterCount = 0;
  /** Starts under way per sandbox (counted against EXEC_SESSIONS_PER_SANDBOX with the running ones). */
  private readonly starting = new Map<string, number>();

  constructor(
    readonly provider: SandboxProvider,
    readonly logger: Logger,
    readonly limits: Pick<ExecLimits, 'EXEC_RUN_OUTPUT_MAX_BYTES' | 'EXEC_SESSIONS_PER_SANDBOX' | 'EXEC_ATTACHES_PER_SESSION' | 'EXEC_WS_BACKLOG_MAX_BYTES'> = {
      EXEC_RUN_OUTPUT_MAX_BYTES: 1024 * 1024,
      EXEC_SESSIONS_PER_SANDBOX: 32,
      EXEC_ATTACHES_PER_SESSION: 8,
      EXEC_WS_BACKLOG_MAX_BYTES: 8 * 1024 * 1024,
    },
  ) {}

  /** Starts a command inside the sandbox. Throws not_found / conflict from the provider, rate_limited over EXEC_SESSIONS_PER_SANDBOX. */
  async start(sandboxId: string, req: ExecRequest): Promise<ExecSession> {
    const max = this.limits.EXEC_SESSIONS_PER_SANDBOX;
    const starting = this.starting.get(sandboxId) ?? 0;
    if (this.list(sandboxId).filter((s) => s.running).length + starting >= max) {
      throw new SandboxError(
        'rate_limited',
        `sandbox ${sandboxId} already runs ${max} exec sessions (EXEC_SESSIONS_PER_SANDBOX); wait for one to exit or kill one`,
      );
    }
    if (req.sessionID && this.sessions.get(sandboxId)?.has(req.sessionID)) {
      throw new SandboxError('conflict', `exec session ${req.sessionID} already exists in sandbox ${sandboxId}`);
    }
    this.starting.set(sandboxId, starting + 1);
    trace(sandboxId, 'host:exec-start');
    let child: PipedProcess;
    try {
      child = await this.provider.spawnPiped(sandboxId, { argv: [req.cmd, ...(req.args ?? [])], env: req.envs, cwd: req.cwd });
    } finally {
      const n = (this.starting.get(sandboxId) ?? 1) - 1;
      if (n > 0) this.starting.set(sandboxId, n);
      else this.starting.delete(sandboxId);
    }
    trace(sandboxId, 'host:exec-started');
    const session = new ExecSession(sandboxId, req, child, this.logger, this.limits.EXEC_WS_BACKLOG_MAX_BYTES, req.sessionID);
    let map = this.sessions.get(sandboxId);
    if (!map) this.sessions.set(sandboxId, (map = new Map()));
    map.set(session.id, session);
    const waiting = this.startWaiters.get(`${sandboxId}/${session.id}`);
    if (waiting) for (const wake of [...waiting]) wake(session);
    void session.wait().then(() => {
      this.noteExit(session);
      this.prune(sandboxId);
    });
    return session;
  }

  private noteExit(s: ExecSession): void {
    this.exits.push({
      seq: ++this.exitSeq,
      sandboxID: s.sandboxId,
      sessionID: s.id,
      exitCode: s.exitCode as number,
      exitedAt: s.exitedAt as string,
      oomKilled: s.oomKilled,
    });
    if (this.exits.length > EXEC_EXITS_KEPT) this.exits.splice(0, this.exits.length - EXEC_EXITS_KEPT);
    for (const wake of [...this.exitWaiters]) wake();
  }

  /** The exits after `after` of run `epoch` (see ExecExitsAnswer); at most 1000 at once. */
  exitsAfter(epoch: string | undefined, after: number): ExecExitsAnswer {
    const same = epoch === this.exitEpoch;
    const from = same ? after : 0;
    const exits = this.exits.filter((e) => e.seq > from).slice(0, 1000);
    const oldest = this.exits[0]?.seq ?? this.exitSeq + 1;
    return {
      epoch: this.exitEpoch,
      seq: exits.length ? exits[exits.length - 1]!.seq : Math.max(from, same ? after : this.exitSeq),
      exits,
      complete: same ? oldest <= after + 1 : oldest <= 1,
    };
  }

  /** Resolves once an exit after `after` exists, or after `ms`, or when `gone` resolves. */
  private waitExit(after: number, ms: number, gone: Promise<void>): Promise<void> {
    if (this.exitSeq > after || ms <= 0) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.exitWaiters.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.exitWaiters.add(done);
      void gone.then(done);
    });
  }

  private prune(sandboxId: string): void {
    const map = this.sessions.get(sandboxId);
    if (!map) return;
    const exited = [...map.values()].filter((s) => !s.running);
    for (const s of exited.slice(0, Math.max(0, exited.length - KEEP_EXITED))) map.delete(s.id);
  }

  /**
   * The session, or the one started under this id within `ms` (null if none was, or `gone` resolved
   * first). At most START_WAITERS_MAX attaches wait at once on a host (rate_limited beyond).
   */
  async whenStarted(sandboxId: string, sessionId: string, ms: number, gone: Promise<void>): Promise<ExecSession | null> {
    const now = this.sessions.get(sandboxId)?.get(sessionId);
    if (now) return now;
    if (this.startWaiterCount >= START_WAITERS_MAX) {
      throw new SandboxError('rate_limited', `${START_WAITERS_MAX} attaches already wait for their session's start on this host`);
    }
    const key = `${sandboxId}/${sessionId}`;
    let set = this.startWaiters.get(key);
    if (!set) this.startWaiters.set(key, (set = new Set()));
    const waiters = set;
    this.startWaiterCount++;
    return new Promise<ExecSession | null>((resolve) => {
      const wake = (s: ExecSession | null) => {
        if (!waiters.delete(wake)) return;
        this.startWaiterCount--;
        if (waiters.size === 0) this.startWaiters.delete(key);
        clearTimeout(timer);
        resolve(s);
      };
      const timer = setTimeout(() => wake(null), ms);
      waiters.add(wake);
      void gone.then(() => wake(null));
    });
  }

  /** The session, or throws not_found. */
  get(sandboxId: string, sessionId: string): ExecSession {
    const s = this.sessions.get(sandboxId)?.get(sessionId);
    if (!s) throw new SandboxError('not_found', `exec session ${sessionId} not found in sandbox ${sandboxId}`);
    return s;
  }

  list(sandboxId: string): ExecSession[] {
    return [...(this.sessions.get(sandboxId)?.values() ?? [])];
  }

  /**
   * Runs a command to completion, collecting its output: the first EXEC_RUN_OUTPUT_MAX_BYTES of each
   * stream are kept, the rest read and dropped (`truncated: true`), so the answer is bounded whatever
   * the command prints (even with JSON's 6-byte escapes of control bytes).
   */
  async run(sandboxId: string, req: ExecRequest & { stdin?: string }): Promise<ExecRunResult> {
    trace(sandboxId, 'host:exec-run');
    const oomBefore = SandboxCgroups.of(sandboxId).oomKills();
    trace(sandboxId, 'host:exec-oom-read');
    const child = await this.provider.spawnPiped(sandboxId, { argv: [req.cmd, ...(req.args ?? [])], env: req.envs, cwd: req.cwd });
    const max = this.limits.EXEC_RUN_OUTPUT_MAX_BYTES;
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    const kept = { out: 0, err: 0 };
    let truncated = false;
    let timedOut = false;
    const keep = (into: Buffer[], which: 'out' | 'err') => (d: Buffer) => {
      const room = max - kept[which];
      if (d.length > room) truncated = true;
      if (room <= 0) return;
      const part = d.length > room ? Buffer.from(d.subarray(0, room)) : d;
      into.push(part);
      kept[which] += part.length;
    };
    trace(sandboxId, 'host:exec-spawned');
    child.stdout?.on('data', keep(out, 'out'));
    child.stderr?.on('data', keep(err, 'err'));
    child.stdin?.on('error', () => undefined);
    child.stdin?.end(req.stdin ?? '');
    const timer = req.timeout
      ? setTimeout(() => {
          timedOut = true;
          if (child.signalGroup) return child.signalGroup('SIGKILL');
          try {
            process.kill(-(child.pid as number), 'SIGKILL');
          } catch {
            /* gone */
          }
        }, req.timeout * 1000)
      : undefined;
    const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve, reject) => {
      child.on('error', reject);
      child.on('close', (c: number | null, s: NodeJS.Signals | null) => resolve([c, s]));
    });
    if (timer) clearTimeout(timer);
    trace(sandboxId, 'host:exec-closed');
    return {
      exitCode: exitCodeOf(code, signal),
      signal,
      timedOut,
      ...(SandboxCgroups.of(sandboxId).oomKills() > oomBefore ? { oomKilled: true } : {}),
      stdout: Buffer.concat(out).toString('utf8'),
      stderr: Buffer.concat(err).toString('utf8'),
      ...(truncated ? { truncated: true } : {}),
    };
  }

  /** Registers the exec routes on the app. */
  routes(serve: Serve): void {
    serve(hostRoutes.execExits, async ({ query }, res) => {
      const same = query.epoch === this.exitEpoch;
      if (same) {
        const gone = new Promise<void>((resolve) => res.on('close', resolve));
        await this.waitExit(query.after, query.waitMs, gone);
      }
      res.json(this.exitsAfter(query.epoch, query.after));
    });
    serve(hostRoutes.execRun, async ({ params, body }, res) => {
      res.json(await this.run(params.id, body));
    });
    serve(hostRoutes.execFrames, async ({ params, query }, res) => {
      if (query.awaitStartMs > 0 && !EXEC_SESSION_ID.test(params.sid)) {
        throw new SandboxError('invalid_request', 'awaitStartMs needs an exec session id (es- and 16 hex digits)');
      }
      const gone = new Promise<void>((resolve) => res.once('close', () => resolve()));
      const started = query.awaitStartMs > 0 ? await this.whenStarted(params.id, params.sid, query.awaitStartMs, gone) : null;
      if (res.destroyed) return;
      const s = started ?? this.get(params.id, params.sid);
      const max = this.limits.EXEC_ATTACHES_PER_SESSION;
      if (s.running && s.clients.size + s.attaching >= max) {
        throw new SandboxError('rate_limited', `exec session ${s.id} already has ${max} attached clients (EXEC_ATTACHES_PER_SESSION)`);
      }
      res.writeHead(200, { 'content-type': EXEC_FRAMES_TYPE, 'cache-control': 'no-store' });
      s.attach(new HttpFramesClient(res), res);
    });
    serve(hostRoutes.createExec, async ({ params, body }, res) => {
      res.status(201).json((await this.start(params.id, body)).info());
    });
    serve(hostRoutes.listExec, async ({ params }, res) => {
      if (!this.provider.get(params.id)) throw new SandboxError('not_found', `sandbox ${params.id} not found`);
      res.json(this.list(params.id).map((s) => s.info()));
    });
    serve(hostRoutes.getExec, async ({ params }, res) => {
      res.json(this.get(params.id, params.sid).info());
    });
    // The result so far: waits up to waitMs (at most 30 s) for the command to exit first.
    serve(hostRoutes.execResult, async ({ params, query }, res) => {
      const s = this.get(params.id, params.sid);
      if (s.running && query.waitMs > 0) {
        let timer: NodeJS.Timeout | undefined;
        const gone = new Promise<void>((resolve) => res.on('close', resolve));
        await Promise.race([s.wait(), gone, new Promise<void>((resolve) => (timer = setTimeout(resolve, query.waitMs)))]);
        clearTimeout(timer);
      }
      res.json({ ...s.info(), timedOut: s.timedOut, ...s.collected() });
    });
    serve(hostRoutes.killExec, async ({ params, body }, res) => {
      const signal = body?.signal ?? 'SIGKILL';
      if (!(signal in osConstants.signals)) throw new SandboxError('invalid_request', `unknown signal ${signal}`);
      const s = this.get(params.id, params.sid);
      s.kill(signal as NodeJS.Signals);
      res.json(s.info());
    });
  }

  /** Kills and forgets the exec sessions of a sandbox (before it is destroyed). */
  dropSandbox(id: string): void {
    for (const s of this.list(id)) {
      s.kill('SIGKILL');
      s.closeClients();
    }
    this.sessions.delete(id);
  }

  /** Closes every client socket; commands keep running. */
  close(): void {
    for (const map of this.sessions.values()) for (const s of map.values()) s.closeClients();
  }
}

const WS_PATH = hostPathPattern(hostSockets.exec);
const PTY_WS_PATH = hostPathPattern(hostSockets.pty);

/** Handles WebSocket upgrades for exec (and terminal) attachment (bearer token in the `authorization` header). */
/** `GET /sandboxes/:id/ports/:port/tunnel` with `Upgrade: sap-tunnel`: a raw byte pipe to a sandbox port. */
const TUNNEL_PATH = hostPathPattern(hostSockets.tunnel, { port: '\\d{1,5}' });

/**
 * Attaches the host's upgrade routes: exec and pty WebSockets, and port tunnels (previews served by
 * an API on another machine: after `101 Switching Protocols` the connection is a byte pipe to
 * 127.0.0.1:<port> inside the sandbox, through the port's forwarder socket from `openPort`).
 */
export function attachExec(
  server: http.Server,
  exec: ExecManager,
  token: string,
  pty?: import('./pty').PtyManager,
  openPort?: (id: string, port: number) => Promise<string>,
): void {
  const wss = new WebSocketServer({ noServer: true, maxPayload: 16 * 1024 * 1024, perMessageDeflate: false });
  server.on('upgrade', (req, socket, head) => {
    const reject = (status: number, type: string, message: string) => {
      const body = JSON.stringify({ error: { type, message } });
      socket.end(
        `HTTP/1.1 ${status} ${http_status(status)}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
      );
    };
    const url = new URL(req.url ?? '/', 'http://host');
    const tunnel = openPort ? TUNNEL_PATH.exec(url.pathname) : null;
    if (tunnel && openPort) {
      if (!bearerMatchesHeader(req.headers.authorization, token)) return reject(401, 'unauthorized', 'missing or wrong bearer token');
      if (String(req.headers.upgrade).toLowerCase() !== TUNNEL_PROTOCOL) return reject(400, 'invalid_request', `a tunnel needs Upgrade: ${TUNNEL_PROTOCOL}`);
      const port = Number(tunnel[2]);
      if (port < 1 || port > 65535) return reject(400, 'invalid_request', `invalid port ${tunnel[2]}`);
      socket.on('error', () => socket.destroy());
      openPort(decodeURIComponent(tunnel[1]), port).then(
        (socketPath) => {
          const up = net.connect(socketPath);
          up.once('error', () => reject(502, 'internal', `sandbox port ${port} is not reachable`));
          up.once('connect', () => {
            up.removeAllListeners('error');
            socket.write(`HTTP/1.1 101 Switching Protocols\r\nupgrade: ${TUNNEL_PROTOCOL}\r\nconnection: upgrade\r\n\r\n`);
            if (head.length) up.write(head);
            splice(up, socket);
          });
        },
        (err: Error & { type?: string }) => {
          const type = isSandboxError(err) ? err.type : 'internal';
          reject(HOST_ERROR_STATUS[type as keyof typeof HOST_ERROR_STATUS] ?? 500, type, err.message);
        },
      );
      return;
    }
    const t = pty ? PTY_WS_PATH.exec(url.pathname) : null;
    if (t && pty) {
      if (!bearerMatchesHeader(req.headers.authorization, token)) return reject(401, 'unauthorized', 'missing or wrong bearer token');
      let term: import('./pty').PtySession;
      try {
        term = pty.get(decodeURIComponent(t[1]), decodeURIComponent(t[2]));
      } catch (err) {
        return reject(404, 'not_found', (err as Error).message);
      }
      wss.handleUpgrade(req, socket, head, (ws) => term.attach(ws));
      return;
    }
    const m = WS_PATH.exec(url.pathname);
    if (!m) return reject(404, 'not_found', 'no such route');
    trace(decodeURIComponent(m[1]), 'host:ws-upgrade');
    if (!bearerMatchesHeader(req.headers.authorization, token)) return reject(401, 'unauthorized', 'missing or wrong bearer token');
    let session: ExecSession;
    try {
      session = exec.get(decodeURIComponent(m[1]), decodeURIComponent(m[2]));
    } catch (err) {
      return reject(404, 'not_found', (err as Error).message);
    }
    const maxAttaches = exec.limits.EXEC_ATTACHES_PER_SESSION;
    if (session.running && session.clients.size + session.attaching >= maxAttaches) {
      return reject(429, 'rate_limited', `exec session ${session.id} already has ${maxAttaches} attached clients (EXEC_ATTACHES_PER_SESSION)`);
    }
    // Counted until the upgrade completes or the socket goes (an upgrade ws refuses never calls back).
    let counted = true;
    const uncount = () => {
      if (counted) session.attaching--;
      counted = false;
    };
    session.attaching++;
    socket.once('close', uncount);
    wss.handleUpgrade(req, socket, head, (ws) => {
      uncount();
      socket.off('close', uncount);
      session.attach(ws, socket as Socket);
      trace(session.sandboxId, 'host:ws-attached');
    });
  });
}

function http_status(status: number): string {
  return http.STATUS_CODES[status] ?? 'Error';
}
