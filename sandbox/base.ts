/**
 * What every provider shares: the on-disk state of a sandbox (`${dataDir}/sandboxes/<id>/state.json`),
 * the create sequence (provision → files → patches → entrypoint), the durable entrypoint wrapper, and
 * adoption of existing sandboxes after a restart. Providers supply isolation through a few hooks.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { type PipedProcess, Spawner } from './spawner';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp, watch, openSync, closeSync, readSync, fstatSync, readFileSync, writeFileSync, mkdirSync, type FSWatcher } from 'node:fs';
import { constants as osConstants } from 'node:os';
import * as path from 'node:path';
import { pipeline } from 'node:stream/promises';
import type { Logger } from 'pino';
import pino from 'pino';
import { SandboxError } from './errors';
import { defaultScratchDir } from './scratch';
import { normaliseEgress, type Egress } from './network';
import { AuditLog, defaultAuditLogPath } from './audit-log';
import { readSandboxFile, writeSandboxFile, type RootMap } from './paths';
import { isAlive, procRef, procStart, SandboxCgroups, signalRef, type Limits, type ProcRef } from './procs';
import type {
  EntrypointLog,
  EntrypointLogChunk,
  CreateResult,
  ListFilter,
  ProviderKind,
  ProviderOptions,
  SandboxProvider,
  SpawnOptions,
} from './driver';
import { SecretBox } from '../lib/secret-box';
import { HIBERNATION_LAYER_MARK, type CreateSandboxRequest, type EntrypointSpec, type EntrypointStatus, type PatchOutcome, type SandboxInfo } from './host-contract/types';

/** What a host keeps about a sandbox, in state.json. */
export interface SandboxState {
  version: 1;
  id: string;
  orgId: string;
  hostId: string;
  provider: ProviderKind;
  owner?: CreateSandboxRequest['owner'];
  /** Read-only layers under the writable one, topmost first, parents expanded. */
  layers: string[];
  envs: Record<string, string>;
  /** Default working directory of processes (CreateSandboxRequest.cwd). */
  cwd?: string;
  limits: Limits;
  createdAt: string;
  metadata: Record<string, string>;
  patches: PatchOutcome[];
  status: 'creating' | 'running' | 'stopped';
  /** Provider-specific processes (e.g. the namespace init). */
  init?: { outer: ProcRef; ns: ProcRef };
  /**
   * namespaces provider: whether the sandbox's overlays are mounted in the host's mount namespace (false: in the
   * sandbox's own, gone with its processes; absent: a sandbox of an older host, so treated as true).
   */
  hostMounts?: boolean;
  /** The network policy asked for at create (absent: the default, `internet`). */
  network?: { egress: 'internet' | 'none' | { allow: string[] } };
  /** namespaces provider: the sandbox's link out (see network.ts); absent: loopback only. */
  link?: { ifname: string; gateway: string; address: string; prefix: number };
  /** namespaces provider: host uid/gid of the sandbox's root; its ids 0..65535 are host ids idBase.. (see id-slots.ts). */
  idBase?: number;
  /**
   * The entrypoint. `starting` is saved before the entrypoint's helper is started and cleared once
   * its pid is saved: a host that dies in between finds out at its next start whether the start
   * happened (see adoptInterruptedStart), so an entrypoint is never started twice. `run` names the
   * start (its run files, see runFiles): the helper's claim of it is the durable mark that it began.
   */
  entrypoint?: { wrapper: ProcRef; startedAt: string; timeoutSeconds?: number; starting?: boolean; run?: string };
}

/** A layer directory's content hash, and its regular files that carry set-id bits (path in the layer, mode). */
export interface LayerScan {
  sha256: string;
  setid: [string, number][];
}

/** What a hibernated sandbox (or one being restored) is made again from. */
interface Respawn {
  version: 1;
  kind: 'hibernated' | 'restoring';
  id: string;
  orgId: string;
  owner?: CreateSandboxRequest['owner'];
  /** The layer to stack (its parents follow from its layer.json). */
  layer: string;
  envs: Record<string, string>;
  cwd?: string;
  network?: SandboxState['network'];
  limits: Limits;
  metadata: Record<string, string>;
  at: string;
}

/**
 * How a provider's one-exec entry helper (see BaseProvider.enterArgv) starts a process: the cgroups it
 * joins, and for entrypoints its own process group, a timeout and the file its exit code goes to.
 */
export interface EnterOptions {
  cgroupProcs: string[];
  /** The process leads a process group of its own (signals and the timeout reach its children). */
  ownGroup?: boolean;
  /** SIGTERM after this many seconds, SIGKILL killAfterSeconds later; the status is then 124 or 137. */
  timeoutSeconds?: number;
  killAfterSeconds?: number;
  /** Where the exit code ("<code>\n", one write) goes when the process ends. */
  exitFile?: string;
  /** Relay stdout and stderr through the helper, which records the order of their chunks here (see entrypointLog). */
  logIndex?: string;
  /**
   * The pid of the process's parent (this host, or the spawner helper that exits with it): the
   * process is hung up (SIGHUP to its group) when that parent dies. For processes that only this
   * host process can serve (exec sessions, terminals, patches), never for entrypoints.
   */
  hangUpWithCaller?: number;
  /** Run on a pseudo-terminal of the sandbox of this size (the helper's -T; fd 3 takes window sizes). */
  pty?: { rows: number; cols: number };
  /**
   * Claim this run first (the helper's -R): rename `<runFile>.pending` to `runFile`, or start nothing
   * when the pending file is gone (see runFiles and settleInterruptedRun).
   */
  runFile?: string;
}

/** The files of one entrypoint run (`run`: its id): the caller writes `pending`, the helper's claim renames it to `claimed`. */
export function runFiles(dir: string, run: string): { claimed: string; pending: string; cancelled: string } {
  const claimed = path.join(dir, `entrypoint.run-${run}`);
  return { claimed, pending: `${claimed}.pending`, cancelled: `${claimed}.cancelled` };
}

/**
 * Decides the fate of a run whose start a host did not finish (it died in between): `cancelled`
 * when the run's pending file could be renamed away (its helper, started or not, can then never
 * claim it: the run never began and never will); `started` when the helper's claim is there (with
 * the pid it wrote); `never` when neither is (the host died before writing the pending file).
 * One rename decides against the helper's own rename, so exactly one of the two wins.
 */
