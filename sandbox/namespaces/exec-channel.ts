/**
 * The host's end of a sandbox's exec channel: commands started by the sandbox's own pid 1 (its exec
 * server, tools/sandbox-init/exec-server.h), their output, stdin, signals and exits as frames of
 * ../host-contract/exec-wire on one unix connection the host accepted (docs/exec-server.md).
 *
 * The server is the sandbox's: everything it says is checked (the frame reader), only commands this
 * host started are known, output is bounded by the credit window per stream, and the first
 * violation closes this channel alone (the server then hangs its commands up, the sessions here end
 * as hung up, and the sandbox's later commands start through sap-sandbox-enter).
 */
import { EventEmitter } from 'node:events';
import type * as net from 'node:net';
import { constants as osc } from 'node:os';
import { Readable, Writable } from 'node:stream';
import type { Logger } from 'pino';
import {
  EXEC_CHUNK,
  EXEC_MAX_COMMANDS,
  EXEC_WINDOW,
  EXEC_WIRE_VERSION,
  ExecFrameReader,
  ExecWireError,
  encodeCredit,
  encodeSignal,
  encodeStart,
  encodeStdin,
  encodeStdinEof,
  T_EOF,
  T_EXIT,
  T_FAILED,
  T_HELLO,
  T_STARTED,
  T_STDERR,
  T_STDIN_CREDIT,
  T_STDOUT,
  type ServerFrame,
  type StartRequest,
} from '../host-contract/exec-wire';
import { SandboxError } from '../../contract/errors';
import type { PipedProcess } from '../spawner';

const SIGNAL_NAMES = new Map<number, NodeJS.Signals>(Object.entries(osc.signals).map(([name, n]) => [n, name as NodeJS.Signals]));
/** What a stream holds beyond the window before its consumer reads (Readable's buffer). */
const STREAM_HIGH_WATER = 64 * 1024;

/** One output stream of a command: credits what its consumer has taken. */
class OutputStream extends Readable {
  /** Received and not yet credited (the consumer has not taken it yet). */
  held = 0;
  /** Sent by the server and not yet credited: at most EXEC_WINDOW. */
  inflight = 0;
  ended = false;

  constructor(private readonly credit: (bytes: number) => void) {
    super({ highWaterMark: STREAM_HIGH_WATER });
  }

  override _read(): void {
    this.flush();
  }

  receive(data: Buffer): void {
    // Counted before the push: the stream may ask for more (_read) from inside it.
    this.inflight += data.length;
    this.held += data.length;
    // A large chunk stays a view of the socket's read (it is most of it); a small one is copied, so
    // that a scrollback of small chunks never holds the larger reads they came in.
    if (this.push(data.length >= 16 * 1024 ? data : Buffer.from(data))) this.flush();
  }

  /** Credits what the stream has taken in below its high-water mark. */
  private flush(): void {
    if (this.held <= 0) return;
    const n = this.held;
    this.held = 0;
    this.inflight -= n;
    this.credit(n);
  }
}

/** A command the exec server started: a ChildProcess's events and streams ('exit', then 'close'). */
export class ChannelProcess extends EventEmitter implements PipedProcess {
  /** No host pid: the command is a process of the sandbox (its pid there: `sandboxPid`). */
  readonly pid = undefined;
  sandboxPid = 0;
  readonly stdout: OutputStream;
  readonly stderr: OutputStream;
  readonly stdin: Writable;
  exitCode: number | null = null;
  signalCode: NodeJS.Signals | null = null;
  exited = false;
  private exitEmitted = false;
  private open = 2;
  private closed = false;
  /** Stdin sent and not yet acknowledged; writes wait while it is at the window. */
  stdinInflight = 0;
  private stdinWaiting: { data: Buffer; cb: (err?: Error | null) => void } | null = null;
  private readonly startedP: Promise<void>;
  private resolveStarted!: () => void;
  private rejectStarted!: (err: Error) => void;

