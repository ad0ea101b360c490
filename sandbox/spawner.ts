/**
 * Starts detached processes (sandbox inits, entrypoint wrappers) through one long-lived helper
 * (sandbox/spawner.py, on posix_spawn) instead of forking the host: a fork copies the page tables
 * of the whole Node process, several milliseconds of CPU on the host's only thread per process.
 * Without python3, or when the helper cannot be started, it falls back to child_process.spawn.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, openSync } from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';

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
  failed?: { path: string; error: string }[];
  error?: string;
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
