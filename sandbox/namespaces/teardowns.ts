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
import { randomBytes } from 'node:crypto';
import { close, closeSync, existsSync, openSync, promises as fsp, unlinkSync } from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'pino';
import type { SandboxState } from '../base';
import type { IdSlots } from '../id-slots';
import type { SandboxNetwork } from '../network';
import { isAlive, procRef, SandboxCgroups, signalRef, type ProcRef } from '../proc-refs-and-cgroups';
import type { DiskImages } from './disk';
import { readlinkOrNull, removeDir, renameNow, writeSmallAtomically } from '../quick-fs';

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
  record(rec: TeardownRecord): void {
    writeSmallAtomically(path.join(this.dir, `${rec.token}.json`), JSON.stringify(rec));
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
      try {
        unlinkSync(path.join(this.dir, `${rec.token}.json`));
      } catch {
        /* gone already */
      }
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
      const rec = await fsp
        .readFile(path.join(this.dir, `${token}.json`), 'utf8')
        .then((t) => JSON.parse(t) as TeardownRecord)
        .catch(() => null);
      this.enqueue(rec ?? (await redetach(token)));
    }
    await this.drain();
    if (tokens.size) this.log.info({ count: tokens.size }, 'teardowns left by an earlier run finished');
    return tokens.size;
  }
}

/** What SandboxTeardowns needs of the namespaces provider. */
export interface SandboxTeardownDeps {
  /** `${dataDir}/teardown`. */
  dir: string;
  log: Logger;
  idSlots: IdSlots;
  network: SandboxNetwork | null;
  disks: DiskImages | null;
  waitGone(refs: (ProcRef | undefined)[]): Promise<void>;
  pauseFile?: string | null;
}

/** The namespaces provider's side of destroy: detach now, the rest behind the answer (see the module comment). */
export class SandboxTeardowns {
  private readonly queue: PendingTeardowns;
  /** Mount namespaces of detached sandboxes (descriptors), held open until their teardown (see detach). */
  private readonly held = new Map<string, number[]>();

  constructor(private readonly deps: SandboxTeardownDeps) {
    this.queue = new PendingTeardowns(deps.dir, (rec) => this.finish(rec), deps.log, TEARDOWNS_IN_FLIGHT, deps.pauseFile ?? null);
  }

  /** At a host's start: finishes the teardowns an earlier run left (stopped, or killed), before anything is made. */
  async start(): Promise<void> {
    await this.queue.replay((token) => this.redetach(token));
  }

  pending(): number {
    return this.queue.pending();
  }

  drain(): Promise<void> {
    return this.queue.drain();
  }

  /**
   * Destroy's part on the critical path: every process of sandbox `id` is killed and waited for (it
   * can no longer run anything), its directory `dir` moves into the teardown directory (gone for
   * adoption from then on), its cgroups, disk image and scratch directory move to names of their own
   * (a sandbox of the same id can be made at once), the record is written, and the rest is queued
   * (finish). Answers false, doing nothing, for a sandbox of an older host (overlays on the host) or
   * one never started: destroy tears those down in full.
   */
  async detach(id: string, state: SandboxState | undefined, dir: string): Promise<boolean> {
    if (!state?.init || state.hostMounts !== false) return false;
    const groups = SandboxCgroups.of(id);
    const procs = [state.init.ns, state.init.outer, state.entrypoint?.wrapper, ...(await groups.pids()).map((p) => procRef(p) ?? undefined)];
    // Their mount namespaces, held open: the last process of each would otherwise unmount the
    // sandbox's overlays and disk as it exits; they are let go behind the answer (finish).
    const held = [state.init.ns, state.init.outer].map((ref) => (isAlive(ref) ? openOrNull(`/proc/${ref.pid}/ns/mnt`) : null));
    signalRef(state.init.ns, 'SIGKILL');
    signalRef(state.init.outer, 'SIGKILL');
    // The init's death takes every process of its pid namespace with it: waited for first, the
    // groups are then usually empty, and killAll does not freeze and thaw them (two cgroupfs writes
    // per round, each waiting on the kernel's cgroup locks while other sandboxes start).
    await this.deps.waitGone([state.init.ns, state.init.outer]);
    await groups.killAll();
    await this.deps.waitGone(procs);
    // A session's directory is a link into the scratch directory (see ../scratch).
    const scratch = readlinkOrNull(dir);
    const rec = this.recordFor(id, `${id}.${randomBytes(6).toString('hex')}`, state, scratch);
    try {
      renameNow(dir, rec.dir);
    } catch (err) {
      for (const fd of held) if (fd !== null) closeSync(fd);
      throw err;
    }
    this.held.set(
      rec.token,
      held.filter((h) => h !== null),
    );
    await this.moveNames(rec, scratch);
    this.queue.record(rec);
    this.queue.enqueue(rec);
    return true;
  }

