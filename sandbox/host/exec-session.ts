/**
 * One exec session (see ./exec.ts for the protocol): the command's process, its scrollback, its
 * attached WebSocket clients and the backpressure between them.
 */
import { randomBytes } from 'node:crypto';
import { constants as osConstants } from 'node:os';
import type { Logger } from 'pino';
import { WebSocket } from 'ws';
import { SandboxCgroups } from '../proc-refs-and-cgroups';
import type { PipedProcess } from '../spawner';
import type { ExecRequest, ExecSessionInfo } from '../host-contract/types';
import { writeBinaryFrame, type FrameSink } from '../host-contract/frames';
import { FRAME_EXIT, FRAME_SCROLLBACK_END, FRAME_STDERR, FRAME_STDIN, FRAME_STDOUT } from '../host-contract/exec-frames';
import { readOutput, type OutputReader, type Slab } from './output-reader';

const SCROLLBACK_BYTES = 1024 * 1024;
const HIGH_WATER = 1024 * 1024;
const LOW_WATER = 256 * 1024;
export const KEEP_EXITED = 50;

/** Exit code as a shell reports it: the code, or 128 + signal number. */
export function exitCodeOf(code: number | null, signal: NodeJS.Signals | null): number {
  if (code !== null) return code;
  return 128 + (signal ? (osConstants.signals[signal] ?? 0) : 0);
}

/** An exec session's id: `es-` and 16 hex digits (EXEC_SESSION_ID). */
export function newExecSessionId(): string {
  return `es-${randomBytes(8).toString('hex')}`;
}

/**
 * An attached client as the session uses it: a `ws` WebSocket, or an HTTP answer that carries the
 * same frames (./exec-frames-client.ts).
 */
export interface ExecClient {
  readonly readyState: number;
  readonly bufferedAmount: number;
  close(code?: number, reason?: string): void;
  terminate(): void;
  on(event: 'message', fn: (data: Buffer, isBinary: boolean) => void): unknown;
  on(event: 'close' | 'error', fn: () => void): unknown;
}

/** Where a client's frames are written (its connection, or its HTTP answer). */
export type ClientSink = FrameSink & { once(event: 'drain', fn: () => void): unknown; off(event: 'drain', fn: () => void): unknown };

/** One command running (or finished) inside a sandbox. */
export class ExecSession {
  readonly id: string;
  readonly startedAt = new Date().toISOString();
  /** Attached clients and where their output frames are written. */
  readonly clients = new Map<ExecClient, ClientSink>();
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
    /** Its id when the control plane chose it (ExecRequest.sessionID); else a new one. */
    id?: string,
  ) {
    this.id = id ?? newExecSessionId();
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
    if (!this.running) return;
    if (this.child.signalGroup) return this.child.signalGroup(signal);
    if (!this.child.pid) return;
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

  /**
   * The exit frame (0x03 + int32 BE), then a normal close. The client is no longer attached from
   * here: it gets nothing more, so a read of the session right after its exit does not count it.
   */
  private sendExit(ws: ExecClient, socket: ClientSink): void {
    this.clients.delete(ws);
    if (ws.readyState !== WebSocket.OPEN) return;
    const code = Buffer.alloc(4);
    code.writeInt32BE(this.exitCode as number, 0);
    writeBinaryFrame(socket, FRAME_EXIT, [code], () => ws.close(1000, 'exited'));
  }

  /** A client with more than backlogMax unsent is dropped (close 1008), so that it cannot pin memory. */
  private checkBacklog(ws: ExecClient): void {
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
   * `socket` is the connection `ws` was upgraded on (output frames are written on it directly), or
   * the HTTP answer of a frames client.
   */
  attach(ws: ExecClient, socket: ClientSink): void {
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
