/**
 * Terminals: a login shell on a pseudo-terminal of the sandbox's own devpts (sap-sandbox-enter -T),
 * kept by the host and attachable by WebSocket clients at `/sandboxes/:id/pty/:sid/ws`.
 *
 * WebSocket protocol (the OpenComputer client's `Pty`): client → server, text or binary frames are
 * keystrokes written to the terminal as they are, except a text frame that is the JSON
 * `{"type":"resize","cols":N,"rows":M}`, which resizes it (the shell gets SIGWINCH); server → client,
 * binary frames of terminal output. A client that attaches first gets the last 64 KiB of output.
 * When the shell exits, every socket is closed with 1000. Routes, schemas and the socket's path:
 * ../host-contract/wire.ts.
 *
 * A terminal whose last client left is killed after `PTY_DETACHED_MS` (30 s) unless one attaches
 * again; destroying (or hibernating) the sandbox kills it at once.
 */
import { randomBytes } from 'node:crypto';
import type { ChildProcess } from 'node:child_process';
import type { Writable } from 'node:stream';
import type { Logger } from 'pino';
import { WebSocket } from 'ws';
import { SandboxError } from '../../contract/errors';
import type { SandboxProvider } from '../driver';
import type { PtyInfo, PtyRequest } from '../host-contract/types';
import { hostRoutes } from '../host-contract/wire';
import { ptyResizeMessage } from '../host-contract/wire-schemas';
import type { Serve } from './serve';

const SCROLLBACK_BYTES = 64 * 1024;
export const PTY_DETACHED_MS = 30_000;
const KEEP_EXITED_MS = 60_000;