export async function settleInterruptedRun(dir: string, run: string): Promise<{ outcome: 'cancelled' | 'never' } | { outcome: 'started'; pid: number | null }> {
  const f = runFiles(dir, run);
  try {
    await fsp.rename(f.pending, f.cancelled);
    await fsp.rm(f.cancelled, { force: true });
    return { outcome: 'cancelled' };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  const text = await fsp.readFile(f.claimed, 'utf8').catch(() => null);
  if (text === null) return { outcome: 'never' };
  const pid = /^\d+\n/.test(text) ? Number(text.trim()) : null;
  return { outcome: 'started', pid };
}

/** How long a host waits for an entrypoint's helper to claim its start before cancelling it (SANDBOX_ENTRYPOINT_CLAIM_TIMEOUT_MS). */
export const DEFAULT_ENTRYPOINT_CLAIM_TIMEOUT_MS = 30_000;

/** Environment every process in a sandbox starts with (the sandbox's and the process's own envs are added). */
export const DEFAULT_ENV: Record<string, string> = {
  PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  HOME: '/root',
  LANG: 'C.UTF-8',
  TERM: 'xterm',
};

const ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;
const ENV_KEY_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
const PATCH_TAIL_BYTES = 4096;
const KILL_AFTER_SECONDS = 5;

/** Throws invalid_request unless `id` is usable as a sandbox or layer id (also a hostname and a directory name). */
export function assertId(id: string, what = 'sandbox id'): void {
  if (typeof id !== 'string' || !ID_RE.test(id) || id.includes('..')) {
    throw new SandboxError('invalid_request', `invalid ${what}: ${String(id)} (letters, digits, '_', '.', '-'; at most 63)`);
  }
}

/** Quotes a string for /bin/sh. */
export function shq(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/** `KEY=value` pairs for `env -i`; throws invalid_request on bad names. */
export function envPairs(...envs: (Record<string, string> | undefined)[]): string[] {
  const merged: Record<string, string> = {};
  for (const e of envs) {
    for (const [k, v] of Object.entries(e ?? {})) {
      if (!ENV_KEY_RE.test(k)) throw new SandboxError('invalid_request', `invalid environment variable name: ${k}`);
      merged[k] = String(v);
    }
  }
  return Object.entries(merged).map(([k, v]) => `${k}=${v}`);
}

/** Shell prefix that moves the current shell into the given cgroups (errors ignored). */
export function cgroupJoin(files: string[]): string {
  return files.map((f) => `echo $$ > ${shq(f)} 2>/dev/null;`).join(' ');
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** How often a wait for an entrypoint's exit looks again without an inotify event: rarely when its directory is watched. */
const WATCHED_POLL_MS = 250;
const UNWATCHED_POLL_MS = 20;

export { defaultScratchDir };
export type { EntrypointLog, EntrypointLogChunk };

/** statfs type of a tmpfs. */
const TMPFS_MAGIC = 0x01021994;

/** Runs a per-key queue so that create/destroy/start of one sandbox never interleave. */
class KeyedLock {
  private tails = new Map<string, Promise<unknown>>();
  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.tails.set(key, tail);
    try {
      return await next;
    } finally {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    }
  }
}

/** The provider skeleton; subclasses supply isolation. */
export abstract class BaseProvider implements SandboxProvider {
  abstract readonly kind: ProviderKind;
  protected readonly dataDir: string;
  protected readonly hostId: string;
  protected readonly log: Logger;
  protected readonly states = new Map<string, SandboxState>();
  /** Starts detached processes without forking the host (see spawner.ts). */
  protected readonly spawner = new Spawner();
  private readonly lock = new KeyedLock();
  /**
   * Creates waiting for the lock of their id, and how many times that id was destroyed meanwhile:
   * a create queued behind a destroy of its sandbox is refused (see create).
   */
  private readonly waitingCreates = new Map<string, { waiting: number; destroys: number }>();
  /** Ids of the sandboxes hibernated on this host (their respawn records). */
  protected readonly hibernated = new Set<string>();

  /** Where sandboxes of sessions keep their files (see ProviderOptions.scratchDir); null: in DATA_DIR. */
  protected scratchDir: string | null = null;
  private readonly scratchOption: string | null | undefined;
  /** Records every entrypoint start once its helper has claimed it (null: off). */
  protected readonly audit: AuditLog | null;
  /** Seals sandboxes' environments in the files this host keeps (see envKeyFile); made on first use. */
  private envBox: SecretBox | null = null;
  /** See DEFAULT_ENTRYPOINT_CLAIM_TIMEOUT_MS. */
  private readonly claimTimeoutMs: number;
  /** Tests only (SANDBOX_TEST_PAUSE_FILE; unset: off): see testPause. */
  private readonly testPauseFile: string | null;

  constructor(opts: ProviderOptions) {
    this.dataDir = path.resolve(opts.dataDir);
    this.hostId = opts.hostId;
    this.log = opts.logger ?? pino({ level: 'silent' });
    this.scratchOption = opts.scratchDir;
    this.audit = opts.auditLog === null ? null : new AuditLog(opts.auditLog ?? defaultAuditLogPath(this.dataDir));
    if (/[,:\s]/.test(this.dataDir)) throw new Error(`DATA_DIR must not contain ',', ':' or spaces: ${this.dataDir}`);
    this.claimTimeoutMs = opts.entrypointClaimTimeoutMs ?? (Number(process.env.SANDBOX_ENTRYPOINT_CLAIM_TIMEOUT_MS) || DEFAULT_ENTRYPOINT_CLAIM_TIMEOUT_MS);
    this.testPauseFile = process.env.SANDBOX_TEST_PAUSE_FILE || null;
  }

  /**
   * The scratch directory in use: the one configured, or by default a directory of this DATA_DIR
   * under /dev/shm when that is a tmpfs (null when there is none).
   */
  private async resolveScratch(): Promise<string | null> {
    if (this.scratchOption === null) return null;
    let dir = this.scratchOption;
    if (dir === undefined) {
      const shm = await fsp.statfs('/dev/shm').catch(() => null);
      if (!shm || shm.type !== TMPFS_MAGIC) return null;
      dir = defaultScratchDir(this.dataDir);
    }
    dir = path.resolve(dir);
    await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
    return dir;
  }

  /**
   * Makes the sandbox's directory: in DATA_DIR, or for a session's sandbox in the scratch directory
   * with a link to it from DATA_DIR (its files are short-lived: a tmpfs spares the disk's inode and
   * journal work of creating and removing them for every session). A leftover of the same id is
   * destroyed first.
   */
  private async makeDir(id: string, owner: CreateSandboxRequest['owner']): Promise<void> {
    const dir = this.dirOf(id);
    const real = this.scratchDir && owner?.kind === 'session' ? path.join(this.scratchDir, id) : null;
    const make = async () => {
      if (!real) return fsp.mkdir(dir, { mode: 0o700 });
      await fsp.mkdir(real, { mode: 0o700 });
      await fsp.symlink(real, dir);
    };
    try {
      await make();
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      // A leftover directory without adopted state (or a scratch directory never linked): clear it
      // and start over.
      await this.destroyUnlocked(id);
      if (real) await fsp.rm(real, { recursive: true, force: true });
      await make();
    }
  }

  /** The scratch directory a sandbox's directory links to, if it is such a link (and points there). */
  private async scratchTarget(dir: string): Promise<string | null> {
    if (!this.scratchDir) return null;
    const target = await fsp.readlink(dir).catch(() => null);
    return target && path.dirname(target) === this.scratchDir ? target : null;
  }

  /** Called for each sandbox found on disk at start, before it is adopted (e.g. to mark resources it holds). */
  protected adopted(_state: SandboxState): void {}
  /** Sets up provider-wide files (e.g. the base filesystem) once. */
  protected abstract prepare(): Promise<void>;
  /** Builds the sandbox's filesystem, cgroups and long-lived processes; fills `state.init` where it has one. */
  protected abstract provision(state: SandboxState): Promise<void>;
  /** Kills the sandbox's processes and undoes `provision` (without removing the sandbox directory). */
  protected abstract teardown(id: string, state: SandboxState | undefined): Promise<void>;
  /** Where the sandbox's files are reachable from the host (throws conflict when it is not running). */
  protected abstract rootMap(state: SandboxState): RootMap | Promise<RootMap>;
  /** The host-side argv that runs `opts.argv` inside the sandbox with a clean environment. */
  protected abstract innerArgv(state: SandboxState, opts: SpawnOptions): string[];
  /** True while the sandbox can run processes. */
  protected abstract isLive(state: SandboxState): boolean;
  /**
   * The host-side argv of a helper that does in one exec what the shell wrapper + innerArgv do (join
   * the cgroups, enter, run `opts.argv`, and with `how` its timeout and exit file), or null when the
   * provider has none (then the shell wrapper is used).
   */
  protected enterArgv(_state: SandboxState, _opts: SpawnOptions, _how: EnterOptions): string[] | null {
    return null;
  }

  /**
   * The environment the entry helper of enterArgv is started with: where a provider's helper takes
   * the process's variables from, so that their values never show in the host's process list.
   */
  protected enterEnv(_state: SandboxState, _opts: SpawnOptions): Record<string, string> {
    return { PATH: DEFAULT_ENV.PATH };
  }

  protected sandboxesDir(): string {
    return path.join(this.dataDir, 'sandboxes');
  }
  protected layersDir(): string {
    return path.join(this.dataDir, 'layers');
  }
  protected dirOf(id: string): string {
    return path.join(this.sandboxesDir(), id);
  }

  /**
   * The key that seals sandboxes' environments in state.json and respawn records (they hold agents'
   * env and secret-store values): DATA_DIR/sandbox-env.key, 32 random bytes made at first use, mode 0600.
   * A copy of a sandbox's files (a backup, a bug report) then holds no value.
   */
  private envSealer(): SecretBox {
    if (this.envBox) return this.envBox;
    const file = path.join(this.dataDir, 'sandbox-env.key');
    let key: Buffer;
    try {
      key = Buffer.from(readFileSync(file, 'utf8').trim(), 'hex');
    } catch {
      mkdirSync(this.dataDir, { recursive: true });
      try {
        writeFileSync(file, randomBytes(32).toString('hex'), { mode: 0o600, flag: 'wx' });
      } catch {
        /* made by another start at the same moment: read it below */
      }
      key = Buffer.from(readFileSync(file, 'utf8').trim(), 'hex');
    }
    return (this.envBox = new SecretBox(key));
  }

  /** `rec` as written to disk: its envs sealed (context: the sandbox's id). */
  private withSealedEnvs<T extends { id: string; envs: Record<string, string> }>(rec: T): T & { sealedEnvs?: string } {
    if (Object.keys(rec.envs).length === 0) return rec;
    return { ...rec, envs: {}, sealedEnvs: this.envSealer().seal(JSON.stringify(rec.envs), `sandbox-env:${rec.id}`) };
  }

  /** `rec` as read from disk, its envs opened (a record written before they were sealed has them plain). */
  private withOpenedEnvs<T extends { id: string; envs: Record<string, string>; sealedEnvs?: string }>(rec: T): T {
    const { sealedEnvs, ...rest } = rec;
    if (!sealedEnvs) return rec;
    try {
      return { ...rest, envs: JSON.parse(this.envSealer().open(sealedEnvs, `sandbox-env:${rec.id}`)) as Record<string, string> } as T;
    } catch (err) {
      // The key file was lost or replaced: the sandbox lives on, its new processes without its environment.
      this.log.warn({ sandboxId: rec.id, err: (err as Error).message }, 'sandbox environment does not open; its processes start without it');
      return { ...rest, envs: {} } as T;
    }
  }

  protected async saveState(state: SandboxState): Promise<void> {
    const file = path.join(this.dirOf(state.id), 'state.json');
    // Mode 0600, and its environment (secret-store values included) sealed.
    await fsp.writeFile(`${file}.tmp`, JSON.stringify(this.withSealedEnvs(state), null, 1), { mode: 0o600 });
    await fsp.rename(`${file}.tmp`, file);
  }

  protected info(state: SandboxState): SandboxInfo {
    return {
      id: state.id,
      orgId: state.orgId,
      hostId: state.hostId,
      ...(state.owner ? { owner: state.owner } : {}),
      status: state.status === 'running' && this.isLive(state) ? 'running' : 'stopped',
      createdAt: state.createdAt,
      metadata: state.metadata,
      patches: state.patches,
      provider: state.provider,
      ...(state.link ? { network: state.network ?? { egress: 'internet' } } : {}),
    };
  }

  async setNetwork(id: string, network: { egress: Egress }): Promise<SandboxInfo> {
    assertId(id);
    return this.lock.run(id, async () => {
      const state = this.stateOf(id);
      if (state.status !== 'running' || !this.isLive(state)) throw new SandboxError('conflict', `sandbox ${id} is not running`);
      if (!state.link) throw new SandboxError('conflict', `sandbox ${id} has no network (SANDBOX_NETWORK=off, or a provider without isolation)`);
      let egress: Egress;
      try {
        egress = normaliseEgress(network.egress);
      } catch (err) {
        throw new SandboxError('invalid_request', (err as Error).message);
      }
      await this.applyNetwork(state, egress);
      state.network = { egress };
      await this.saveState(state);
      return this.info(state);
    });
  }

  /** Puts a new policy into effect for a running sandbox with a link (providers with a network). */
  protected async applyNetwork(state: SandboxState, _egress: Egress): Promise<void> {
    throw new SandboxError('conflict', `sandbox ${state.id} has no network`);
  }

  protected stateOf(id: string): SandboxState {
    const st = this.states.get(id);
    if (!st) {
      if (this.hibernated.has(id)) throw new SandboxError('conflict', `sandbox ${id} is hibernated; wake it first`);
      throw new SandboxError('not_found', `sandbox ${id} not found`);
    }
    return st;
  }

  /** Where the respawn records of hibernated sandboxes (and of restores under way) are kept. */
  protected respawnDir(): string {
    return path.join(this.dataDir, 'hibernated');
  }

  private async readRespawn(id: string): Promise<Respawn | null> {
    try {
      return this.withOpenedEnvs(JSON.parse(await fsp.readFile(path.join(this.respawnDir(), `${id}.json`), 'utf8')) as Respawn);
    } catch {
      return null;
    }
  }

  /** Writes a respawn record durably (mode 0600: it holds the sandbox's environment). */
  private async writeRespawn(r: Respawn): Promise<void> {
    const file = path.join(this.respawnDir(), `${r.id}.json`);
    const fh = await fsp.open(`${file}.tmp`, 'w', 0o600);
    try {
      await fh.writeFile(JSON.stringify(this.withSealedEnvs(r)));
      await fh.sync();
    } finally {
      await fh.close();
    }
    await fsp.rename(`${file}.tmp`, file);
    this.hibernated.add(r.id);
  }

  private async dropRespawn(id: string): Promise<void> {
    await fsp.rm(path.join(this.respawnDir(), `${id}.json`), { force: true });
    this.hibernated.delete(id);
  }

  /** What it takes to make a live sandbox again under the same id, over `layer`. */
  private respawnOf(state: SandboxState, layer: string, kind: Respawn['kind']): Respawn {
    return {
      version: 1,
      kind,
      id: state.id,
      orgId: state.orgId,
      ...(state.owner ? { owner: state.owner } : {}),
      layer,
      envs: state.envs,
      ...(state.cwd ? { cwd: state.cwd } : {}),
      ...(state.network ? { network: state.network } : {}),
      limits: state.limits,
      metadata: state.metadata,
      at: new Date().toISOString(),
    };
  }

  /** Creates the sandbox a respawn record describes (idempotent: create is), then forgets the record. */
  private async respawn(r: Respawn, patches: { id: string; script: string }[]): Promise<SandboxInfo> {
    const { info } = await this.create({
      id: r.id,
      orgId: r.orgId,
      ...(r.owner ? { owner: r.owner } : {}),
      layers: [r.layer],
      envs: r.envs,
      ...(r.cwd ? { cwd: r.cwd } : {}),
      ...(r.network ? { network: r.network } : {}),
      memoryMB: r.limits.memoryMB,
      cpuCount: r.limits.cpuCount,
      maxProcesses: r.limits.maxProcesses,
      diskMB: r.limits.diskMB,
      metadata: r.metadata,
      patches,
    });
    await this.dropRespawn(r.id);
    return info;
  }

  /**
   * Hibernates a running sandbox: its writable layer becomes read-only layer `layerId` (copied while
   * it is frozen, like a checkpoint), a respawn record keeps what it was created with, and then it is
   * destroyed: its processes end, its memory, cgroups, id slot and network link are released.
   * Idempotent: a sandbox already hibernated answers its layer.
   */
  async hibernate(id: string, layerId: string): Promise<{ layerId: string; parents: string[] }> {
    assertId(id);
    return this.lock.run(id, async () => {
      const state = this.states.get(id);
      if (!state) {
        const r = await this.readRespawn(id);
        if (r?.kind === 'hibernated') return { layerId: r.layer, parents: [] };
        throw new SandboxError('not_found', `sandbox ${id} not found`);
      }
      if (state.status !== 'running' || !this.isLive(state)) throw new SandboxError('conflict', `sandbox ${id} is not running`);
      const layer = await this.checkpoint(id, layerId);
      await this.writeRespawn(this.respawnOf(state, layerId, 'hibernated'));
      await this.destroyUnlocked(id);
      this.log.info({ sandboxId: id, layerId }, 'sandbox hibernated');
      return layer;
    });
  }

  /**
   * Wakes a hibernated sandbox: the same id, env, limits, network policy and metadata, its files from
   * the hibernation layer; `patches` run first, in order (a failed one leaves it hibernated and throws
   * patch_failed). Throws not_found when it is not hibernated here, conflict when it is running.
   */
  async wake(id: string, patches: { id: string; script: string }[] = []): Promise<SandboxInfo> {
    assertId(id);
    const live = this.states.get(id);
    if (live) throw new SandboxError('conflict', `sandbox ${id} is ${live.status === 'running' ? 'running' : live.status}, not hibernated`);
    const r = await this.readRespawn(id);
    if (!r) throw new SandboxError('not_found', `no hibernated sandbox ${id}`);
    const info = await this.respawn(r, patches);
    this.log.info({ sandboxId: id }, 'sandbox woken');
    return info;
  }

  /**
   * Puts a running sandbox's files back to layer `layerId` (a checkpoint of it) in place: the sandbox
   * is made again under the same id over that layer (its processes end, as at a reboot), then
   * `patches` run. A host that dies half-way leaves it hibernated over the checkpoint (wake finishes it).
   */
  async restore(id: string, layerId: string, patches: { id: string; script: string }[] = []): Promise<SandboxInfo> {
    assertId(id);
    assertId(layerId, 'layer id');
    await this.expandLayers([layerId]);
    const r = await this.lock.run(id, async () => {
      const state = this.stateOf(id);
      if (state.status !== 'running' || !this.isLive(state)) throw new SandboxError('conflict', `sandbox ${id} is not running`);
      const rec = this.respawnOf(state, layerId, 'restoring');
      await this.writeRespawn(rec);
      await this.destroyUnlocked(id);
      return rec;
    });
    const info = await this.respawn(r, patches);
    this.log.info({ sandboxId: id, layerId }, 'sandbox restored');
    return info;
  }

  async init(): Promise<SandboxInfo[]> {
    // Root's alone: other host users may not read sandboxes' files and layers, nor replace anything
    // there (a layer redirected by a symlink, say). Directories made by an older host are closed too.
    for (const dir of [this.dataDir, this.sandboxesDir(), this.layersDir()]) {
      await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
      await fsp.chmod(dir, 0o700);
    }
    this.scratchDir = await this.resolveScratch();
    await this.prepare();
    for (const id of await fsp.readdir(this.sandboxesDir())) {
      if (this.states.has(id)) continue;
      let state: SandboxState | undefined;
      try {
        state = this.withOpenedEnvs(JSON.parse(await fsp.readFile(path.join(this.dirOf(id), 'state.json'), 'utf8')) as SandboxState);
      } catch {
        state = undefined;
      }
      if (!state || state.status === 'creating' || state.provider !== this.kind) {
        if (state && state.provider !== this.kind) {
          this.log.warn({ sandboxId: id, provider: state.provider }, 'sandbox belongs to another provider; left alone');
          continue;
        }
        this.log.warn({ sandboxId: id }, 'removing incomplete sandbox');
        await this.destroyUnlocked(id).catch((err) => this.log.error({ err, sandboxId: id }, 'cleanup failed'));
        continue;
      }
      if (state.entrypoint?.starting) await this.adoptInterruptedStart(state);
      if (state.status === 'running' && !this.isLive(state)) {
        state.status = 'stopped';
        await this.saveState(state);
        this.log.warn({ sandboxId: id }, 'sandbox init is gone; marked stopped');
      }
      this.adopted(state);
      this.states.set(id, state);
    }
    await this.removeUnlinkedScratch();
    await fsp.mkdir(this.respawnDir(), { recursive: true, mode: 0o700 });
    for (const name of await fsp.readdir(this.respawnDir())) {
      if (!name.endsWith('.json')) continue;
      const id = name.slice(0, -'.json'.length);
      // A respawn record next to a live sandbox: the host died after the record, before the destroy.
      // Hibernation is then redone by the caller's retry; a restore is finished below.
      if (!this.states.has(id)) this.hibernated.add(id);
    }
    const all = [...this.states.values()].map((s) => this.info(s));
    this.log.info({ count: all.length, scratchDir: this.scratchDir }, 'sandboxes adopted');
    return all;
  }

  async create(req: CreateSandboxRequest): Promise<CreateResult> {
    assertId(req.id);
    const w = this.waitingCreates.get(req.id) ?? { waiting: 0, destroys: 0 };
    this.waitingCreates.set(req.id, w);
    w.waiting++;
    const destroysBefore = w.destroys;
    return this.lock.run(req.id, async () => {
      if (--w.waiting === 0) this.waitingCreates.delete(req.id);
      // A create sent before its sandbox was destroyed (a retry of a caller's attempt that another
      // attempt finished, e.g. a session's provisioning run twice at once) must not make it again
      // and run its entrypoint a second time: the caller looks again at why it was destroyed.
      if (w.destroys !== destroysBefore) {
        throw new SandboxError('conflict', `sandbox ${req.id} was destroyed while this create waited; not created again`);
      }
      const existing = this.states.get(req.id);
      if (existing) {
        // A create retried after a host crash that came before the entrypoint's start (see
        // adoptInterruptedStart) starts it now; one that finds it started never starts it again.
        if (req.entrypoint && !existing.entrypoint && existing.status === 'running' && this.isLive(existing)) {
          await this.startEntrypointUnlocked(existing, req.entrypoint);
          await this.saveState(existing);
        }
        return { info: this.info(existing), created: false };
      }
      envPairs(req.envs, req.entrypoint?.env);
      const t0 = Date.now();
      const state: SandboxState = {
        version: 1,
        id: req.id,
        orgId: req.orgId,
        hostId: this.hostId,
        provider: this.kind,
        ...(req.owner ? { owner: req.owner } : {}),
        layers: await this.expandLayers(req.layers ?? []),
        envs: req.envs ?? {},
        ...(req.cwd ? { cwd: req.cwd } : {}),
        ...(req.network ? { network: req.network } : {}),
        limits: { memoryMB: req.memoryMB, cpuCount: req.cpuCount, maxProcesses: req.maxProcesses ?? 512, diskMB: req.diskMB },
        createdAt: new Date().toISOString(),
        metadata: req.metadata ?? {},
        patches: [],
        status: 'creating',
      };
      await this.makeDir(req.id, req.owner);
      try {
        // state.json is written once the sandbox runs: after a crash before that, adoption finds a
        // directory without it and removes it (killing what joined the sandbox's cgroups).
        await this.provision(state);
        state.status = 'running';
        this.states.set(state.id, state);
        for (const [p, content] of Object.entries(req.files ?? {})) {
          await writeSandboxFile(await this.rootMap(state), p, Buffer.from(content, 'utf8'));
        }
        for (const patch of req.patches ?? []) {
          const outcome = await this.runPatch(state, patch);
          state.patches.push(outcome);
          if (outcome.exitCode !== 0) {
            throw new SandboxError(
              'patch_failed',
              `patch ${patch.id} failed with exit code ${outcome.exitCode}: ${outcome.outputTail.slice(-500)}`,
            );
          }
        }
        if (req.entrypoint) await this.startEntrypointUnlocked(state, req.entrypoint);
        await this.saveState(state);
      } catch (err) {
        this.log.warn({ sandboxId: req.id, err: (err as Error).message }, 'create failed; destroying');
        await this.destroyUnlocked(req.id).catch((e) => this.log.error({ err: e, sandboxId: req.id }, 'cleanup failed'));
        throw err;
      }
      this.log.info({ sandboxId: req.id, ms: Date.now() - t0 }, 'sandbox created');
      return { info: this.info(state), created: true };
    });
  }

  /**
   * A host that died while starting an entrypoint left `starting` in its state.json: the start may
   * or may not have happened. The run's files decide (settleInterruptedRun): a run its helper
   * claimed is adopted (its helper, if still alive, is the wrapper; its exit file says how it
   * ended) and recorded in the audit log (again, perhaps: lines of one run share its `run`); one
   * not claimed is cancelled for good, and a create of the same sandbox (the caller's retry) starts
   * a new run. Either way the entrypoint runs once.
   */
  private async adoptInterruptedStart(state: SandboxState): Promise<void> {
    const run = state.entrypoint!.run;
    if (run) {
      const dir = this.dirOf(state.id);
      const settled = await settleInterruptedRun(dir, run);
      if (settled.outcome === 'started') {
        const claimed = runFiles(dir, run).claimed;
        const own = settled.pid !== null && (await fsp.readFile(`/proc/${settled.pid}/cmdline`, 'utf8').catch(() => '')).split('\0').includes(claimed);
        const { starting: _, ...ep } = state.entrypoint!;
        state.entrypoint = { ...ep, wrapper: (own ? procRef(settled.pid!) : null) ?? { pid: 0, start: -1 } };
        // Its line, unless the previous host wrote it before dying.
        if (this.audit && !(await this.audit.hasRun(run).catch(() => false))) {
          await this.recordStart(state, run, true).catch((err) => this.log.error({ err, sandboxId: state.id }, 'entrypoint audit log write failed'));
        }
        this.log.warn({ sandboxId: state.id, run, pid: settled.pid, alive: own }, 'adopted an entrypoint run that its helper claimed before the previous host recorded it');
      } else {
        delete state.entrypoint;
        this.log.warn({ sandboxId: state.id, run, outcome: settled.outcome }, 'the previous host died before the entrypoint run was claimed; it is cancelled, and the next create starts a new one');
      }
      await this.saveState(state);
      return;
    }
    // A state of an older host (no run files): its helper or exit file says whether it started.
    const exitFile = path.join(this.dirOf(state.id), 'entrypoint.exit');
    // The helper first: it writes the exit file before it exits, so one of the two is seen.
    const helper = await processNaming(exitFile);
    const exited = await fsp.stat(exitFile).then(() => true, () => false);
    if (helper !== null || exited) {
      const { starting: _, ...ep } = state.entrypoint!;
      state.entrypoint = { ...ep, wrapper: procRef(helper ?? undefined) ?? { pid: 0, start: -1 } };
      this.log.warn({ sandboxId: state.id, pid: helper }, 'adopted an entrypoint whose start the previous host did not finish recording');
    } else {
      delete state.entrypoint;
      this.log.warn({ sandboxId: state.id }, 'the previous host died before starting the entrypoint; the next create starts it');
    }
    await this.saveState(state);
  }

  /** Removes scratch directories no sandbox links to (the host died between making one and linking it). */
  private async removeUnlinkedScratch(): Promise<void> {
    if (!this.scratchDir) return;
    for (const name of await fsp.readdir(this.scratchDir)) {
      const linked = await this.scratchTarget(this.dirOf(name));
      if (linked !== path.join(this.scratchDir, name)) await fsp.rm(path.join(this.scratchDir, name), { recursive: true, force: true });
    }
  }

  /** Expands checkpoint layers with the layers they were taken over; throws not_found for a missing one. */
  protected async expandLayers(layers: string[]): Promise<string[]> {
    const out: string[] = [];
    const visit = async (id: string) => {
      assertId(id, 'layer id');
      if (out.includes(id)) return;
      let manifest: { parents?: string[] };
      try {
        manifest = JSON.parse(await fsp.readFile(path.join(this.layersDir(), id, 'layer.json'), 'utf8'));
      } catch {
        throw new SandboxError('not_found', `layer ${id} not found`);
      }
      out.push(id);
      for (const p of manifest.parents ?? []) await visit(p);
    };
    for (const l of layers) await visit(l);
    return out;
  }

  get(id: string): SandboxInfo | null {
    const st = this.states.get(id);
    return st ? this.info(st) : null;
  }

  /** How many sandboxes are live and the sum of their memory limits (placement reads it through /healthz). */
  load(): { sandboxes: number; reservedMB: number } {
    let reservedMB = 0;
    for (const s of this.states.values()) reservedMB += s.limits?.memoryMB ?? 0;
    return { sandboxes: this.states.size, reservedMB };
  }

  list(filter: ListFilter = {}): SandboxInfo[] {
    return [...this.states.values()]
      .filter((s) => !filter.ownerKind || s.owner?.kind === filter.ownerKind)
      .filter((s) => !filter.ownerId || s.owner?.id === filter.ownerId)
      .map((s) => this.info(s));
  }

  async destroy(id: string): Promise<boolean> {
    assertId(id);
    return this.lock.run(id, async () => {
      const live = await this.destroyUnlocked(id);
      const w = this.waitingCreates.get(id);
      if (w && live) w.destroys++;
      const wasHibernated = this.hibernated.has(id) || (await this.readRespawn(id)) !== null;
      if (wasHibernated) await this.dropRespawn(id);
      await this.dropHibernationLayers(id);
      return live || wasHibernated;
    });
  }

  /** Removes the hibernation layers of a sandbox that is gone, except those a layer (a checkpoint) stands on. */
  private async dropHibernationLayers(id: string): Promise<void> {
    const names = await fsp.readdir(this.layersDir()).catch(() => [] as string[]);
    const mine = names.filter((n) => n.startsWith(`${id}${HIBERNATION_LAYER_MARK}`) && !n.includes('.tmp-'));
    if (mine.length === 0) return;
    const used = new Set<string>();
    for (const n of names) {
      if (mine.includes(n) || n.includes('.tmp-')) continue;
      const m = await fsp.readFile(path.join(this.layersDir(), n, 'layer.json'), 'utf8').then((t) => JSON.parse(t) as { parents?: string[] }, () => ({ parents: [] }));
      for (const p of m.parents ?? []) used.add(p);
    }
    for (const n of mine) if (!used.has(n)) await this.deleteLayer(n).catch((err) => this.log.warn({ err, layerId: n }, 'could not delete a hibernation layer'));
  }

  private async destroyUnlocked(id: string): Promise<boolean> {
    const state = this.states.get(id);
    const dir = this.dirOf(id);
    // lstat: a link into the scratch directory whose target is gone (the machine rebooted) still counts.
    const exists = state !== undefined || (await fsp.lstat(dir).then(() => true, () => false));
    if (!exists) return false;
    const scratch = await this.scratchTarget(dir);
    let onDisk = state;
    if (!onDisk) {
      onDisk = await fsp
        .readFile(path.join(dir, 'state.json'), 'utf8')
        .then((t) => JSON.parse(t) as SandboxState)
        .catch(() => undefined);
    }
    if (onDisk?.entrypoint) signalRef(onDisk.entrypoint.wrapper, 'SIGKILL');
    await this.teardown(id, onDisk);
    if (scratch) await fsp.rm(scratch, { recursive: true, force: true });
    await fsp.rm(dir, { recursive: true, force: true });
    this.states.delete(id);
    this.log.info({ sandboxId: id }, 'sandbox destroyed');
    return true;
  }

  async writeFile(id: string, p: string, content: Buffer, mode?: number): Promise<void> {
    await writeSandboxFile(await this.runningRootMap(id), p, content, mode);
  }

  async readFile(id: string, p: string, maxBytes: number): Promise<Buffer> {
    return readSandboxFile(await this.runningRootMap(id), p, maxBytes);
  }

  fileRoot(id: string): Promise<RootMap> {
    return this.runningRootMap(id);
  }

  /** The files of a running sandbox; conflict when it is stopped (its init is gone, so is its tree). */
  private async runningRootMap(id: string): Promise<RootMap> {
    const state = this.stateOf(id);
    if (state.status !== 'running' || !this.isLive(state)) throw new SandboxError('conflict', `sandbox ${id} is not running`);
    return this.rootMap(state);
  }

  networkArgv(id: string): string[] {
    const state = this.stateOf(id);
    if (state.status !== 'running' || !this.isLive(state)) throw new SandboxError('conflict', `sandbox ${id} is not running`);
    return this.networkPrefix(state);
  }

  /** See networkArgv; providers without a network namespace keep this default. */
  protected networkPrefix(_state: SandboxState): string[] {
    return [];
  }

  spawn(id: string, opts: SpawnOptions): ChildProcess {
    const { state, cgroupProcs } = this.spawnable(id, opts);
    // Terminals and patches (and exec commands without the spawner helper) live in this process's memory: if it dies, they are hung up.
    const direct = this.enterArgv(state, opts, { cgroupProcs, hangUpWithCaller: process.pid, ...(opts.pty ? { pty: opts.pty, ownGroup: true } : {}) });
    if (direct) {
      const stdio: ('pipe')[] = opts.pty ? ['pipe', 'pipe', 'pipe', 'pipe'] : ['pipe', 'pipe', 'pipe'];
      return spawn(direct[0]!, direct.slice(1), { stdio, detached: true, env: this.enterEnv(state, opts) });
    }
    if (opts.pty) throw new SandboxError('invalid_request', `terminals need the namespaces provider (this host runs ${this.kind})`);
    const inner = this.innerArgv(state, opts);
    const script = `${cgroupJoin(cgroupProcs)} exec "$@"`;
    return spawn('/bin/sh', ['-c', script, 'sh', ...inner], {
      stdio: ['pipe', 'pipe', 'pipe'],
      detached: true,
      env: { PATH: DEFAULT_ENV.PATH },
    });
  }

  /**
   * spawn without a terminal, started by the spawner helper when there is one (no fork of this
   * process: see Spawner.exec); the command then hangs up with the helper, which exits with this
   * process.
   */
  async spawnPiped(id: string, opts: SpawnOptions): Promise<PipedProcess> {
    if (opts.pty) return this.spawn(id, opts);
    const helperPid = this.spawner.helperPid();
    if (helperPid !== null) {
      const { state, cgroupProcs } = this.spawnable(id, opts);
      const direct = this.enterArgv(state, opts, { cgroupProcs, hangUpWithCaller: helperPid });
      const child = direct ? await this.spawner.exec(direct, this.enterEnv(state, opts), helperPid) : null;
      if (child) return child;
    }
    return this.spawn(id, opts);
  }

  /** A running sandbox's state and cgroups for a new process, or conflict / invalid_request. */
  private spawnable(id: string, opts: SpawnOptions): { state: SandboxState; cgroupProcs: string[] } {
    const state = this.stateOf(id);
    if (state.status !== 'running' || !this.isLive(state)) throw new SandboxError('conflict', `sandbox ${id} is not running`);
    if (!opts.argv.length || opts.argv[0].includes('=')) {
      throw new SandboxError('invalid_request', 'argv must be non-empty and argv[0] must not contain "="');
    }
    return { state, cgroupProcs: SandboxCgroups.of(id).procsFiles() };
  }

  private runPatch(state: SandboxState, patch: { id: string; script: string }): Promise<PatchOutcome> {
    return new Promise((resolve, reject) => {
      const child = this.spawn(state.id, { argv: ['/bin/bash', '-c', patch.script] });
      let tail = Buffer.alloc(0);
      const add = (b: Buffer) => {
        tail = Buffer.concat([tail, b]);
        if (tail.length > PATCH_TAIL_BYTES * 2) tail = tail.subarray(tail.length - PATCH_TAIL_BYTES);
      };
      child.stdin?.end();
      child.stdout?.on('data', add);
      child.stderr?.on('data', add);
      child.on('error', reject);
      child.on('close', (code, signal) => {
        const outputTail = tail.subarray(Math.max(0, tail.length - PATCH_TAIL_BYTES)).toString('utf8');
        resolve({ id: patch.id, exitCode: code ?? (signal ? 128 : -1), outputTail });
      });
    });
  }

  async startEntrypoint(id: string, spec: EntrypointSpec): Promise<EntrypointStatus> {
    return this.lock.run(id, async () => {
      const state = this.stateOf(id);
      await this.startEntrypointUnlocked(state, spec);
      await this.saveState(state);
      return this.entrypointStatus(id);
    });
  }

  private async startEntrypointUnlocked(state: SandboxState, spec: EntrypointSpec): Promise<void> {
    if (state.entrypoint) throw new SandboxError('conflict', `sandbox ${state.id} already has an entrypoint`);
    if (state.status !== 'running' || !this.isLive(state)) {
      throw new SandboxError('conflict', `sandbox ${state.id} is not running`);
    }
    if (!spec.argv.length || spec.argv[0].includes('=')) {
      throw new SandboxError('invalid_request', 'entrypoint argv must be non-empty and argv[0] must not contain "="');
    }
    const dir = this.dirOf(state.id);
    const exitFile = path.join(dir, 'entrypoint.exit');
    const cgroupProcs = SandboxCgroups.of(state.id).procsFiles();
    const run = randomBytes(8).toString('hex');
    const files = runFiles(dir, run);
    // Runs outside the sandbox, detached, so the exit code is written even when the host is gone:
    // by the entry helper, or by a shell wrapper around innerArgv (+ GNU timeout).
    const entered: SpawnOptions = { argv: spec.argv, env: spec.env, cwd: spec.cwd };
    let wrapperArgv = this.enterArgv(state, entered, {
      cgroupProcs,
      ownGroup: true,
      exitFile,
      logIndex: path.join(dir, 'entrypoint.idx'),
      runFile: files.claimed,
      ...(spec.timeoutSeconds ? { timeoutSeconds: spec.timeoutSeconds, killAfterSeconds: KILL_AFTER_SECONDS } : {}),
    });
    let wrapperEnv = this.enterEnv(state, entered);
    if (!wrapperArgv) {
      wrapperEnv = { PATH: DEFAULT_ENV.PATH };
      const argv = spec.timeoutSeconds
        ? ['timeout', '--signal=TERM', `--kill-after=${KILL_AFTER_SECONDS}`, String(spec.timeoutSeconds), ...spec.argv]
        : spec.argv;
      const inner = this.innerArgv(state, { argv, env: spec.env, cwd: spec.cwd });
      const script =
        // The claim first (see EnterOptions.runFile): nothing starts once the pending file is gone.
        `mv -T -- ${shq(files.pending)} ${shq(files.claimed)} 2>/dev/null || exit 125; ` +
        `${cgroupJoin(cgroupProcs)} "$@"; code=$?; ` +
        // One short write, with shell builtins only; the file's modification time is the exit time.
        `printf '%s\\n' "$code" > ${shq(exitFile)}`;
      wrapperArgv = ['/bin/sh', '-c', script, 'sh', ...inner];
    }
    // Saved before the start (on disk only: until the helper runs, the entrypoint is not there to
    // report on): after a crash, the next host knows that a start may have happened, and which run.
    const starting = { wrapper: { pid: 0, start: -1 }, startedAt: new Date().toISOString(), ...(spec.timeoutSeconds ? { timeoutSeconds: spec.timeoutSeconds } : {}), starting: true, run };
    await this.saveState({ ...state, entrypoint: starting });
    // The run's ticket: its helper claims it by renaming it (the durable mark that the run began), a
    // restarted host cancels it by renaming it away; whichever comes first wins (settleInterruptedRun).
    await writeDurably(files.pending, '');
    await this.testPause('before-spawn', state, spec);
    let pid: number;
    try {
      pid = await this.spawner.spawn({
        argv: wrapperArgv,
        env: wrapperEnv,
        stdout: path.join(dir, 'entrypoint.out'),
        stderr: path.join(dir, 'entrypoint.err'),
      });
    } catch (e) {
      this.log.error({ err: e, sandboxId: state.id }, 'entrypoint wrapper failed');
      // Whatever the spawner did, this run can no longer start, unless it was claimed already.
      const settled = await settleInterruptedRun(dir, run).catch(() => null);
      if (settled?.outcome !== 'started') {
        await this.saveState(state);
        throw new SandboxError('internal', `could not start the entrypoint of ${state.id}: ${(e as Error).message}`);
      }
      pid = settled.pid ?? 0;
    }
    const wrapper = procRef(pid) ?? { pid, start: -1 };
    if (!(await this.awaitClaim(dir, run, wrapper))) {
      await this.saveState(state);
      throw new SandboxError('internal', `the entrypoint helper of ${state.id} exited (or did not answer within ${this.claimTimeoutMs} ms) before starting it; nothing was started`);
    }
    await this.testPause('after-claim', state, spec);
    // The run began (its claim is on disk): the audit line records that, never an intent.
    try {
      await this.recordStart(state, run, false);
    } catch (e) {
      // The run is under way and cannot be undone; its claim stays on disk as its record.
      this.log.error({ err: e, sandboxId: state.id, run }, 'entrypoint audit log write failed');
    }
    state.entrypoint = {
      wrapper,
      startedAt: starting.startedAt,
      ...(spec.timeoutSeconds ? { timeoutSeconds: spec.timeoutSeconds } : {}),
      run,
    };
    this.log.info({ sandboxId: state.id, pid: wrapper.pid, run }, 'entrypoint started');
  }

  /** Appends a run's `entrypoint_start` line to the audit log (durable when it resolves). */
  private async recordStart(state: SandboxState, run: string, recovered: boolean): Promise<void> {
    await this.audit?.record({
      at: new Date().toISOString(),
      event: 'entrypoint_start',
      sandboxId: state.id,
      orgId: state.orgId,
      hostId: state.hostId,
      ...(state.owner ? { owner: state.owner } : {}),
      run,
      ...(recovered ? { recovered } : {}),
    });
  }

  /**
   * Waits until the run's helper has claimed it (true), or has exited or taken longer than the claim
   * timeout without (the run is then cancelled for good: false; a claim that wins that race is true).
   */
  private async awaitClaim(dir: string, run: string, wrapper: ProcRef): Promise<boolean> {
    const files = runFiles(dir, run);
    const claimed = () => fsp.access(files.claimed).then(() => true, () => false);
    const deadline = Date.now() + this.claimTimeoutMs;
    for (let waitMs = 1; ; waitMs = Math.min(waitMs * 2, 50)) {
      if (await claimed()) return true;
      if (!isAlive(wrapper) || Date.now() >= deadline) {
        const settled = await settleInterruptedRun(dir, run);
        if (settled.outcome === 'started') return true;
        signalRef(wrapper, 'SIGKILL');
        return false;
      }
      await sleep(waitMs);
    }
  }

  /**
   * Tests only, off unless SANDBOX_TEST_PAUSE_FILE is set: when that file reads `<point> <marker>`
   * and the entrypoint's argv contains the marker, the start stops at `point` (renaming the file to
   * `<file>.reached`, so it stops once) until `<file>.reached` is removed or a minute has passed:
   * a test kills the host there.
   */
  private async testPause(point: 'before-spawn' | 'after-claim', state: SandboxState, spec: EntrypointSpec): Promise<void> {
    const file = this.testPauseFile;
    if (!file) return;
    const [at, marker] = (await fsp.readFile(file, 'utf8').catch(() => '')).trim().split(/\s+/);
    if (at !== point || !marker || !spec.argv.some((a) => a.includes(marker))) return;
    const reached = `${file}.reached`;
    if (!(await fsp.rename(file, reached).then(() => true, () => false))) return;
    this.log.warn({ sandboxId: state.id, point }, 'test pause: the entrypoint start stops here');
    const until = Date.now() + 60_000;
    while (Date.now() < until && (await fsp.access(reached).then(() => true, () => false))) await sleep(50);
  }

  /** The entrypoint's exit code and time (the exit file's mtime), or null before it has been written whole. */
  private async readExit(id: string): Promise<{ code: number; at: number } | null> {
    const file = path.join(this.dirOf(id), 'entrypoint.exit');
    // One tiny file in the sandbox's directory (a tmpfs for sessions): read in place, without two
    // trips through the thread pool.
    let fd: number | undefined;
    try {
      fd = openSync(file, 'r');
      const buf = Buffer.alloc(32);
      const n = readSync(fd, buf, 0, buf.length, 0);
      const text = buf.toString('latin1', 0, n);
      if (!/^-?\d+\n/.test(text)) return null;
      return { code: Number(text.trim().split(' ')[0]), at: Math.round(fstatSync(fd).mtimeMs) };
    } catch {
      return null;
    } finally {
      if (fd !== undefined) closeSync(fd);
    }
  }

  async entrypointStatus(id: string): Promise<EntrypointStatus> {
    const state = this.stateOf(id);
    const ep = state.entrypoint;
    if (!ep) return { state: 'none' };
    let exit = await this.readExit(id);
    if (!exit && isAlive(ep.wrapper)) return { state: 'running', pid: ep.wrapper.pid, startedAt: ep.startedAt };
    exit ??= await this.readExit(id);
    if (!exit) {
      // The wrapper died without recording an exit (killed with the sandbox, or the machine rebooted).
      return { state: 'exited', exitCode: -1, timedOut: false, signal: 'SIGKILL', startedAt: ep.startedAt, exitedAt: ep.startedAt };
    }
    const elapsed = exit.at - Date.parse(ep.startedAt);
    const timedOut =
      !!ep.timeoutSeconds && (exit.code === 124 || (exit.code === 137 && elapsed >= ep.timeoutSeconds * 1000 - 50));
    const sig = exit.code > 128 && exit.code < 160 ? signalName(exit.code - 128) : null;
    // Read while the sandbox's cgroups exist (a session captures its ending before destroying them).
    const oomKilled = SandboxCgroups.of(id).oomKills() > 0;
    return {
      state: 'exited',
      exitCode: exit.code,
      timedOut,
      signal: timedOut ? 'SIGTERM' : sig,
      startedAt: ep.startedAt,
      exitedAt: new Date(exit.at).toISOString(),
      ...(oomKilled ? { oomKilled } : {}),
    };
  }

  /**
   * The entrypoint's status once it has exited or `waitMs` has passed. The wrapper's exit file is
   * watched (inotify), so a wait costs no polling; a slow poll stays as a safety net, and a fast one
   * where the directory cannot be watched.
   */
  async waitEntrypoint(id: string, waitMs: number, signal?: AbortSignal): Promise<EntrypointStatus> {
    const deadline = Date.now() + Math.max(0, waitMs);
    let status = await this.entrypointStatus(id);
    if (status.state !== 'running' || waitMs <= 0) return status;
    let wake: (() => void) | undefined;
    let woken = false;
    let watcher: FSWatcher | undefined;
    try {
      watcher = watch(this.dirOf(id), (_ev, file) => {
        if (file !== 'entrypoint.exit') return;
        woken = true;
        wake?.();
      });
      watcher.on('error', () => undefined);
    } catch {
      watcher = undefined;
    }
    const pollMs = watcher ? WATCHED_POLL_MS : UNWATCHED_POLL_MS;
    const onAbort = () => wake?.();
    signal?.addEventListener('abort', onAbort);
    try {
      // The exit may have been written between the first look and the watch.
      if (watcher) status = await this.entrypointStatus(id);
      while (status.state === 'running' && Date.now() < deadline && !signal?.aborted) {
        if (!woken) {
          await new Promise<void>((r) => {
            const t = setTimeout(r, Math.min(pollMs, Math.max(1, deadline - Date.now())));
            wake = () => {
              clearTimeout(t);
              r();
            };
          });
        }
        woken = false;
        if (!this.states.has(id)) break;
        status = await this.entrypointStatus(id);
      }
    } finally {
      signal?.removeEventListener('abort', onAbort);
      watcher?.close();
    }
    return status;
  }

  /**
   * The entrypoint's stdout and stderr in the order they were written: the last `maxBytes` of
   * each, as chunks tagged with their stream and time, put back in order from the index the entry
   * helper keeps (`-L`). Bytes of a file that no index record covers (the helper's own messages, or
   * a provider without an index) come where they lie in their file, with no time.
   */
  async entrypointLog(id: string, maxBytes: number, since: { stdout?: number; stderr?: number } = {}): Promise<EntrypointLog> {
    this.stateOf(id);
    const dir = this.dirOf(id);
    /** The last `max` bytes of `file`, or fewer: nothing before `from`. */
    const readTail = async (file: string, max: number, from = 0): Promise<{ size: number; start: number; data: Buffer }> => {
      let fh;
      try {
        fh = await fsp.open(file, 'r');
      } catch {
        return { size: 0, start: 0, data: Buffer.alloc(0) };
      }
      try {
        const { size } = await fh.stat();
        const start = Math.min(size, Math.max(from, size - max));
        const data = Buffer.alloc(size - start);
        const { bytesRead } = await fh.read(data, 0, data.length, start);
        return { size, start, data: data.subarray(0, bytesRead) };
      } finally {
        await fh.close();
      }
    };
    const [out, err] = await Promise.all([
      readTail(path.join(dir, 'entrypoint.out'), maxBytes, since.stdout),
      readTail(path.join(dir, 'entrypoint.err'), maxBytes, since.stderr),
    ]);
    // Enough of the index to cover both tails: records are at least a byte each, so 2 × maxBytes records at most.
    const idx = await readTail(path.join(dir, 'entrypoint.idx'), Math.min(2 * maxBytes, 1 << 22) * 24);
    const skip = (24 - ((idx.start % 24) as number)) % 24;
    const records: { stream: 'stdout' | 'stderr'; len: number; offset: number; at: number }[] = [];
    for (let p = skip; p + 24 <= idx.data.length; p += 24) {
      const s = idx.data[p];
      if (s !== 1 && s !== 2) continue;
      records.push({ stream: s === 1 ? 'stdout' : 'stderr', len: idx.data.readUInt32LE(p + 4), offset: Number(idx.data.readBigUInt64LE(p + 8)), at: Number(idx.data.readBigUInt64LE(p + 16)) });
    }
    const tails = { stdout: out, stderr: err };
    const next = { stdout: out.start, stderr: err.start };
    const chunks: EntrypointLogChunk[] = [];
    const take = (stream: 'stdout' | 'stderr', from: number, to: number, at: number | null) => {
      const t = tails[stream];
      const a = Math.max(from, next[stream]);
      const b = Math.min(to, t.start + t.data.length);
      if (b <= a) return;
      chunks.push({ stream, at, offset: a, data: t.data.subarray(a - t.start, b - t.start) });
      next[stream] = b;
    };
    for (const r of records) {
      // What lies before this chunk in its file and no record covered comes first, untimed.
      if (r.offset > next[r.stream]) take(r.stream, next[r.stream], r.offset, null);
      take(r.stream, r.offset, r.offset + r.len, r.at);
    }
    for (const stream of ['stdout', 'stderr'] as const) take(stream, next[stream], tails[stream].size, null);
    // Truncated: the beginning was cut for size (not merely skipped with `since`).
    return {
      chunks,
      bytes: { stdout: out.size, stderr: err.size },
      truncated: { stdout: out.start > (since.stdout ?? 0), stderr: err.start > (since.stderr ?? 0) },
    };
  }

  async entrypointOutput(id: string, stream: 'stdout' | 'stderr', maxBytes: number): Promise<Buffer> {
    this.stateOf(id);
    const file = path.join(this.dirOf(id), stream === 'stdout' ? 'entrypoint.out' : 'entrypoint.err');
    let fh;
    try {
      fh = await fsp.open(file, 'r');
    } catch {
      return Buffer.alloc(0);
    }
    try {
      const { size } = await fh.stat();
      const len = Math.min(size, maxBytes);
      const buf = Buffer.alloc(len);
      await fh.read(buf, 0, len, size - len);
      return buf;
    } finally {
      await fh.close();
    }
  }

  async checkpoint(id: string, layerId: string): Promise<{ layerId: string; parents: string[]; sizeBytes?: number }> {
    void id;
    void layerId;
    throw new SandboxError('invalid_request', `checkpoints are not supported by the ${this.kind} provider`);
  }

  async deleteLayer(layerId: string): Promise<boolean> {
    assertId(layerId, 'layer id');
    const dir = path.join(this.layersDir(), layerId);
    const exists = await fsp.stat(dir).then(() => true, () => false);
    if (!exists) return false;
    await fsp.rm(dir, { recursive: true, force: true });
    return true;
  }

  async layerHash(layerId: string): Promise<string> {
    void layerId;
    throw new SandboxError('invalid_request', `layers are not supported by the ${this.kind} provider`);
  }

  /** See SandboxProvider.hasLayer. */
  async hasLayer(layerId: string): Promise<boolean> {
    assertId(layerId, 'layer id');
    return fsp.stat(path.join(this.layersDir(), layerId, 'layer.json')).then(() => true, () => false);
  }

  /**
   * See SandboxProvider.exportLayer: the layer's directory as a tar stream (numeric owners, modes,
   * xattrs and the overlay's whiteouts kept), with its content hash (layerHash) for the receiver to check.
   */
  async exportLayer(layerId: string): Promise<{ sha256: string; stream: NodeJS.ReadableStream; done: Promise<void> }> {
    if (!(await this.hasLayer(layerId))) throw new SandboxError('not_found', `layer ${layerId} not found`);
    const sha256 = await this.layerHash(layerId);
    // --sparse: holes are recorded, not sent (tar finds a file's data with SEEK_DATA / SEEK_HOLE).
    const tar = spawn('tar', ['-C', this.layersDir(), '--numeric-owner', '--xattrs', '--xattrs-include=*', '--sparse', '-cf', '-', layerId], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    tar.stderr!.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
    const done = new Promise<void>((resolve, reject) =>
      tar.once('close', (code) => (code === 0 ? resolve() : reject(new Error(`tar of layer ${layerId} failed: ${stderr.trim() || `exit ${code}`}`)))),
    );
    return { sha256, stream: tar.stdout!, done };
  }

  /**
   * See SandboxProvider.importLayer: unpacks a tar stream of exportLayer beside the layers, checks its
   * content hash against `sha256`, then renames it into place (a half-received layer is never seen).
   */
  async importLayer(layerId: string, stream: NodeJS.ReadableStream, sha256: string): Promise<{ parents: string[] }> {
    assertId(layerId, 'layer id');
    const tmp = path.join(this.layersDir(), `${layerId}.tmp-import-${randomBytes(4).toString('hex')}`);
    await fsp.mkdir(tmp, { recursive: true, mode: 0o700 });
    try {
      const tar = spawn('tar', ['-C', tmp, '--numeric-owner', '--same-owner', '--same-permissions', '--xattrs', '--xattrs-include=*', '-xf', '-'], { stdio: ['pipe', 'ignore', 'pipe'] });
      let stderr = '';
      tar.stderr!.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
      const exited = new Promise<number | null>((resolve) => tar.once('close', resolve));
      await pipeline(stream as NodeJS.ReadableStream & AsyncIterable<Buffer>, tar.stdin!);
      const code = await exited;
      if (code !== 0) throw new SandboxError('internal', `unpacking layer ${layerId} failed: ${stderr.trim() || `exit ${code}`}`);
      const unpacked = path.join(tmp, layerId);
      const manifest = JSON.parse(await fsp.readFile(path.join(unpacked, 'layer.json'), 'utf8')) as { parents?: string[] };
      // Checked where it will live: layerHash reads <layers>/<id>; a rename within the directory is atomic.
      const staged = `${tmp}-staged`;
      await fsp.rename(unpacked, staged);
      const { sha256: got, setid } = await this.scanLayerDir(staged);
      if (got !== sha256) {
        await fsp.rm(staged, { recursive: true, force: true });
        throw new SandboxError('internal', `layer ${layerId} arrived damaged (sha256 ${got}, expected ${sha256})`);
      }
      if (setid.length > 0) {
        // A layer keeps set-id bits as data (setid.json), never on disk, where they would be the host's.
        await fsp.rm(staged, { recursive: true, force: true });
        throw new SandboxError('invalid_request', `layer ${layerId} holds set-id files (${setid[0]![0]}…)`);
      }
      // The layer's own directory is root's alone, whatever the sender's was (it is not hashed).
      await fsp.chown(staged, 0, 0);
      await fsp.chmod(staged, 0o700);
      await fsp.rename(staged, path.join(this.layersDir(), layerId)).catch(async (err: NodeJS.ErrnoException) => {
        // Another import of the same layer got there first: the same content, keep theirs.
        await fsp.rm(staged, { recursive: true, force: true });
        if (err.code !== 'ENOTEMPTY' && err.code !== 'EEXIST') throw err;
      });
      return { parents: manifest.parents ?? [] };
    } finally {
      await fsp.rm(tmp, { recursive: true, force: true });
    }
  }

  /** hashOfDir, with the directory's regular files that carry set-id bits; providers with layers implement it. */
  protected async scanLayerDir(dir: string): Promise<LayerScan> {
    return { sha256: await this.hashOfDir(dir), setid: [] };
  }

  /** layerHash of a directory that is not (yet) a layer; providers with layers implement it. */
  protected async hashOfDir(dir: string): Promise<string> {
    void dir;
    throw new SandboxError('invalid_request', `layers are not supported by the ${this.kind} provider`);
  }

  /** See SandboxProvider.close: stops the spawner helper (the processes it started live on). */
  async close(): Promise<void> {
    this.spawner.close();
    await this.audit?.close();
    // An empty scratch directory goes with the host (the next start makes it again); one that holds
    // running sessions' sandboxes stays.
    if (this.scratchDir) await fsp.rmdir(this.scratchDir).catch(() => undefined);
  }

  /** Waits until none of the given processes is alive (bounded). */
  protected async waitGone(refs: (ProcRef | undefined)[], timeoutMs = 2000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (refs.some((r) => isAlive(r)) && Date.now() < deadline) await sleep(5);
  }
}

/** Writes a small file and fsyncs it and its directory. */
async function writeDurably(file: string, content: string): Promise<void> {
  const fh = await fsp.open(file, 'wx', 0o600);
  try {
    await fh.writeFile(content);
    await fh.sync();
  } finally {
    await fh.close();
  }
  const dh = await fsp.open(path.dirname(file), 'r');
  try {
    await dh.sync();
  } finally {
    await dh.close();
  }
}

function signalName(n: number): string | null {
  for (const [name, num] of Object.entries(osConstants.signals)) if (num === n) return name;
  return null;
}

/** The pid of a live process with an argument containing `text`, or null. */
async function processNaming(text: string): Promise<number | null> {
  for (const name of await fsp.readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const cmdline = await fsp.readFile(`/proc/${name}/cmdline`, 'utf8').catch(() => '');
    if (cmdline.split('\0').some((a) => a.includes(text)) && procStart(Number(name)) !== null) return Number(name);
  }
  return null;
}
