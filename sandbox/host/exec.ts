/**
 * Exec sessions: commands started inside a live sandbox (through the provider's nsenter path), kept by
 * the host, attachable by any number of WebSocket clients at `/sandboxes/:id/exec/:sessionId/ws`.
 *
 * WebSocket protocol, binary frames, first byte the kind:
 *   client → server  0x00 + bytes   stdin (an empty 0x00 frame closes stdin)
 *   server → client  0x01 + bytes   stdout
 *                    0x02 + bytes   stderr
 *                    0x03 + int32BE exit code (128 + n when killed by signal n); the socket then closes
 *                    0x04           end of scrollback: what follows is live
 * A new client first gets the scrollback (the last 1 MiB of each stream, in the order produced), then 0x04.
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
import { randomBytes } from 'node:crypto';
import * as http from 'node:http';
import * as net from 'node:net';
import type { Socket } from 'node:net';
import { constants as osConstants } from 'node:os';
import type express from 'express';
import type { Request, Response, NextFunction } from 'express';
import type { Logger } from 'pino';
import { WebSocketServer, WebSocket } from 'ws';
import { z } from 'zod';
import { errorStatus, isSandboxError, SandboxError } from '../errors';
import { SandboxCgroups } from '../procs';
import type { SandboxProvider } from '../driver';
import type { PipedProcess } from '../spawner';
import type { ExecRequest, ExecRunResult, ExecSessionInfo } from '../host-contract/types';
import { bearerMatchesHeader } from './auth';
import { splice } from '../../lib/splice';
import { writeBinaryFrame } from '../host-contract/frames';
import { readOutput, type OutputReader, type Slab } from './output-reader';
import type { ExecLimits } from '../../config/exec-limits';

export const FRAME_STDIN = 0x00;
export const FRAME_STDOUT = 0x01;
export const FRAME_STDERR = 0x02;
export const FRAME_EXIT = 0x03;
export const FRAME_SCROLLBACK_END = 0x04;

const SCROLLBACK_BYTES = 1024 * 1024;
const HIGH_WATER = 1024 * 1024;
const LOW_WATER = 256 * 1024;
const KEEP_EXITED = 50;

const execSchema = z.object({
  cmd: z.string().min(1),
  args: z.array(z.string()).optional(),
  envs: z.record(z.string(), z.string()).optional(),
  cwd: z.string().startsWith('/').optional(),
  timeout: z.number().int().positive().optional(),
  maxRunAfterDisconnect: z.number().int().min(0).optional(),
});
const idParams = z.object({ id: z.string().min(1) });
const sessionParams = z.object({ id: z.string().min(1), sid: z.string().min(1) });

/** Exit code as a shell reports it: the code, or 128 + signal number. */
function exitCodeOf(code: number | null, signal: NodeJS.Signals | null): number {
  if (code !== null) return code;
  return 128 + (signal ? (osConstants.signals[signal] ?? 0) : 0);
}

/** One command running (or finished) inside a sandbox. */
export class ExecSession {
  readonly id = `es-${randomBytes(8).toString('hex')}`;
  readonly startedAt = new Date().toISOString();
  /** Attached clients and the sockets their output frames are written on. */
  readonly clients = new Map<WebSocket, Socket>();
  exitCode: number | null = null;
  exitedAt: string | null = null;
  signal: NodeJS.Signals | null = null;
  timedOut = false;
  /** Whether the OOM killer killed a process of the sandbox while the command ran (set at exit). */
  oomKilled = false;
  private readonly oomBefore: number;
  /** Chunks in the order produced; `slab` is held (retained) while a chunk is here. */
  private readonly scrollback: { kind: number; data: Buffer; slab: Slab | null }[] = [];
  private readonly readers: OutputReader[] = [];
  private readonly scrollBytes: Record<number, number> = { [FRAME_STDOUT]: 0, [FRAME_STDERR]: 0 };
  private paused = false;
  /** Whether the scrollback dropped output (what `collected` gives is the end of a longer stream). */
  private trimmed = false;
  private timers: NodeJS.Timeout[] = [];
  private disconnectTimer: NodeJS.Timeout | undefined;
  private readonly exited: Promise<void>;

  /** Upgrades under way (counted with `clients` against the cap on attaches). */
  attaching = 0;