/** One shell on a terminal inside a sandbox. */
export class PtySession {
  readonly id = `pty-${randomBytes(8).toString('hex')}`;
  readonly startedAt = new Date().toISOString();
  readonly clients = new Set<WebSocket>();
  exitCode: number | null = null;
  private scrollback: Buffer[] = [];
  private scrollBytes = 0;
  private detachTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly sandboxId: string,
    public cols: number,
    public rows: number,
    private readonly child: ChildProcess,
    private readonly log: Logger,
    onEnd: () => void,
  ) {
    child.stdout?.on('data', (b: Buffer) => this.output(b));
    child.stderr?.on('data', (b: Buffer) => this.log.warn({ sandboxId, ptyId: this.id, stderr: b.toString('utf8').slice(0, 500) }, 'terminal helper'));
    child.stdin?.on('error', () => undefined);
    this.control?.on('error', () => undefined);
    child.on('error', (err) => this.log.warn({ err, sandboxId, ptyId: this.id }, 'terminal failed to start'));
    child.once('close', (code, signal) => {
      this.exitCode = code ?? 128 + (signal ? 9 : 0);
      if (this.detachTimer) clearTimeout(this.detachTimer);
      for (const ws of this.clients) ws.close(1000, 'exited');
      this.clients.clear();
      setTimeout(onEnd, KEEP_EXITED_MS).unref();
    });
    // Nobody attached within the grace: the same as a last client leaving.
    this.armDetachTimer();
  }

  get running(): boolean {
    return this.exitCode === null;
  }

  private get control(): Writable | null {
    return (this.child.stdio[3] as Writable | null | undefined) ?? null;
  }

  info(): PtyInfo {
    return {
      sessionID: this.id,
      sandboxID: this.sandboxId,
      cols: this.cols,
      rows: this.rows,
      running: this.running,
      exitCode: this.exitCode,
      startedAt: this.startedAt,
      attachedClients: this.clients.size,
    };
  }

  private output(b: Buffer): void {
    this.scrollback.push(b);
    this.scrollBytes += b.length;
    while (this.scrollBytes > SCROLLBACK_BYTES && this.scrollback.length > 1) this.scrollBytes -= this.scrollback.shift()!.length;
    for (const ws of this.clients) if (ws.readyState === WebSocket.OPEN) ws.send(b, { binary: true });
  }

  /** Writes keystrokes, or applies a resize message. */
  input(data: Buffer, isBinary: boolean): void {
    if (!isBinary && data.length < 200 && data[0] === 0x7b /* { */) {
      let parsed: unknown;
      try {
        parsed = JSON.parse(data.toString('utf8'));
      } catch {
        parsed = undefined;
      }
      const r = ptyResizeMessage.safeParse(parsed);
      if (r.success) {
        this.resize(r.data.rows, r.data.cols);
        return;
      }
    }
    if (this.child.stdin?.writable) this.child.stdin.write(data);
  }

  resize(rows: number, cols: number): void {
    this.rows = rows;
    this.cols = cols;
    this.control?.write(`${rows} ${cols}\n`);
  }

  attach(ws: WebSocket): void {
    if (this.detachTimer) clearTimeout(this.detachTimer);
    this.detachTimer = undefined;
    if (this.scrollback.length) ws.send(Buffer.concat(this.scrollback), { binary: true });
    if (!this.running) {
      ws.close(1000, 'exited');
      return;
    }
    this.clients.add(ws);
    ws.on('message', (data: Buffer, isBinary: boolean) => this.input(Buffer.isBuffer(data) ? data : Buffer.from(data as unknown as ArrayBuffer), isBinary));
    const detach = () => {
      if (!this.clients.delete(ws)) return;
      if (this.clients.size === 0) this.armDetachTimer();
    };
    ws.on('close', detach);
    ws.on('error', detach);
  }

  private armDetachTimer(): void {
    if (!this.running) return;
    this.detachTimer = setTimeout(() => {
      this.log.info({ sandboxId: this.sandboxId, ptyId: this.id }, 'terminal killed: no client attached');
      this.kill();
    }, PTY_DETACHED_MS);
    this.detachTimer.unref();
  }

  kill(): void {
    if (!this.running || !this.child.pid) return;
    try {
      process.kill(-this.child.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
}

/** Owns the terminals of every sandbox on this host. */
export class PtyManager {
  private readonly sessions = new Map<string, PtySession>();

  constructor(
    private readonly provider: SandboxProvider,
    private readonly logger: Logger,
  ) {}

  create(sandboxId: string, opts: PtyRequest): PtySession {
    if (!this.provider.get(sandboxId)) throw new SandboxError('not_found', `sandbox ${sandboxId} not found`);
    const child = this.provider.spawn(sandboxId, {
      argv: ['/bin/bash', '-l'],
      env: { TERM: 'xterm-256color', ...opts.envs },
      cwd: opts.cwd,
      pty: { rows: opts.rows, cols: opts.cols },
    });
    const s: PtySession = new PtySession(sandboxId, opts.cols, opts.rows, child, this.logger, () => {
      if (this.sessions.get(s.id) === s) this.sessions.delete(s.id);
    });
    this.sessions.set(s.id, s);
    return s;
  }

  /** A terminal of the sandbox; not_found otherwise. */
  get(sandboxId: string, id: string): PtySession {
    const s = this.sessions.get(id);
    if (!s || s.sandboxId !== sandboxId) throw new SandboxError('not_found', `terminal ${id} not found`);
    return s;
  }

  routes(serve: Serve): void {
    serve(hostRoutes.createPty, async ({ params: p, body }, res) => {
      res.status(201).json(this.create(p.id, body).info());
    });
    serve(hostRoutes.getPty, async ({ params: p }, res) => {
      res.json(this.get(p.id, p.sid).info());
    });
  }

  /** Kills the terminals of a sandbox (it is being destroyed or hibernated). */
  dropSandbox(sandboxId: string): void {
    for (const s of this.sessions.values()) if (s.sandboxId === sandboxId) s.kill();
  }

  /** Closes every client socket (the host is stopping; the terminals die with its helpers' hang-up). */
  close(): void {
    for (const s of this.sessions.values()) for (const ws of s.clients) ws.terminate();
  }
}
