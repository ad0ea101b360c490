/**
 * Starts detached processes (sandbox inits, entrypoint wrappers, exec commands with pipes) through one long-lived helper
 * (sandbox/spawner.py, on posix_spawn) instead of forking the host: a fork copies the page tables
 * of the whole Node process, several milliseconds of CPU on the host's only thread per process.
 * Without python3, or when the helper cannot be started, it falls back to child_process.spawn.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { closeSync, constants as fsc, existsSync, openSync } from 'node:fs';
import net from 'node:net';
import { constants as osc } from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import type { Readable, Writable } from 'node:stream';

export interface DetachedSpawn {
  /** argv[0] must be an absolute path. */
  argv: string[];
  env: Record<string, string>;
  /** Files the process's stdout and stderr are appended to (/dev/null when absent). */
  stdout?: string;
  stderr?: string;
  /** A file opened (truncated) for writing as descriptor 3. */
  fd3?: string;
}

const SCRIPT = path.join(__dirname, 'spawner.py');
const SOURCE_SCRIPT = path.resolve(__dirname, '..', '..', 'sandbox', 'spawner.py');

interface Answer {
  id?: number;
  pid?: number;
  fds?: number[];
  failed?: { path: string; error: string }[];
  error?: string;
  /** An event, not an answer: an "exec" command's exit. */
  exit?: number;
  code?: number | null;
  signal?: number | null;
}

/** What a process started in a sandbox with piped stdio offers (a ChildProcess is one). */
export interface PipedProcess extends EventEmitter {
  readonly pid?: number;
  readonly stdin: Writable | null;
  readonly stdout: Readable | null;
  readonly stderr: Readable | null;
  /**
   * Signals the command's process group where it has no host pid (a command of a sandbox's exec
   * server, sandbox/namespaces/exec-channel): `pid` is then undefined, and this is how it is signalled.
   */
  signalGroup?(signal: NodeJS.Signals | number): void;
}

const SIGNAL_NAMES = new Map<number, NodeJS.Signals>(Object.entries(osc.signals).map(([name, n]) => [n, name as NodeJS.Signals]));

/**
 * A command the helper started with pipes (see Spawner.exec): events and streams as a
 * ChildProcess has them ('exit' with (code, signal), then 'close' once stdout and stderr closed).
 */
class HelperProcess extends EventEmitter implements PipedProcess {
  stdin: Writable | null = null;
  stdout: Readable | null = null;
  stderr: Readable | null = null;
  exitCode: number | null = null;
  signalCode: NodeJS.Signals | null = null;
  private exited = false;
  private open = 0;
  private closed = false;

  constructor(readonly pid: number) {
    super();
  }

  attach(stdin: Writable | null, stdout: Readable, stderr: Readable): void {
    this.stdin = stdin;
    this.stdout = stdout;
    this.stderr = stderr;
    for (const s of [stdout, stderr]) {
      this.open++;
      s.once('close', () => {
        this.open--;
        this.maybeClose();
      });
    }
  }

  ended(code: number | null, signal: NodeJS.Signals | null): void {
    if (this.exited) return;
    this.exited = true;
    this.exitCode = code;
    this.signalCode = signal;
    this.emit('exit', code, signal);
    this.maybeClose();
  }

  private maybeClose(): void {
    if (!this.exited || this.open > 0 || this.closed || !this.stdout) return;
    this.closed = true;
    this.emit('close', this.exitCode, this.signalCode);
  }
}

interface Pending {
  resolve(answer: Answer): void;
  reject(err: Error): void;
}

export class Spawner {
  private helper: ChildProcess | null = null;
  private readonly pending = new Map<number, Pending>();
  private seq = 0;
  private disabled = false;
  /** "exec" commands not yet exited, by pid. */
  private readonly execs = new Map<number, HelperProcess>();
  /** Exits reported before the answer that started them was read (two threads of the helper write). */
  private readonly earlyExits = new Map<number, [number | null, NodeJS.Signals | null]>();
  /** Commands killed because their pipes could not be opened: their exits are dropped, not kept as early ones. */
  private readonly abandoned = new Set<number>();

  constructor(private readonly python = process.env.SAP_SPAWNER_PYTHON ?? '/usr/bin/python3') {}

