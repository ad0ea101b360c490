/**
 * The namespaces provider's init helpers (`sap-sandbox-init -w`): started through the spawner in
 * cgroups of their own, each connecting back on the host's socket once it has joined them; a pool of
 * spares kept ready ahead of creates (SANDBOX_POOL_SIZE), and one of its own for a create that finds none.
 */
import { trace } from '../../lib/trace';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import type { Logger } from 'pino';
import { DEFAULT_ENV } from '../base';
import { procRef, SandboxCgroups, signalRef, type ProcRef } from '../proc-refs-and-cgroups';
import type { SandboxState } from '../base';
import type { Spawner } from '../spawner';
import { writeSmall } from '../quick-fs';

/** Cgroup names of spare init helpers: `spare-<host pid>-<n>`. */
export const SPARE_PREFIX = 'spare-';

/**
 * A spare init helper: its cgroups (named `name` until claimed), its process, its key (what it says
 * when it connects to the host's socket) and that connection, and whether it has joined its cgroups.
 */
interface Spare {
  name: string;
  cgroups: SandboxCgroups | null;
  proc: ProcRef | null;
  key: string | null;
  sock: net.Socket | null;
  ready: boolean;
  /** Set once a create has taken it: failures are then that create's to report. */
  claimed: boolean;
  /** Set once the host has stopped it on purpose (closing, or a failed claim). */
  discarded: boolean;
  /** Reports the spare as failed (before it is claimed). */
  failed?: (why: string) => void;
  /** What it was made whole with (see InitHelperDeps.prepareSpare); released unless a claim took it. */
  kit?: SpareKit | null;
  /** A spare made whole: its exec channel, held until a claim takes it (see Starting.exec); closed if discarded. */
  exec?: Promise<net.Socket | null> | null;
}

/**
 * What a spare is made whole with ahead of any create (see InitHelperDeps.prepareSpare): its id
 * slot (the user namespace's id map, and the network link of that slot), its writable layer's disk
 * image and its size, its staging directory, and the SETUP arguments of `sap-sandbox-init` for all that.
 */
export interface SpareKit {
  args: string[];
  idBase: number;
  link: { ifname: string; gateway: string; address: string; prefix: number } | null;
  /** Its disk image (mounted by the helper) or null: a tmpfs of diskMB. */
  disk: string | null;
  diskMB: number;
  /** The directory holding the staging mount point `m` and `init.log`. */
  staging: string;
}

/** An init helper handed its arguments: its pid, and its connection (the sandbox's info arrives there). */
export interface Starting {
  pid: number;
  sock: net.Socket;
  /** A spare made whole ahead: what it holds (the claim hands it only its name, see NamespaceProvider). */
  kit?: SpareKit;
  /** What the helper said when it connected; its exec channel names it again ("exec KEY", see expectExec). */
  key: string;
  /**
   * A spare made whole ahead: its exec channel, accepted (and held) while it was made, since its
   * pid 1 was forked before the claim (null: none came). Otherwise the caller expects it (expectExec).
   */
  exec?: Promise<net.Socket | null>;
}

/** What InitHelpers needs of its provider. */
export interface InitHelperDeps {
  dataDir: string;
  log: Logger;
  spawner: Spawner;
  /** The `sap-sandbox-init` helper. */
  initHelper: string;
  /** Waits until none of the given processes is alive (bounded). */
  waitGone(refs: (ProcRef | undefined)[]): Promise<void>;
  /** Spares kept ready (SANDBOX_POOL_SIZE; default DEFAULT_POOL_SIZE; 0: none). */
  poolSize?: number;
  /** At most this many spares start at once (default 2). */
  refillsInFlight?: number;
  /**
   * What spare `name` is made whole with (its id slot, link, disk, staging directory and SETUP
   * arguments), or null for a spare that only joins its cgroups ahead (the arguments come at claim).
   */
  prepareSpare?(name: string): Promise<SpareKit | null>;
  /** Gives back what prepareSpare took (the spare's processes are gone). */
  releaseSpare?(kit: SpareKit): Promise<void>;
  /** Whether sandboxes' pid 1 serves exec sessions (SANDBOX_EXEC_SERVER): a spare made whole then has its channel held. */
  execServer?: boolean;
}