  private recordFor(id: string, token: string, state: SandboxState | null, scratch: string | null): TeardownRecord {
    return {
      id,
      token,
      groups: `gone-${token}`,
      dir: this.queue.pathOf(token),
      disk: this.deps.disks ? path.join(this.deps.disks.dir, `gone-${token}.img`) : null,
      scratch: scratch ? path.join(path.dirname(scratch), `.gone-${token}`) : null,
      ...(state?.idBase !== undefined ? { idBase: state.idBase } : {}),
      ...(state?.link ? { address: state.link.address } : {}),
    };
  }

  /** Moves a detached sandbox's cgroups, disk image and scratch directory to the record's names (a name already gone is skipped). */
  private async moveNames(rec: TeardownRecord, scratch: string | null): Promise<void> {
    const moves: [string, string][] = Object.values(SandboxCgroups.of(rec.id).dirs).map((d) => [d!, path.join(path.dirname(d!), rec.groups)]);
    if (rec.disk && this.deps.disks) moves.push([this.deps.disks.fileOf(rec.id), rec.disk]);
    if (scratch && rec.scratch) moves.push([scratch, rec.scratch]);
    await Promise.all(
      moves.map(([a, b]) =>
        fsp.rename(a, b).catch((err: NodeJS.ErrnoException) => {
          if (err.code !== 'ENOENT') throw err;
        }),
      ),
    );
  }

  /**
   * A teardown whose record was never written (the host died inside detach): its names are moved
   * now (nothing can have taken them: destroy had not answered), from what the moved directory
   * still holds (its state.json, its scratch link).
   */
  private async redetach(token: string): Promise<TeardownRecord> {
    const id = token.slice(0, token.lastIndexOf('.'));
    const dir = this.queue.pathOf(token);
    const state = await fsp
      .readFile(path.join(dir, 'state.json'), 'utf8')
      .then((t) => JSON.parse(t) as SandboxState)
      .catch(() => null);
    const scratch = readlinkOrNull(dir);
    const rec = this.recordFor(id, token, state, scratch);
    await SandboxCgroups.of(id).killAll();
    await this.moveNames(rec, scratch);
    return rec;
  }

  /** Destroy's part behind its answer: the mount namespaces let go, cgroups, policy, disk, directories, and last the id slot. */
  private async finish(rec: TeardownRecord): Promise<void> {
    const held = this.held.get(rec.token) ?? [];
    this.held.delete(rec.token);
    // The sandbox's mounts go with the last hold of their namespaces (the disk's loop device with them).
    // Through the thread pool: the kernel unmounts inside that close, and waits there for RCU grace
    // periods (milliseconds, tens of them under load), which must not stop the host's thread.
    await Promise.all(held.map((fd) => new Promise<void>((resolve) => close(fd, () => resolve()))));
    const groups = SandboxCgroups.of(rec.groups);
    await groups.killAll();
    await groups.remove();
    if (rec.address) await this.deps.network?.release(rec.address);
    // The image and the scratch directory hold what the sandbox wrote (any size): through the pool.
    if (rec.disk) await fsp.rm(rec.disk, { force: true });
    if (rec.scratch) await fsp.rm(rec.scratch, { recursive: true, force: true });
    await removeDir(rec.dir);
    // Last: the slot (and its link's address) may be taken again once everything of it is gone.
    if (rec.idBase !== undefined) this.deps.idSlots.release(rec.idBase);
  }
}

/** A read-only descriptor of `file`, or null when it cannot be opened (the process is gone). */
function openOrNull(file: string): number | null {
  try {
    return openSync(file, 'r');
  } catch {
    return null;
  }
}