  constructor(
    readonly sandboxId: string,
    readonly req: ExecRequest,
    readonly child: PipedProcess,
    private readonly log: Logger,
    /** Unsent bytes toward one client above which it is disconnected. */
    private readonly backlogMax = 8 * 1024 * 1024,
  ) {
    this.oomBefore = SandboxCgroups.of(sandboxId).oomKills();
    if (child.stdout) this.readers.push(readOutput(child.stdout, (d, slab) => this.output(FRAME_STDOUT, d, slab)));
    if (child.stderr) this.readers.push(readOutput(child.stderr, (d, slab) => this.output(FRAME_STDERR, d, slab)));
    child.stdin?.on('error', () => undefined);
    // Done when the process has exited and its output is read to the end (what 'close' means for
    // a child whose streams are read the ordinary way; the readers may have taken them over).
    const exit = new Promise<[number | null, NodeJS.Signals | null]>((resolve) => {
      child.on('error', (err: Error) => {
        this.log.warn({ err, sandboxId, execId: this.id }, 'exec failed to start');
      });
      const done = (code: number | null, signal: NodeJS.Signals | null) => resolve([code, signal]);
      child.once('exit', done);
      child.once('close', done);
    });
    this.exited = Promise.all([exit, ...this.readers.map((r) => r.ended)]).then(([[code, signal]]) => {
      this.oomKilled = SandboxCgroups.of(sandboxId).oomKills() > this.oomBefore;
      this.exitCode = exitCodeOf(code, signal);
      this.exitedAt = new Date().toISOString();
      this.signal = signal;
      for (const t of this.timers) clearTimeout(t);
      if (this.disconnectTimer) clearTimeout(this.disconnectTimer);
      for (const [ws, socket] of this.clients) this.sendExit(ws, socket);
      this.keepScrollback();
    });
    if (req.timeout) {
      this.timers.push(
        setTimeout(() => {
          this.timedOut = true;
          this.kill('SIGKILL');
        }, req.timeout * 1000),
      );
    }
  }

  get running(): boolean {
    return this.exitCode === null;
  }

  /** Resolves when the command has exited and its output is drained. */
  wait(): Promise<void> {
    return this.exited;
  }

  info(): ExecSessionInfo {
    return {
      sessionID: this.id,
      sandboxID: this.sandboxId,
      command: this.req.cmd,
      args: this.req.args ?? [],
      running: this.running,
      exitCode: this.exitCode,
      startedAt: this.startedAt,
      attachedClients: this.clients.size,
      exitedAt: this.exitedAt,
      ...(this.exitCode !== null ? { oomKilled: this.oomKilled } : {}),
    };
  }

  /** What the scrollback holds of each stream (the last 1 MiB of each), as text; `truncated` when output was dropped. */
  collected(): { stdout: string; stderr: string; truncated?: true } {
    const pick = (kind: number) => Buffer.concat(this.scrollback.filter((c) => c.kind === kind).map((c) => c.data)).toString('utf8');
    return { stdout: pick(FRAME_STDOUT), stderr: pick(FRAME_STDERR), ...(this.trimmed ? { truncated: true as const } : {}) };
  }

  /** Signals the command's whole process group; no-op once it exited. */
  kill(signal: NodeJS.Signals | number = 'SIGKILL'): void {
    if (!this.running || !this.child.pid) return;
    try {
      process.kill(-this.child.pid, signal);
    } catch {
      /* already gone */
    }
  }

  /** One chunk of output: into the scrollback, then to every client. `slab` holds `data` (see ./output-reader). */
  private output(kind: number, data: Buffer, slab: Slab | null): void {
    slab?.retain();
    this.scrollback.push({ kind, data, slab });
    this.scrollBytes[kind] += data.length;
    while (this.scrollBytes[kind] > SCROLLBACK_BYTES) {
      this.trimmed = true;
      const i = this.scrollback.findIndex((c) => c.kind === kind);
      const chunk = this.scrollback[i];
      const excess = this.scrollBytes[kind] - SCROLLBACK_BYTES;
      if (chunk.data.length <= excess) {
        this.scrollback.splice(i, 1);
        this.scrollBytes[kind] -= chunk.data.length;
        chunk.slab?.release();
      } else {
        chunk.data = chunk.data.subarray(excess);
        this.scrollBytes[kind] -= excess;
      }
    }
    if (this.clients.size === 0) return;
    const chunks = [data];
    for (const [ws, socket] of this.clients) {
      if (ws.readyState !== WebSocket.OPEN) continue;
      slab?.retain();
      writeBinaryFrame(socket, kind, chunks, slab?.releaseFn);
      this.checkBacklog(ws);
    }
    this.checkPressure();
  }

  /** Once the command is done: the scrollback in memory of its own, the reused memory given back. */
  private keepScrollback(): void {
    for (const c of this.scrollback) {
      if (!c.slab) continue;
      c.data = Buffer.from(c.data);
      c.slab.release();
      c.slab = null;
    }
  }