/** Limits of an idle spare's cgroups: its helper and the sandbox's idle pid 1 (a claim sets the sandbox's). */
const SPARE_LIMITS = { maxProcesses: 8, memoryMB: 16 };

/** SANDBOX_POOL_SIZE's default: see docs/operations/configuration.md. */
export const DEFAULT_POOL_SIZE = 8;
/** The largest pool a host keeps. */
export const MAX_POOL_SIZE = 256;

/** SANDBOX_POOL_SIZE (an integer 0..MAX_POOL_SIZE; unset or empty: DEFAULT_POOL_SIZE); throws on anything else. */
export function poolSizeFromEnv(env: NodeJS.ProcessEnv): number {
  const text = env.SANDBOX_POOL_SIZE?.trim();
  if (!text) return DEFAULT_POOL_SIZE;
  const n = Number(text);
  if (!/^\d+$/.test(text) || n > MAX_POOL_SIZE) throw new Error(`SANDBOX_POOL_SIZE: must be an integer from 0 to ${MAX_POOL_SIZE} (got ${text})`);
  return n;
}

/** The init helpers of one provider; see the module comment. */
export class InitHelpers {
  /** The pool: spare init helpers ready or starting, oldest first (see refill). */
  private pool: Spare[] = [];
  /** Spares starting (not yet ready nor failed), at most refillsInFlight. */
  private refilling = 0;
  /** Creates running: the pool does not refill while there are any. */
  private creates = 0;
  private readonly poolSize: number;
  private readonly startingTasks = new Set<Promise<void>>();
  private readonly refillsInFlight: number;
  private spareSeq = 0;
  /** Distinguishes this provider's spares from another's in the same process (a host restarted in place). */
  private readonly spareTag = randomBytes(3).toString('hex');
  /** Every connection of an init helper still open: close() ends them, so that it never waits on one. */
  private readonly helperConns = new Set<net.Socket>();
  private spareFailures = 0;
  /** Set once the provider is closing: no spare is started any more. */
  closed = false;
  /** Where init helpers started by the spawner connect (listenForHelpers), and who waits for which key. */
  private helperServer: net.Server | null = null;
  private helperSocket: string | null = null;
  private readonly helperWaiters = new Map<string, (sock: net.Socket) => void>();
  /** Sandboxes whose exec channel is awaited, by their helper's key (see expectExec). */
  private readonly execWaiters = new Map<string, (sock: net.Socket | null) => void>();

  constructor(private readonly deps: InitHelperDeps) {
    this.poolSize = deps.poolSize ?? poolSizeFromEnv(process.env);
    this.refillsInFlight = Math.max(1, deps.refillsInFlight ?? 2);
  }

