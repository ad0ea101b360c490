/**
 * The host's entrypoint audit log: one NDJSON line per entrypoint run, appended and fsync'd once
 * the run's helper has claimed it (sap-sandbox-enter -R: the durable mark, written by the helper
 * before it does anything else, that the run began), so that every run of an agent leaves a
 * durable record on the host. A sandbox cannot leave such a record itself (its files, network and
 * host-side logs go with it), and a count of runs per session is what shows whether a crash made
 * an agent run twice.
 *
 * A line records a claim, never an intent: a start the host cancelled has none. A host that dies
 * after the claim and before its line is written leaves the line to the next host, which adopts
 * the run and records it with `recovered: true` unless the end of the log holds it already (see
 * hasRun). Should a run still have two lines, they share its `run`: the number of runs is the
 * number of distinct `run` values (see countRuns).
 */
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';

/** One line of the log. */
export interface AuditEntry {
  /** When the start was recorded (ISO 8601). */
  at: string;
  event: 'entrypoint_start';
  sandboxId: string;
  orgId: string;
  hostId: string;
  /** The sandbox's owner, e.g. `{ kind: 'session', id: 'sess_…' }`. */
  owner?: { kind: string; id: string };
  /** The run's id (unique per start; lines of an older host have none: each counts as a run). */
  run?: string;
  /** Written by a host that adopted the run after its predecessor died (it may have written one too). */
  recovered?: boolean;
}

/** Runs per owner id (of `kind`) in the text of an audit log: distinct `run` values, each line without one a run of its own. */
export function countRuns(text: string, kind = 'session'): Map<string, number> {
  const runs = new Map<string, Set<string>>();
  text.split('\n').forEach((l, i) => {
    if (!l.trim()) return;
    const e = JSON.parse(l) as Partial<AuditEntry>;
    if (e.event !== 'entrypoint_start' || e.owner?.kind !== kind) return;
    const set = runs.get(e.owner.id) ?? new Set<string>();
    set.add(e.run ?? `line ${i}`);
    runs.set(e.owner.id, set);
  });
  return new Map([...runs].map(([id, set]) => [id, set.size]));
}

/**
 * Appends lines to one file. Concurrent records are written together and share one fdatasync
 * (group commit); each `record` resolves once its line is on disk.
 */
export class AuditLog {
  private fh: fsp.FileHandle | null = null;
  private pending: { line: string; done: (err?: unknown) => void }[] = [];
  private flushing: Promise<void> | null = null;

  constructor(readonly file: string) {}

  /** Appends the entry and waits until it is durable. */
  record(entry: AuditEntry): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.pending.push({ line: `${JSON.stringify(entry)}\n`, done: (err) => (err ? reject(err) : resolve()) });
      this.flushing ??= this.flush();
    });
  }

  private async flush(): Promise<void> {
    while (this.pending.length > 0) {
      const batch = this.pending;
      this.pending = [];
      try {
        if (!this.fh) {
          await fsp.mkdir(path.dirname(this.file), { recursive: true, mode: 0o700 });
          this.fh = await fsp.open(this.file, 'a', 0o600);
        }
        await this.fh.write(batch.map((b) => b.line).join(''));
        await this.fh.datasync();
        for (const b of batch) b.done();
      } catch (err) {
        // The file may be gone or the disk full: the next record opens it again.
        await this.fh?.close().catch(() => undefined);
        this.fh = null;
        for (const b of batch) b.done(err);
      }
    }
    this.flushing = null;
  }

  /**
   * Whether the last `tailBytes` of the log hold a line of this run (a host that adopts a run its
   * predecessor may have recorded just before it died looks here: such a line is near the end).
   */
  async hasRun(run: string, tailBytes = 1 << 20): Promise<boolean> {
    await this.flushing;
    let fh: fsp.FileHandle;
    try {
      fh = await fsp.open(this.file, 'r');
    } catch {
      return false;
    }
    try {
      const { size } = await fh.stat();
      const len = Math.min(size, tailBytes);
      const buf = Buffer.alloc(len);
      await fh.read(buf, 0, len, size - len);
      return buf.toString('utf8').includes(`"run":${JSON.stringify(run)}`);
    } finally {
      await fh.close();
    }
  }

  async close(): Promise<void> {
    await this.flushing;
    await this.fh?.close().catch(() => undefined);
    this.fh = null;
  }
}

/** The default place of the log: `DATA_DIR/audit/entrypoints.ndjson`. */
export function defaultAuditLogPath(dataDir: string): string {
  return path.join(path.resolve(dataDir), 'audit', 'entrypoints.ndjson');
}