  private readonly onDrain = () => this.checkPressure();

  /** The exit frame (0x03 + int32 BE), then a normal close. */
  private sendExit(ws: WebSocket, socket: Socket): void {
    if (ws.readyState !== WebSocket.OPEN) return;
    const code = Buffer.alloc(4);
    code.writeInt32BE(this.exitCode as number, 0);
    writeBinaryFrame(socket, FRAME_EXIT, [code], () => ws.close(1000, 'exited'));
  }

  /** A client with more than backlogMax unsent is dropped (close 1008), so that it cannot pin memory. */
  private checkBacklog(ws: WebSocket): void {
    if (ws.bufferedAmount <= this.backlogMax || !this.clients.delete(ws)) return;
    this.log.info({ sandboxId: this.sandboxId, execId: this.id, unsent: ws.bufferedAmount }, 'exec client dropped: not reading');
    ws.close(1008, `client not reading: more than ${this.backlogMax} bytes unsent`);
    // The close frame queues behind what the client did not read: do not wait for it.
    ws.terminate();
    this.checkPressure();
  }

  private checkPressure(): void {
    let max = 0;
    for (const ws of this.clients.keys()) max = Math.max(max, ws.bufferedAmount);
    if (!this.paused && max > HIGH_WATER) {
      this.paused = true;
      for (const r of this.readers) r.pause();
      // Look again when a slow client's socket has written what it holds (no callback per frame).
      for (const [ws, socket] of this.clients) {
        if (ws.bufferedAmount < LOW_WATER) continue;
        socket.off('drain', this.onDrain);
        socket.once('drain', this.onDrain);
      }
    } else if (this.paused && max < LOW_WATER) {
      this.paused = false;
      for (const r of this.readers) r.resume();
    }
  }

  /**
   * Attaches a WebSocket client: scrollback, end-of-scrollback marker, then live output and stdin.
   * `socket` is the connection `ws` was upgraded on (output frames are written on it directly).
   */
  attach(ws: WebSocket, socket: Socket): void {
    if (this.disconnectTimer) {
      clearTimeout(this.disconnectTimer);
      this.disconnectTimer = undefined;
    }
    for (const c of this.scrollback) {
      c.slab?.retain();
      writeBinaryFrame(socket, c.kind, [c.data], c.slab?.releaseFn);
    }
    writeBinaryFrame(socket, FRAME_SCROLLBACK_END, []);
    if (!this.running) {
      this.sendExit(ws, socket);
      return;
    }
    this.clients.set(ws, socket);
    this.checkBacklog(ws);
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      const buf = Buffer.isBuffer(data) ? data : Buffer.from(data as unknown as ArrayBuffer);
      if (!isBinary || buf.length === 0 || buf[0] !== FRAME_STDIN) return;
      if (buf.length === 1) this.child.stdin?.end();
      else if (this.child.stdin?.writable) this.child.stdin.write(buf.subarray(1));
    });
    const detach = () => {
      if (!this.clients.delete(ws)) return;
      this.checkPressure();
      if (this.clients.size === 0 && this.running && this.req.maxRunAfterDisconnect !== undefined) {
        this.disconnectTimer = setTimeout(() => {
          this.log.info({ sandboxId: this.sandboxId, execId: this.id }, 'exec killed: no client attached');
          this.kill('SIGKILL');
        }, this.req.maxRunAfterDisconnect * 1000);
      }
    };
    ws.on('close', detach);
    ws.on('error', detach);
  }

  /** Closes every client socket (the command keeps running). */
  closeClients(): void {
    for (const ws of this.clients.keys()) ws.terminate();
    this.clients.clear();
  }
}

type Wrap = (fn: (req: Request, res: Response) => Promise<void>) => (req: Request, res: Response, next: NextFunction) => void;
type Parse = <S extends z.ZodType>(schema: S, req: Request) => z.infer<S>;