  /**
   * Listens on `${dataDir}/init.sock` (or, when that path is too long for a unix socket, on a socket
   * in a private directory under the system's temporary directory) for init helpers started by the
   * spawner (`-w -s`): each connects once it has joined its cgroups and says which it is ("ready KEY").
   */
  async listen(): Promise<void> {
    let sockPath = path.join(this.deps.dataDir, 'init.sock');
    if (Buffer.byteLength(sockPath) >= 100) {
      const dir = path.join(os.tmpdir(), `sap-init-${createHash('sha256').update(this.deps.dataDir).digest('hex').slice(0, 12)}`);
      await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
      await fsp.chmod(dir, 0o700);
      sockPath = path.join(dir, 'init.sock');
    }
    await fsp.rm(sockPath, { force: true });
    const server = net.createServer({ allowHalfOpen: true }, (sock) => this.helperConnected(sock));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(sockPath, () => {
        server.off('error', reject);
        resolve();
      });
    });
    server.on('error', (err) => this.deps.log.warn({ err: err.message }, "init helpers' socket failed"));
    await fsp.chmod(sockPath, 0o600);
    server.unref();
    this.helperServer = server;
    this.helperSocket = sockPath;
  }

  /** A helper's connection: its first line names the spare (or the create) waiting for it. */
  private helperConnected(sock: net.Socket): void {
    this.helperConns.add(sock);
    sock.once('close', () => this.helperConns.delete(sock));
    sock.unref();
    sock.on('error', () => undefined);
    let text = '';
    const onData = (chunk: Buffer) => {
      text += chunk.toString('latin1');
      const nl = text.indexOf('\n');
      if (nl < 0) {
        if (text.length > 200) sock.destroy();
        return;
      }
      sock.off('data', onData);
      // Until a create reads the sandbox's info from it.
      sock.pause();
      const exec = /^exec (\S+)$/.exec(text.slice(0, nl))?.[1];
      if (exec !== undefined) {
        const take = this.execWaiters.get(exec);
        if (!take) return void sock.destroy();
        this.execWaiters.delete(exec);
        // What came after the line is the exec server's first frames.
        const rest = chunk.subarray(chunk.length - (text.length - nl - 1));
        if (rest.length) sock.unshift(rest);
        return take(sock);
      }
      const key = /^ready (\S+)$/.exec(text.slice(0, nl))?.[1];
      const waiter = key ? this.helperWaiters.get(key) : undefined;
      if (!key || !waiter) return void sock.destroy();
      this.helperWaiters.delete(key);
      waiter(sock);
    };
    sock.on('data', onData);
  }

  /**
   * The exec channel of the helper that said "ready KEY": it connects again once it has its
   * arguments, says "exec KEY", and its sandbox's pid 1 serves exec sessions on that connection
   * (tools/sandbox-init/exec-server.h); a spare made whole connects it before it forks pid 1.
   * Resolves with the connection (paused), or null when none came within `ms` (the sandbox's
   * commands then start through sap-sandbox-enter). Register before handing the helper its
   * arguments (a spare: before starting it); a key is taken once.
   */
  expectExec(key: string, ms = 15_000): Promise<net.Socket | null> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.execWaiters.delete(key);
        resolve(null);
      }, ms);
      timer.unref();
      this.execWaiters.set(key, (sock) => {
        clearTimeout(timer);
        resolve(sock);
      });
    });
  }

  /**
   * Starts `sap-sandbox-init -w -s SOCKET KEY` in the given cgroups through the spawner (no fork of
   * the host); `connected` is called with its connection once it is in them.
   */
  private async startLinkedHelper(key: string, cgroups: SandboxCgroups, connected: (sock: net.Socket) => void, extra: string[] = []): Promise<ProcRef> {
    this.helperWaiters.set(key, connected);
    try {
      const pid = await this.deps.spawner.spawn({
        argv: [this.deps.initHelper, '-w', '-s', this.helperSocket!, key, ...cgroups.procsFiles().flatMap((f) => ['-c', f]), ...extra],
        env: { PATH: DEFAULT_ENV.PATH },
      });
      return procRef(pid) ?? { pid, start: -1 };
    } catch (err) {
      this.helperWaiters.delete(key);
      throw err;
    }
  }

  /**
   * Fills the pool: starts spare init helpers (`sap-sandbox-init -w`, each in cgroups of its own)
   * until `poolSize` are ready or starting, at most `refillsInFlight` at a time, and none while a
   * create is running (creates come first: the pool refills once the last one has ended, see
   * createStarted). Joining cgroups waits for a kernel RCU grace period (5–15 ms), so it is done
   * ahead of a create, which renames the groups to its sandbox's and hands the helper the rest of
   * its arguments. Gives up after three failures in a row (creates then start a helper each time).
   */
  refill(): void {
    if (!this.helperSocket || this.closed || this.spareFailures >= 3 || this.creates > 0) return;
    while (this.pool.length < this.poolSize && this.refilling < this.refillsInFlight) this.startSpare();
  }

  /** A create begins: the pool's refills wait until no create is running. */
  createStarted(): void {
    this.creates++;
  }

  /** A create has ended (either way): the pool refills once none is running. */
  createEnded(): void {
    this.creates = Math.max(0, this.creates - 1);
    this.refill();
  }

  /** How many spares are ready to be claimed, and how many are starting. */
  poolState(): { ready: number; starting: number; size: number } {
    const ready = this.pool.filter((s) => s.ready).length;
    return { ready, starting: this.pool.length - ready, size: this.poolSize };
  }

  /** Starts one spare into the pool (see refill). */
  private startSpare(): void {
    const name = `${SPARE_PREFIX}${process.pid}-${this.spareTag}${++this.spareSeq}`;
    const pending: Spare = { name, proc: null, key: null, sock: null, cgroups: null, ready: false, claimed: false, discarded: false };
    this.pool.push(pending);
    this.refilling++;
    let done = false;
    let settled = false;
    /** Counted once, when the spare is ready or has failed: the next refill may start. */
    const settle = () => {
      if (settled) return;
      settled = true;
      this.refilling--;
      this.refill();
    };
    const failed = (why: string) => {
      if (done || pending.discarded || pending.claimed) return;
      done = true;
      this.pool = this.pool.filter((s) => s !== pending);
      this.spareFailures++;
      this.deps.log.warn({ why, failures: this.spareFailures }, 'spare sandbox init failed');
      void this.discardSpare(pending).finally(settle);
    };
    pending.failed = failed;
    const task = (async () => {
      // Bounded while idle: a spare is one waiting process; a claim sets the sandbox's own limits.
      const cgroups = SandboxCgroups.create(name, SPARE_LIMITS);
      pending.cgroups = cgroups;
      if (!this.pool.includes(pending)) return void this.discardSpare(pending).finally(settle);
      // Its id slot, link, disk and staging directory: the helper builds the whole sandbox with them
      // before it connects (sap-sandbox-init -w with a whole SETUP), so the claim hands it only its name.
      pending.kit = (await this.deps.prepareSpare?.(name)) ?? null;
      if (!this.pool.includes(pending)) return void this.discardSpare(pending).finally(settle);
      pending.key = `${name}.${randomBytes(8).toString('hex')}`;
      // A spare made whole forks its pid 1 (the exec server) before any claim: its helper connects
      // "exec KEY" first, and the channel is held here until a claim re-keys it to its sandbox.
      if (pending.kit && this.deps.execServer) pending.exec = this.expectExec(pending.key, 30_000);
      const connected = (sock: net.Socket) => {
        if (pending.discarded || done) return void sock.destroy();
        pending.sock = sock;
        sock.on('close', () => failed('the init helper closed its connection'));
        pending.ready = true;
        this.spareFailures = 0;
        settle();
      };
      pending.proc = await this.startLinkedHelper(pending.key, cgroups, connected, pending.kit?.args ?? []);
      // Closed (or dropped) while it was being started: discardSpare ran before there was a process to kill.
      if (pending.discarded) return void this.discardSpare(pending).finally(settle);
      // One timer, not a poll: a helper that has not connected by then is taken as failed.
      setTimeout(() => {
        if (!pending.ready) failed('no connection from the init helper within 30 s');
      }, 30_000).unref();
    })().catch((err: Error) => failed(err.message));
    // close() waits for spares still starting, so that a stopped host leaves no process or cgroup behind.
    this.startingTasks.add(task);
    void task.finally(() => this.startingTasks.delete(task));
  }

  /**
   * A ready spare helper, now in sandbox `id`'s cgroups (renamed) with its limits, or null when
   * there is none (the caller starts a helper of its own). Every spare serves one sandbox only: it
   * has never run anything, and it gets its arguments (ids, layers, network) from this create alone.
   */
  async claimSpare(id: string, limits: SandboxState['limits'], fits: (kit: SpareKit | null) => boolean = () => true): Promise<Starting | null> {
    for (;;) {
      const at = this.pool.findIndex((s) => s.ready && fits(s.kit ?? null));
      if (at < 0) return null;
      const spare = this.pool[at]!;
      this.pool.splice(at, 1);
      if (!spare.cgroups || !spare.sock || spare.sock.destroyed || !spare.proc) {
        void this.discardSpare(spare);
        continue;
      }
      spare.claimed = true;
      spare.sock.removeAllListeners('close');
      try {
        trace(id, 'host:spare-found');
        const cgroups = spare.cgroups.renameTo(id);
        trace(id, 'host:cgroups-renamed');
        cgroups.applyLimits(limits);
        trace(id, 'host:limits-applied');
        // The idle cap on memory goes unless the sandbox has a limit of its own (raised: nothing to reclaim).
        if (!limits.memoryMB && cgroups.dirs.memory) writeSmall(path.join(cgroups.dirs.memory, 'memory.limit_in_bytes'), '-1');
      } catch (err) {
        this.deps.log.warn({ sandboxId: id, err: (err as Error).message }, 'could not use the spare sandbox init');
        await this.discardSpare(spare, id);
        return null;
      }
      spare.sock.ref();
      return { pid: spare.proc.pid, sock: spare.sock, key: spare.key!, ...(spare.kit ? { kit: spare.kit } : {}), ...(spare.exec ? { exec: spare.exec } : {}) };
    }
  }

  /**
   * A helper of its own for sandbox `id` when no spare is ready (a burst): started the same way as a
   * spare, in the sandbox's cgroups, and waited for.
   */
  async startHelperFor(id: string, limits: SandboxState['limits'], failure: (why: string) => Promise<Error>): Promise<Starting> {
    const cgroups = SandboxCgroups.create(id, limits);
    const key = `${id}.${randomBytes(8).toString('hex')}`;
    let connected!: (sock: net.Socket) => void;
    const sockP = new Promise<net.Socket>((r) => (connected = r));
    const proc = await this.startLinkedHelper(key, cgroups, connected);
    let timer: NodeJS.Timeout | undefined;
    const sock = await Promise.race([
      sockP,
      new Promise<never>((_r, reject) => {
        timer = setTimeout(() => reject(new Error('no connection from the init helper within 15 s')), 15_000);
      }),
    ])
      .catch(async (err: Error) => {
        this.helperWaiters.delete(key);
        signalRef(proc, 'SIGKILL');
        throw await failure(err.message);
      })
      .finally(() => clearTimeout(timer));
    sock.ref();
    return { pid: proc.pid, sock, key };
  }

  /** Kills a spare helper and removes its cgroups (under its own name and, if given, the name it was renamed to). */
  private async discardSpare(spare: Spare, renamedTo?: string): Promise<void> {
    spare.discarded = true;
    if (spare.key) this.helperWaiters.delete(spare.key);
    spare.sock?.destroy();
    // Its exec channel (held, or still to come: then no longer awaited): nobody will serve on it.
    const take = spare.key ? this.execWaiters.get(spare.key) : undefined;
    if (take) {
      this.execWaiters.delete(spare.key!);
      take(null);
    }
    void spare.exec?.then((sock) => sock?.destroy());
    spare.exec = null;
    if (spare.proc) {
      signalRef(spare.proc, 'SIGKILL');
      await this.deps.waitGone([spare.proc]);
    }
    // A spare made whole has the sandbox's pid 1 in its cgroups too.
    for (const name of renamedTo ? [spare.name, renamedTo] : [spare.name]) {
      const groups = SandboxCgroups.of(name);
      await groups.killAll();
      await groups.remove();
    }
    if (spare.kit) await this.deps.releaseSpare?.(spare.kit);
    spare.kit = null;
  }

  /** Stops the ready spares that `unfit` picks (made for a disk size no longer asked for): the pool refills. */
  discardWhere(unfit: (kit: SpareKit | null) => boolean): void {
    const gone = this.pool.filter((s) => s.ready && !s.claimed && unfit(s.kit ?? null));
    if (!gone.length) return;
    this.pool = this.pool.filter((s) => !gone.includes(s));
    for (const s of gone) void this.discardSpare(s);
  }

  /** A claimed spare whose claim failed: its processes, cgroups (now named `id`) and what it held. */
  async discardClaimed(id: string, kit: SpareKit): Promise<void> {
    const groups = SandboxCgroups.of(id);
    await groups.killAll();
    await groups.remove();
    await this.deps.releaseSpare?.(kit);
  }

  /** Stops every spare of the pool (their processes and cgroups) and the helpers' socket. */
  async close(): Promise<void> {
    this.closed = true;
    const spares = this.pool;
    this.pool = [];
    await Promise.all(spares.map((s) => this.discardSpare(s)));
    await Promise.all([...this.startingTasks]);
    const server = this.helperServer;
    this.helperServer = null;
    if (server) {
      for (const take of this.execWaiters.values()) take(null);
      this.execWaiters.clear();
      // Connections of helpers still starting a sandbox are the host's own: ended, not waited for.
      for (const sock of this.helperConns) sock.destroy();
      await new Promise((r) => server.close(r));
      if (this.helperSocket) {
        await fsp.rm(this.helperSocket, { force: true });
        // The private directory under the temp dir that a deep data dir's socket gets (listenForHelpers).
        if (path.dirname(this.helperSocket) !== this.deps.dataDir) await fsp.rmdir(path.dirname(this.helperSocket)).catch(() => undefined);
      }
    }
    this.helperSocket = null;
  }
}