  /** Starts the process detached (own session) and answers its pid. */
  async spawn(req: DetachedSpawn): Promise<number> {
    if (!path.isAbsolute(req.argv[0] ?? '')) throw new Error(`spawner: argv[0] must be absolute: ${req.argv[0]}`);
    const answer = await this.ask(req);
    if (!answer) return fallbackSpawn(req);
    if (typeof answer.pid !== 'number') throw new Error(`spawner: ${answer.error ?? 'no pid'}`);
    return answer.pid;
  }

  /**
   * The helper's pid, starting it if needed; null when there is none (commands then start through
   * child_process). A command started by exec names it as the caller it hangs up with.
   */
  helperPid(): number | null {
    const helper = this.disabled ? null : this.ensureHelper();
    return helper?.pid ?? null;
  }

  /**
   * Starts a command with piped stdin, stdout and stderr in a session of its own, without forking
   * the host (its fork is what a burst of execs waited on: about 5 ms of the host's thread each).
   * The pipes are the helper's: the host opens its ends as /proc/<helper>/fd/<n>, then the helper
   * closes its copies. Null when there is no helper (the caller spawns by itself).
   */
  async exec(argv: string[], env: Record<string, string>, helperPid: number): Promise<PipedProcess | null> {
    if (!path.isAbsolute(argv[0] ?? '')) throw new Error(`spawner: argv[0] must be absolute: ${argv[0]}`);
    if (this.helper?.pid !== helperPid) return null;
    const answer = await this.ask({ op: 'exec', argv, env });
    if (!answer) return null;
    if (typeof answer.pid !== 'number' || !answer.fds || answer.fds.length !== 3) throw new Error(`spawner: ${answer.error ?? 'no pid'}`);
    const fds = answer.fds;
    const child = new HelperProcess(answer.pid);
    const opened: number[] = [];
    try {
      const reopen = (n: number, flags: number) => {
        const fd = openSync(`/proc/${helperPid}/fd/${n}`, flags | fsc.O_NONBLOCK);
        opened.push(fd);
        return fd;
      };
      const outFd = reopen(fds[1]!, fsc.O_RDONLY);
      const errFd = reopen(fds[2]!, fsc.O_RDONLY);
      // ENXIO: the command has already closed its stdin (or exited); it reads nothing more.
      let inFd: number | null = null;
      try {
        inFd = reopen(fds[0]!, fsc.O_WRONLY);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENXIO') throw err;
      }
      const stdin = inFd === null ? null : new net.Socket({ fd: inFd, readable: false, writable: true });
      child.attach(stdin, new net.Socket({ fd: outFd, readable: true, writable: false }), new net.Socket({ fd: errFd, readable: true, writable: false }));
    } catch (err) {
      for (const fd of opened) closeSync(fd);
      // Its exit may have come already (early), or comes later: either way nobody waits for it.
      if (!this.earlyExits.delete(answer.pid)) this.abandoned.add(answer.pid);
      try {
        process.kill(-answer.pid, 'SIGKILL');
      } catch {
        /* gone */
      }
      throw new Error(`spawner: could not open the pipes of ${argv[0]}: ${(err as Error).message}`);
    } finally {
      void this.ask({ op: 'release', fds })?.catch(() => undefined);
    }
    const early = this.earlyExits.get(answer.pid);
    if (early) {
      this.earlyExits.delete(answer.pid);
      // Not now: the caller has not attached its listeners yet (it does once this promise has
      // resolved), and a missed 'exit' left an exec session running forever. A ChildProcess never
      // emits 'exit' before spawn() returns either.
      setImmediate(() => child.ended(...early));
    } else {
      this.execs.set(answer.pid, child);
    }
    return child;
  }

  /** An "exec" command's exit, from the helper. */
  private exited(a: Answer): void {
    const pid = a.exit!;
    const status: [number | null, NodeJS.Signals | null] = [a.code ?? null, a.signal ? (SIGNAL_NAMES.get(a.signal) ?? 'SIGKILL') : null];
    if (this.abandoned.delete(pid)) return;
    const child = this.execs.get(pid);
    if (child) {
      this.execs.delete(pid);
      child.ended(...status);
    } else {
      this.earlyExits.set(pid, status);
    }
  }