/** Owns the exec sessions of every sandbox on this host. */
export class ExecManager {
  private readonly sessions = new Map<string, Map<string, ExecSession>>();
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
      throw new SandboxError('rate_limited', `sandbox ${sandboxId} already runs ${max} exec sessions (EXEC_SESSIONS_PER_SANDBOX); wait for one to exit or kill one`);
    }
    this.starting.set(sandboxId, starting + 1);
    let child: PipedProcess;
    try {
      child = await this.provider.spawnPiped(sandboxId, { argv: [req.cmd, ...(req.args ?? [])], env: req.envs, cwd: req.cwd });
    } finally {
      const n = (this.starting.get(sandboxId) ?? 1) - 1;
      if (n > 0) this.starting.set(sandboxId, n);
      else this.starting.delete(sandboxId);
    }
    const session = new ExecSession(sandboxId, req, child, this.logger, this.limits.EXEC_WS_BACKLOG_MAX_BYTES);
    let map = this.sessions.get(sandboxId);
    if (!map) this.sessions.set(sandboxId, (map = new Map()));
    map.set(session.id, session);
    void session.wait().then(() => this.prune(sandboxId));
    return session;
  }

  private prune(sandboxId: string): void {
    const map = this.sessions.get(sandboxId);
    if (!map) return;
    const exited = [...map.values()].filter((s) => !s.running);
    for (const s of exited.slice(0, Math.max(0, exited.length - KEEP_EXITED))) map.delete(s.id);
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
    const oomBefore = SandboxCgroups.of(sandboxId).oomKills();
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
    child.stdout?.on('data', keep(out, 'out'));
    child.stderr?.on('data', keep(err, 'err'));
    child.stdin?.on('error', () => undefined);
    child.stdin?.end(req.stdin ?? '');
    const timer = req.timeout
      ? setTimeout(() => {
          timedOut = true;
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
  routes(app: express.Express, h: Wrap, parse: Parse): void {
    app.post('/sandboxes/:id/exec/run', h(async (req, res) => {
      const { params, body } = parse(z.object({ params: idParams, body: execSchema.extend({ stdin: z.string().optional() }) }), req);
      res.json(await this.run(params.id, body));
    }));
    app.post('/sandboxes/:id/exec', h(async (req, res) => {
      const { params, body } = parse(z.object({ params: idParams, body: execSchema }), req);
      res.status(201).json((await this.start(params.id, body)).info());
    }));
    app.get('/sandboxes/:id/exec', h(async (req, res) => {
      const { params } = parse(z.object({ params: idParams }), req);
      if (!this.provider.get(params.id)) throw new SandboxError('not_found', `sandbox ${params.id} not found`);
      res.json(this.list(params.id).map((s) => s.info()));
    }));
    app.get('/sandboxes/:id/exec/:sid', h(async (req, res) => {
      const { params } = parse(z.object({ params: sessionParams }), req);
      res.json(this.get(params.id, params.sid).info());
    }));
    // The result so far: waits up to waitMs (at most 30 s) for the command to exit first.
    app.get('/sandboxes/:id/exec/:sid/result', h(async (req, res) => {
      const { params, query } = parse(
        z.object({ params: sessionParams, query: z.object({ waitMs: z.coerce.number().int().min(0).max(30_000).default(0) }) }),
        req,
      );
      const s = this.get(params.id, params.sid);
      if (s.running && query.waitMs > 0) {
        let timer: NodeJS.Timeout | undefined;
        const gone = new Promise<void>((resolve) => res.on('close', resolve));
        await Promise.race([s.wait(), gone, new Promise<void>((resolve) => (timer = setTimeout(resolve, query.waitMs)))]);
        clearTimeout(timer);
      }
      res.json({ ...s.info(), timedOut: s.timedOut, ...s.collected() });
    }));
    app.post('/sandboxes/:id/exec/:sid/kill', h(async (req, res) => {
      const { params, body } = parse(
        z.object({ params: sessionParams, body: z.object({ signal: z.string().optional() }).optional() }),
        req,
      );
      const signal = body?.signal ?? 'SIGKILL';
      if (!(signal in osConstants.signals)) throw new SandboxError('invalid_request', `unknown signal ${signal}`);
      const s = this.get(params.id, params.sid);
      s.kill(signal as NodeJS.Signals);
      res.json(s.info());
    }));
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

const WS_PATH = /^\/sandboxes\/([^/]+)\/exec\/([^/]+)\/ws$/;
const PTY_WS_PATH = /^\/sandboxes\/([^/]+)\/pty\/([^/]+)\/ws$/;

/** Handles WebSocket upgrades for exec (and terminal) attachment (bearer token in the `authorization` header). */
/** `GET /sandboxes/:id/ports/:port/tunnel` with `Upgrade: sap-tunnel`: a raw byte pipe to a sandbox port. */
const TUNNEL_PATH = /^\/sandboxes\/([^/]+)\/ports\/(\d{1,5})\/tunnel$/;
export const TUNNEL_PROTOCOL = 'sap-tunnel';

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
          reject(errorStatus[type as keyof typeof errorStatus] ?? 500, type, err.message);
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
    });
  });
}

function http_status(status: number): string {
  return http.STATUS_CODES[status] ?? 'Error';
}
