/**
 * Teardowns behind destroy's answer (see NamespaceProvider.detach): a destroyed sandbox is stopped
 * and its names moved out of the way at once; what is left (its cgroups, disk image, staging and
 * scratch directories, id slot and network policy) is removed here, a few at a time.
 *
 * Written down in `${dataDir}/teardown/`: `<token>` is the sandbox's directory (moved there first,
 * so that a host that dies from then on never adopts the sandbox again), and `<token>.json` the
 * record, written once every name has moved. A host's start finishes every teardown found there
 * before it makes any sandbox or spare (replay); a directory without its record is a destroy that
 * died half-way, whose names are moved again first (nothing can have taken them: destroy had not
 * answered).
 */
import { existsSync, promises as fsp } from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'pino';

/** What is left of a destroyed sandbox to remove (the names as they were moved by detach). */
export interface TeardownRecord {
  id: string;
  token: string;
  /** Its cgroups' name now (`gone-<token>`). */
  groups: string;
  /** Its directory, moved into the teardown directory. */
  dir: string;
  disk: string | null;
  scratch: string | null;
  idBase?: number;
  address?: string;
}

/** At most this many teardowns run at once (default): the rest wait their turn. */
export const TEARDOWNS_IN_FLIGHT = 2;

export class PendingTeardowns {
  private readonly queue: TeardownRecord[] = [];
  private running = 0;
  private idle: (() => void)[] = [];

  constructor(
    readonly dir: string,
    private readonly finish: (rec: TeardownRecord) => Promise<void>,
    private readonly log: Logger,
    private readonly inFlight = TEARDOWNS_IN_FLIGHT,
    /** Tests only (SANDBOX_TEST_TEARDOWN_PAUSE_FILE): while this file exists no teardown starts (they stay written down). */
    private readonly pauseFile: string | null = null,
  ) {}

  async makeDir(): Promise<void> {
    await fsp.mkdir(this.dir, { recursive: true, mode: 0o700 });
    await fsp.chmod(this.dir, 0o700);
  }

  /** Where sandbox directory of teardown `token` is moved. */
  pathOf(token: string): string {
    return path.join(this.dir, token);
  }

  /** Writes the record (atomically: a temporary file renamed into place). */
  async record(rec: TeardownRecord): Promise<void> {
    const file = path.join(this.dir, `${rec.token}.json`);
    await fsp.writeFile(`${file}.tmp`, JSON.stringify(rec), { mode: 0o600 });
    await fsp.rename(`${file}.tmp`, file);
  }

  /** Teardowns queued or running (for tests and the host's metrics). */
  pending(): number {
    return this.queue.length + this.running;
  }

  /** Queues a recorded teardown. */
  enqueue(rec: TeardownRecord): void {
    this.queue.push(rec);
    this.pump();
  }

  /** Resolves once no teardown is queued or running. */
  drain(): Promise<void> {
    if (this.pending() === 0 || (this.pauseFile && existsSync(this.pauseFile))) return Promise.resolve();
    return new Promise((r) => this.idle.push(r));
  }

  private pump(): void {
    if (this.pauseFile && existsSync(this.pauseFile)) return;
    while (this.running < this.inFlight && this.queue.length) {
      const rec = this.queue.shift()!;
      this.running++;
      void this.finishOne(rec).finally(() => {
        this.running--;
        this.pump();
        if (this.pending() === 0) for (const r of this.idle.splice(0)) r();
      });
    }
  }

  private async finishOne(rec: TeardownRecord): Promise<void> {
    try {
      await this.finish(rec);
      await fsp.rm(path.join(this.dir, `${rec.token}.json`), { force: true });
    } catch (err) {
      // Left in the directory: the next start tries again.
      this.log.error({ err: (err as Error).message, sandboxId: rec.id }, 'teardown failed; retried at the next start');
    }
  }

  /**
   * Finishes every teardown written down (a host that stopped or died with some pending), waiting
   * for all: `redetach` moves the names of one whose record was never written and answers it.
   */
  async replay(redetach: (token: string) => Promise<TeardownRecord>): Promise<number> {
    await this.makeDir();
    const names = await fsp.readdir(this.dir);
    const tokens = new Set<string>();
    for (const n of names) {
      if (n.endsWith('.json.tmp')) await fsp.rm(path.join(this.dir, n), { force: true });
      else tokens.add(n.endsWith('.json') ? n.slice(0, -'.json'.length) : n);
    }
    for (const token of tokens) {
      let rec: TeardownRecord | null = null;
      try {
        rec = JSON.parse(await fsp.readFile(path.join(this.dir, `${token}.json`), 'utf8')) as TeardownRecord;
      } catch {
        rec = null;
      }
      this.enqueue(rec ?? (await redetach(token)));
    }
    await this.drain();
    if (tokens.size) this.log.info({ count: tokens.size }, 'teardowns left by an earlier run finished');
    return tokens.size;
  }
}