  /**
   * Unmounts each path (lazily: MNT_DETACH) with the umount2 system call, without an exec, and
   * answers the ones that failed with why.
   */
  async umount(paths: string[], opts: { lazy?: boolean } = {}): Promise<{ path: string; error: string }[]> {
    if (paths.length === 0) return [];
    const answer = await this.ask({ op: 'umount', paths, lazy: !!opts.lazy });
    if (!answer) return fallbackUmount(paths, !!opts.lazy);
    if (!answer.failed) throw new Error(`spawner: ${answer.error ?? 'no answer to umount'}`);
    return answer.failed;
  }

  /** Sends one request to the helper and answers its answer, or null when there is no helper. */
  private ask(req: object): Promise<Answer> | null {
    const helper = this.disabled ? null : this.ensureHelper();
    if (!helper) return null;
    const id = ++this.seq;
    return new Promise<Answer>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      helper.stdin!.write(JSON.stringify({ id, ...req }) + '\n');
    });
  }

  /** Stops the helper (the processes it started live on). */
  close(): void {
    this.helper?.stdin?.end();
    this.helper = null;
  }

  private ensureHelper(): ChildProcess | null {
    if (this.helper) return this.helper;
    const script = existsSync(SCRIPT) ? SCRIPT : SOURCE_SCRIPT;
    if (!existsSync(this.python) || !existsSync(script)) {
      this.disabled = true;
      return null;
    }
    const helper = spawn(this.python, ['-I', '-u', script], { stdio: ['pipe', 'pipe', 'inherit'], detached: true });
    helper.unref();
    (helper.stdin as unknown as { unref?: () => void }).unref?.();
    (helper.stdout as unknown as { unref?: () => void }).unref?.();
    const lines = createInterface({ input: helper.stdout! });
    lines.on('line', (line) => {
      let answer: Answer;
      try {
        answer = JSON.parse(line) as Answer;
      } catch {
        return;
      }
      if (typeof answer.exit === 'number') return this.exited(answer);
      const p = answer.id !== undefined ? this.pending.get(answer.id) : undefined;
      if (!p) return;
      this.pending.delete(answer.id!);
      p.resolve(answer);
    });
    const gone = (why: string) => {
      if (this.helper !== helper) return;
      this.helper = null;
      for (const p of this.pending.values()) p.reject(new Error(`spawner: ${why}`));
      this.pending.clear();
      // Its commands named it as their caller: they are hung up (sap-sandbox-enter -P).
      for (const child of this.execs.values()) child.ended(null, 'SIGHUP');
      this.execs.clear();
      this.earlyExits.clear();
      this.abandoned.clear();
    };
    helper.on('exit', (code, signal) => gone(`helper exited (${signal ?? code})`));
    helper.on('error', (err) => {
      gone(err.message);
      this.disabled = true;
    });
    helper.stdin!.on('error', () => gone('helper stdin closed'));
    this.helper = helper;
    return helper;
  }
}

/** umount(8) for each path, when there is no helper. */
async function fallbackUmount(paths: string[], lazy: boolean): Promise<{ path: string; error: string }[]> {
  const failed: { path: string; error: string }[] = [];
  for (const p of paths) {
    await new Promise<void>((resolve) => {
      execFile('umount', lazy ? ['-l', p] : [p], (err) => {
        if (err) failed.push({ path: p, error: err.message.trim() });
        resolve();
      });
    });
  }
  return failed;
}

/** The same start through child_process.spawn (the host forks itself). */
function fallbackSpawn(req: DetachedSpawn): number {
  const fds: number[] = [];
  const open = (file: string | undefined, flags: string) => {
    const fd = openSync(file ?? '/dev/null', flags, 0o600);
    fds.push(fd);
    return fd;
  };
  try {
    const stdio: (number | 'ignore')[] = ['ignore', open(req.stdout, 'a'), open(req.stderr, 'a')];
    if (req.fd3) stdio.push(open(req.fd3, 'w'));
    const child = spawn(req.argv[0]!, req.argv.slice(1), { stdio, detached: true, env: req.env });
    child.on('error', () => undefined);
    child.unref();
    if (!child.pid) throw new Error(`could not start ${req.argv[0]}`);
    return child.pid;
  } finally {
    for (const fd of fds) closeSync(fd);
  }
}
