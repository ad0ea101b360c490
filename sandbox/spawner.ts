/**
 * Starts detached processes (sandbox inits, entrypoint wrappers) through one long-lived helper
 * (sandbox/spawner.py, on posix_spawn) instead of forking the host: a fork copies the page tables
 * of the whole Node process, several milliseconds of CPU on the host's only thread per process.
 * Without python3, or when the helper cannot be started, it falls back to child_process.spawn.
 */
import { spawn, type ChildProcess } from 'node:child_process';
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

interface Pending {
  resolve(pid: number): void;
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
    const helper = this.disabled ? null : this.ensureHelper();
    if (!helper) return fallbackSpawn(req);
    const id = ++this.seq;
    return new Promise<number>((resolve, reject) => {
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
      let answer: { id?: number; pid?: number; error?: string };
      try {
        answer = JSON.parse(line) as typeof answer;
      } catch {
        return;
      }
      const p = answer.id !== undefined ? this.pending.get(answer.id) : undefined;
      if (!p) return;
      this.pending.delete(answer.id!);
      if (typeof answer.pid === 'number') p.resolve(answer.pid);
      else p.reject(new Error(`spawner: ${answer.error ?? 'no pid'}`));
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
