import { ChildProcess } from 'node:child_process';

/** How one supervised process is started: spawn it, then wait until it is ready. */
export interface ProcSpec {
  spawn(): ChildProcess;
  /** Resolves once the child serves; rejects if it cannot (the child may still be alive then). */
  ready(child: ChildProcess): Promise<void>;
}

export interface SupervisorOptions {
  /** Restart children that exit unexpectedly (off: a dead child stays dead, as before supervision). */
  restart: boolean;
  /** First restart delay; it doubles per death up to maxBackoffMs. */
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  /** A child that stayed up this long starts again from initialBackoffMs when it dies. */
  healthyAfterMs?: number;
  /** This many deaths of one child within crashWindowMs is a crash loop: give up. */
  maxDeaths?: number;
  crashWindowMs?: number;
  /** One line per death, restart and give-up. */
  log(line: string): void;
  /** The set of running children changed (a start, a death, a stop): e.g. rewrite a pid file. */
  onChange?(): void;
  /** A child is in a crash loop; nothing of it is restarted any more. */
  onGiveUp?(name: string, message: string): void;
  /** The clock for health and the crash window (default Date.now; a test moves its own). */
  now?(): number;
}

/** What the supervisor knows of one named process. */
interface Entry {
  spec: ProcSpec;
  child?: ChildProcess;
  /** True while the process should be running: false after stop() or give-up. */
  wanted: boolean;
  /** When the current child became ready (null: not ready yet). */
  readyAt: number | null;
  backoffMs: number;
  deaths: number[];
  restarts: number;
  timer?: NodeJS.Timeout;
}

const alive = (c: ChildProcess | undefined): c is ChildProcess => !!c && c.exitCode === null && c.signalCode === null;

const exitText = (code: number | null, signal: NodeJS.Signals | null) => (signal ? `signal ${signal}` : `code ${code}`);

/**
 * Keeps named child processes running. A child that exits while it is wanted is restarted after a
 * backoff (0.5 s doubling to 10 s by default, back to 0.5 s after 60 s of good health); one that dies
 * maxDeaths times within crashWindowMs is given up on. stop() is a deliberate stop: no restart.
 */
export class Supervisor {
  private readonly entries = new Map<string, Entry>();
  private readonly o: Required<Omit<SupervisorOptions, 'onChange' | 'onGiveUp'>> & Pick<SupervisorOptions, 'onChange' | 'onGiveUp'>;
  private closed = false;

  constructor(opts: SupervisorOptions) {
    this.o = { initialBackoffMs: 500, maxBackoffMs: 10_000, healthyAfterMs: 60_000, maxDeaths: 5, crashWindowMs: 60_000, now: Date.now, ...opts };
  }

  /**
   * Starts `name` (stopping a running one first) and resolves once it is ready. If it cannot get
   * ready, the child is killed, nothing restarts it, and the error is thrown.
   */
  async start(name: string, spec: ProcSpec): Promise<void> {
    const prev = this.entries.get(name);
    if (prev) await this.stop(name);
    const e: Entry = prev ?? { spec, wanted: true, readyAt: null, backoffMs: this.o.initialBackoffMs, deaths: [], restarts: 0 };
    Object.assign(e, { spec, wanted: true, backoffMs: this.o.initialBackoffMs, deaths: [] });
    this.entries.set(name, e);
    try {
      await this.launch(name, e);
    } catch (err) {
      e.wanted = false;
      if (alive(e.child)) {
        const child = e.child;
        const gone = new Promise((r) => child.once('exit', r));
        child.kill('SIGKILL');
        await gone;
      }
      throw err;
    }
  }

  /** Deliberately stops `name` (SIGKILL after escalateMs) and waits for it to exit. It stays stopped. */
  async stop(name: string, signal: NodeJS.Signals = 'SIGTERM', escalateMs = 15_000): Promise<void> {
    const e = this.entries.get(name);
    if (!e) return;
    e.wanted = false;
    clearTimeout(e.timer);
    e.timer = undefined;
    const child = e.child;
    if (!alive(child)) return;
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    child.kill(signal);
    const escalate = setTimeout(() => child.kill('SIGKILL'), escalateMs);
    await exited;
    clearTimeout(escalate);
  }

  /** Stops restarting anything (children are left to the caller's stop() calls). */
  close(): void {
    this.closed = true;
    for (const e of this.entries.values()) {
      clearTimeout(e.timer);
      e.timer = undefined;
    }
  }

  /** The pid of the running child, if any. */
  pid(name: string): number | undefined {
    const c = this.entries.get(name)?.child;
    return alive(c) ? c.pid : undefined;
  }

  /** Whether a restart of `name` is scheduled (its backoff is running). */
  restartScheduled(name: string): boolean {
    return this.entries.get(name)?.timer !== undefined;
  }

  /** How many times `name` was restarted after an unexpected exit. */
  restarts(name: string): number {
    return this.entries.get(name)?.restarts ?? 0;
  }

  /** Names with a running child, and their pids. */
  pids(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [name, e] of this.entries) if (alive(e.child) && e.child.pid) out[name] = e.child.pid;
    return out;
  }

  private async launch(name: string, e: Entry): Promise<void> {
    const child = e.spec.spawn();
    e.child = child;
    e.readyAt = null;
    child.once('exit', (code, signal) => this.exited(name, e, child, code, signal));
    // A spawn failure (e.g. a missing binary) arrives as 'error'; ready() then sees no live child.
    child.on('error', (err) => this.o.log(`${name}: ${err.message}`));
    this.o.onChange?.();
    await e.spec.ready(child);
    if (e.child === child && alive(child)) e.readyAt = this.o.now();
  }

  private exited(name: string, e: Entry, child: ChildProcess, code: number | null, signal: NodeJS.Signals | null): void {
    if (e.child !== child) return;
    this.o.onChange?.();
    // A deliberate stop, a start that failed (start() throws to its caller), or a supervisor that is closing.
    if (!e.wanted || this.closed || !this.o.restart) return;
    const now = this.o.now();
    if (e.readyAt !== null && now - e.readyAt >= this.o.healthyAfterMs) e.backoffMs = this.o.initialBackoffMs;
    e.deaths = [...e.deaths.filter((t) => now - t < this.o.crashWindowMs), now];
    if (e.deaths.length >= this.o.maxDeaths) {
      e.wanted = false;
      const message = `${name} died ${e.deaths.length} times within ${Math.round(this.o.crashWindowMs / 1000)} s (last: ${exitText(code, signal)}); giving up`;
      this.o.log(message);
      this.o.onGiveUp?.(name, message);
      return;
    }
    const delay = e.backoffMs;
    e.backoffMs = Math.min(e.backoffMs * 2, this.o.maxBackoffMs);
    const n = e.restarts + 1;
    this.o.log(`${name} (pid ${child.pid}) exited unexpectedly with ${exitText(code, signal)}; restart #${n} in ${delay} ms`);
    e.timer = setTimeout(() => {
      e.timer = undefined;
      if (!e.wanted || this.closed) return;
      e.restarts = n;
      this.launch(name, e).then(
        () => {
          if (e.readyAt !== null) this.o.log(`${name} restarted (pid ${e.child?.pid}, restart #${n})`);
        },
        (err: Error) => {
          // A child that died before it was ready was logged as a death already. One that still runs
          // but is not ready is killed: its exit counts as the next death.
          if (!alive(e.child) || !e.wanted) return;
          this.o.log(`${name} restart #${n} failed: ${err.message}`);
          e.child.kill('SIGKILL');
        },
      );
    }, delay);
  }
}