  constructor(
    private readonly channel: ExecChannel,
    readonly id: number,
  ) {
    super();
    this.startedP = new Promise<void>((resolve, reject) => {
      this.resolveStarted = resolve;
      this.rejectStarted = reject;
    });
    this.startedP.catch(() => undefined);
    this.stdout = new OutputStream((n) => channel.send(encodeCredit(id, 1, n)));
    this.stderr = new OutputStream((n) => channel.send(encodeCredit(id, 2, n)));
    for (const s of [this.stdout, this.stderr]) {
      s.once('close', () => {
        this.open--;
        this.maybeClose();
      });
    }
    this.stdin = new Writable({
      highWaterMark: EXEC_CHUNK,
      write: (chunk: Buffer, _enc, cb) => this.writeStdin(chunk, cb),
      final: (cb) => {
        if (!this.exited || this.open > 0) channel.send(encodeStdinEof(id));
        cb();
      },
    });
  }

  started(): Promise<void> {
    return this.startedP;
  }

  /** Signals the command's process group (through the server); nothing once its pipes have closed. */
  signalGroup(signal: NodeJS.Signals | number): void {
    if (this.closed) return;
    const n = typeof signal === 'number' ? signal : osc.signals[signal];
    if (n) this.channel.send(encodeSignal(this.id, n));
  }

  kill(signal: NodeJS.Signals | number = 'SIGTERM'): boolean {
    this.signalGroup(signal);
    return true;
  }

  private writeStdin(chunk: Buffer, cb: (err?: Error | null) => void): void {
    const room = EXEC_WINDOW - this.stdinInflight;
    if (room <= 0) {
      this.stdinWaiting = { data: chunk, cb };
      return;
    }
    const now = chunk.subarray(0, room);
    this.stdinInflight += now.length;
    for (const f of encodeStdin(this.id, now)) this.channel.send(f);
    if (now.length < chunk.length) this.stdinWaiting = { data: chunk.subarray(now.length), cb };
    else cb();
  }

  /** STDIN_CREDIT from the server; false when it acknowledges more than was sent. */
  stdinCredit(bytes: number): boolean {
    if (bytes > this.stdinInflight) return false;
    this.stdinInflight -= bytes;
    const w = this.stdinWaiting;
    if (w) {
      this.stdinWaiting = null;
      this.writeStdin(w.data, w.cb);
    }
    return true;
  }

  onStarted(pid: number): void {
    this.sandboxPid = pid;
    this.resolveStarted();
  }

  onFailed(err: Error): void {
    this.rejectStarted(err);
  }

  onExit(code: number | null, signal: number | null): void {
    this.exited = true;
    this.exitCode = code;
    this.signalCode = signal ? (SIGNAL_NAMES.get(signal) ?? 'SIGKILL') : null;
    // Not now: a start and its exit can come in one read, before the caller has attached its
    // listeners (it does once the start's promise has resolved). A ChildProcess never emits 'exit'
    // before spawn() returns either.
    setImmediate(() => {
      this.exitEmitted = true;
      this.emit('exit', this.exitCode, this.signalCode);
      this.maybeClose();
    });
  }

  /** The channel is gone: the command was hung up by the server (as when the host's helper dies). */
  onLost(why: Error): void {
    this.rejectStarted(why);
    for (const s of [this.stdout, this.stderr]) {
      if (!s.ended) {
        s.ended = true;
        s.push(null);
      }
    }
    this.stdinWaiting?.cb(why);
    this.stdinWaiting = null;
    if (!this.exited) this.onExit(null, osc.signals.SIGHUP);
  }

  /** Whether every frame for this command has come (exit and both ends of output). */
  get done(): boolean {
    return this.exited && this.stdout.ended && this.stderr.ended;
  }

  private maybeClose(): void {
    if (!this.exitEmitted || this.open > 0 || this.closed) return;
    this.closed = true;
    this.emit('close', this.exitCode, this.signalCode);
  }
}

/** One sandbox's exec channel; see the module comment. */
export class ExecChannel {
  private readonly reader = new ExecFrameReader();
  private readonly commands = new Map<number, ChannelProcess>();
  private seq = 0;
  private hello = false;
  private closedWhy: string | null = null;
  private queue: Buffer[] = [];
  private flushing = false;
  /** Resolves true once the server said hello, false when the channel is gone first. */
  readonly ready: Promise<boolean>;
  private settleReady!: (ok: boolean) => void;
  /** Resolves with the reason once the channel has closed. */
  readonly gone: Promise<string>;
  private settleGone!: (why: string) => void;

