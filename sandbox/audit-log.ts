/**
 * The host's entrypoint audit log: one NDJSON line per entrypoint start, appended and fsync'd
 * before the entrypoint is started, so that every run of an agent leaves a durable record on the
 * host even if the host, the worker or the machine dies a moment later. A sandbox cannot leave
 * such a record itself (its files, network and host-side logs go with it), and a count of runs
 * per session is what shows whether a crash made an agent run twice.
 *
 * A line is written before the start: a host that dies between the two leaves a line for a start
 * that never happened. The log may therefore count a start too many, never one too few.
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