  constructor(
    private readonly sock: net.Socket,
    readonly sandboxId: string,
    private readonly log: Logger,
  ) {
    this.ready = new Promise<boolean>((resolve) => (this.settleReady = resolve));
    this.gone = new Promise<string>((resolve) => (this.settleGone = resolve));
    sock.on('data', (chunk: Buffer) => {
      if (this.closedWhy) return;
      try {
        this.reader.push(chunk, (f) => this.frame(f));
      } catch (err) {
        this.violation(err instanceof ExecWireError ? err.message : String(err));
      }
    });
    sock.on('error', () => undefined);
    sock.on('close', () => this.lost('the exec server closed its connection'));
    sock.resume();
  }

  /** Open and greeted: commands can start through it. */
  get usable(): boolean {
    return this.hello && this.closedWhy === null;
  }

  /** Why it closed, or null. */
  get closedReason(): string | null {
    return this.closedWhy;
  }

  /** Commands the server runs for this host (started, not yet done). */
  get running(): number {
    return this.commands.size;
  }

  /**
   * Starts a command in the sandbox; null when the request does not fit one frame (the caller starts
   * it the other way). Throws rate_limited past EXEC_MAX_COMMANDS, conflict when the channel is gone.
   */
  async start(req: StartRequest): Promise<ChannelProcess | null> {
    if (!this.usable) throw new SandboxError('conflict', `the exec server of sandbox ${this.sandboxId} is gone`);
    if (this.commands.size >= EXEC_MAX_COMMANDS) {
      throw new SandboxError('rate_limited', `sandbox ${this.sandboxId} already runs ${EXEC_MAX_COMMANDS} commands through its exec server`);
    }
    const id = ++this.seq;
    const start = encodeStart(id, req);
    if (!start) return null;
    const proc = new ChannelProcess(this, id);
    this.commands.set(id, proc);
    this.send(start);
    try {
      await proc.started();
    } catch (err) {
      this.commands.delete(id);
      throw err;
    }
    return proc;
  }

  /** Queues a frame to the server (written once per turn of the event loop, corked). */
  send(frame: Buffer): void {
    if (this.closedWhy) return;
    this.queue.push(frame);
    if (this.flushing) return;
    this.flushing = true;
    setImmediate(() => {
      this.flushing = false;
      const q = this.queue;
      this.queue = [];
      if (this.closedWhy || this.sock.destroyed) return;
      this.sock.cork();
      for (const b of q) this.sock.write(b);
      this.sock.uncork();
    });
  }

  private frame(f: ServerFrame): void {
    if (f.type === T_HELLO) {
      if (this.hello) return this.violation('a second hello');
      if (f.version !== EXEC_WIRE_VERSION) return this.violation(`wire version ${f.version}, expected ${EXEC_WIRE_VERSION}`);
      this.hello = true;
      this.settleReady(true);
      return;
    }
    if (!this.hello) return this.violation('a frame before hello');
    const proc = this.commands.get(f.id);
    if (!proc) return this.violation(`frame 0x${f.type.toString(16)} for command ${f.id}, which this host is not running`);
    switch (f.type) {
      case T_STARTED:
        if (proc.sandboxPid) return this.violation(`command ${f.id} started twice`);
        if (f.pid < 2) return this.violation(`command ${f.id} started as pid ${f.pid}`);
        proc.onStarted(f.pid);
        return;
      case T_FAILED:
        if (proc.sandboxPid) return this.violation(`command ${f.id} failed after it started`);
        this.commands.delete(f.id);
        proc.onFailed(
          new SandboxError(
            f.errno === 11 ? 'rate_limited' : 'internal',
            `the exec server of sandbox ${this.sandboxId} could not start the command: ${f.message}`,
          ),
        );
        return;
      case T_STDOUT:
      case T_STDERR: {
        const s = f.type === T_STDOUT ? proc.stdout : proc.stderr;
        if (!proc.sandboxPid || s.ended) return this.violation(`output of command ${f.id} outside its life`);
        if (s.inflight + f.data.length > EXEC_WINDOW) return this.violation(`command ${f.id}: output past the window`);
        s.receive(f.data);
        return;
      }
      case T_EOF: {
        const s = f.stream === 1 ? proc.stdout : proc.stderr;
        if (!proc.sandboxPid || s.ended) return this.violation(`end of output of command ${f.id} twice`);
        s.ended = true;
        s.push(null);
        break;
      }
      case T_EXIT:
        if (!proc.sandboxPid || proc.exited) return this.violation(`exit of command ${f.id} twice`);
        proc.onExit(f.code, f.signal);
        break;
      case T_STDIN_CREDIT:
        if (!proc.stdinCredit(f.bytes)) return this.violation(`command ${f.id}: stdin acknowledged past what was sent`);
        return;
    }
    if (proc.done) this.commands.delete(f.id);
  }

  private violation(why: string): void {
    if (this.closedWhy) return;
    this.log.warn({ sandboxId: this.sandboxId, why }, 'exec server broke the wire: its channel is closed');
    this.lost(`the exec server broke the wire: ${why}`);
  }

  private lost(why: string): void {
    if (this.closedWhy) return;
    this.closedWhy = why;
    this.queue = [];
    this.sock.destroy();
    this.settleReady(false);
    this.settleGone(why);
    const err = new SandboxError('conflict', `sandbox ${this.sandboxId}: ${why}`);
    for (const p of this.commands.values()) p.onLost(err);
    this.commands.clear();
  }

  /** Closes the channel (the sandbox is going): the server hangs up what still runs. */
  close(): void {
    this.lost('closed by the host');
  }
}

/**
 * The exec channels of a provider's sandboxes, by sandbox id: each once its server has said hello,
 * null when it has none (adopted after a host restart, or its channel closed: the sandbox's commands
 * then start through sap-sandbox-enter). SANDBOX_EXEC_SERVER=off expects none (exec enters as
 * before, for comparison; a helper's channel is then refused and its pid 1 only reaps).
 */
export class ExecChannels {
  private readonly channels = new Map<string, Promise<ExecChannel | null>>();

  constructor(
    private readonly log: Logger,
    readonly enabled = process.env.SANDBOX_EXEC_SERVER !== 'off',
  ) {}

  /** Sandbox `id`'s channel will come on the connection `accept` resolves with (register before the helper has its arguments). */
  expect(id: string, accept: () => Promise<net.Socket | null>): void {
    if (!this.enabled) return;
    const channel = accept().then(async (sock) => {
      if (!sock) return null;
      const ch = new ExecChannel(sock, id, this.log);
      // Forgotten once closed (the sandbox's pid 1 is gone with the sandbox, or it broke the wire).
      void ch.gone.then(() => {
        if (this.channels.get(id) === channel) this.channels.delete(id);
      });
      return (await ch.ready) ? ch : null;
    });
    this.channels.set(id, channel);
    void channel.then((ch) => {
      if (!ch && this.channels.get(id) === channel) this.channels.delete(id);
    });
  }

  /**
   * Starts a command through sandbox `id`'s exec server; null when it has none serving, or the
   * request does not fit a frame (the caller then enters the old way). `target` answers the
   * command's working directory, user and environment (and throws when the sandbox's init is gone).
   */
  async spawn<S extends { id: string; status: string }>(
    state: S,
    opts: { argv: string[]; pty?: unknown },
    target: (state: S) => { cwd: string; uid: number; env: string[] },
  ): Promise<ChannelProcess | null> {
    const id = state.id;
    const channel = opts.pty ? null : await this.usable(id);
    if (!channel) return null;
    if (state.status !== 'running') throw new SandboxError('conflict', `sandbox ${id} is not running`);
    const t = target(state);
    if (!opts.argv.length || opts.argv[0]!.includes('=')) throw new SandboxError('invalid_request', 'argv must be non-empty and argv[0] must not contain "="');
    return channel.start({ uid: t.uid, cwd: t.cwd, argv: opts.argv, env: t.env });
  }

  /** The sandbox's channel when it serves, else null. */
  async usable(id: string): Promise<ExecChannel | null> {
    const ch = await this.channels.get(id);
    return ch?.usable ? ch : null;
  }

  async stateOf(id: string): Promise<{ usable: boolean; running: number; closedReason: string | null } | null> {
    const ch = await this.channels.get(id);
    return ch ? { usable: ch.usable, running: ch.running, closedReason: ch.closedReason } : null;
  }

  /** The sandbox is going: its channel closes (its server hangs up what still runs). */
  close(id: string): void {
    const ch = this.channels.get(id);
    this.channels.delete(id);
    void ch?.then((c) => c?.close());
  }
}
