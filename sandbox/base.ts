/**
 * What every provider shares: the on-disk state of a sandbox (`${dataDir}/sandboxes/<id>/state.json`),
 * the create sequence (provision → files → patches → entrypoint), the durable entrypoint wrapper, and
 * adoption of existing sandboxes after a restart. Providers supply isolation through a few hooks.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { type PipedProcess, Spawner } from './spawner';
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'pino';
import pino from 'pino';
import { SandboxError } from './errors';
import { defaultScratchDir } from './scratch';
import { normaliseEgress, type Egress } from './network';
import { AuditLog, defaultAuditLogPath } from './audit-log';
import { readSandboxFile, writeSandboxFile, type RootMap } from './paths';
import { isAlive, SandboxCgroups, signalRef, type ProcRef } from './procs';
import type { EntrypointLog, EntrypointLogChunk, CreateResult, ListFilter, ProviderKind, ProviderOptions, SandboxProvider, SpawnOptions } from './driver';
import { HIBERNATION_LAYER_MARK, type CreateSandboxRequest, type EntrypointSpec, type EntrypointStatus, type PatchOutcome, type SandboxInfo } from './host-contract/types';
import { assertId, cgroupJoin, DEFAULT_ENV, envPairs, KeyedLock, PATCH_TAIL_BYTES, sleep } from './base/common';
import { DEFAULT_ENTRYPOINT_CLAIM_TIMEOUT_MS, Entrypoints, type EnterOptions } from './base/entrypoint';
import { Layers, type LayerScan } from './base/layers';
import { StateFile, type Respawn, type SandboxState } from './base/state-file';

// The parts' names, for the providers and the tests that import them from here.
export { defaultScratchDir };
export type { EntrypointLog, EntrypointLogChunk, EnterOptions, LayerScan, SandboxState };
export { assertId, cgroupJoin, DEFAULT_ENV, envPairs, shq } from './base/common';
export { DEFAULT_ENTRYPOINT_CLAIM_TIMEOUT_MS, runFiles, settleInterruptedRun } from './base/entrypoint';

/** statfs type of a tmpfs. */
const TMPFS_MAGIC = 0x01021994;

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
  /** The layers directory (see ./base/layers). */
  protected readonly layers: Layers;
  /** state.json and the respawn records (see ./base/state-file). */
  protected readonly stateFile: StateFile;
  /** The entrypoints' lifecycle (see ./base/entrypoint). */
  private readonly entrypoints: Entrypoints;

  constructor(opts: ProviderOptions) {
    this.dataDir = path.resolve(opts.dataDir);
    this.hostId = opts.hostId;
    this.log = opts.logger ?? pino({ level: 'silent' });
    this.scratchOption = opts.scratchDir;
    this.audit = opts.auditLog === null ? null : new AuditLog(opts.auditLog ?? defaultAuditLogPath(this.dataDir));
    if (/[,:\s]/.test(this.dataDir)) throw new Error(`DATA_DIR must not contain ',', ':' or spaces: ${this.dataDir}`);
    this.layers = new Layers(() => this.layersDir(), (dir) => this.scanLayerDir(dir), (layerId) => this.layerHash(layerId));
    this.stateFile = new StateFile(this.dataDir, this.log, (id) => this.dirOf(id));
    this.entrypoints = new Entrypoints({
      log: this.log,
      audit: this.audit,
      spawner: this.spawner,
      claimTimeoutMs: opts.entrypointClaimTimeoutMs ?? (Number(process.env.SANDBOX_ENTRYPOINT_CLAIM_TIMEOUT_MS) || DEFAULT_ENTRYPOINT_CLAIM_TIMEOUT_MS),
      testPauseFile: process.env.SANDBOX_TEST_PAUSE_FILE || null,
      dirOf: (id) => this.dirOf(id),
      stateOf: (id) => this.stateOf(id),
      has: (id) => this.states.has(id),
      saveState: (state) => this.saveState(state),
      isLive: (state) => this.isLive(state),
      enterArgv: (state, o, how) => this.enterArgv(state, o, how),
      enterEnv: (state, o) => this.enterEnv(state, o),
      innerArgv: (state, o) => this.innerArgv(state, o),
    });
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

  protected async saveState(state: SandboxState): Promise<void> {
    await this.stateFile.save(state);
  }

  /** Where the respawn records of hibernated sandboxes (and of restores under way) are kept. */
  protected respawnDir(): string {
    return this.stateFile.respawnDir();
  }

  private async readRespawn(id: string): Promise<Respawn | null> {
    return this.stateFile.readRespawn(id);
  }

  private async writeRespawn(r: Respawn): Promise<void> {
    await this.stateFile.writeRespawn(r);
    this.hibernated.add(r.id);
  }

  private async dropRespawn(id: string): Promise<void> {
    await this.stateFile.dropRespawn(id);
    this.hibernated.delete(id);
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
        state = await this.stateFile.read(id);
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
      if (state.entrypoint?.starting) await this.entrypoints.adoptInterruptedStart(state);
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
          await this.entrypoints.startEntrypointUnlocked(existing, req.entrypoint);
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
        if (req.entrypoint) await this.entrypoints.startEntrypointUnlocked(state, req.entrypoint);
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

  /** Removes scratch directories no sandbox links to (the host died between making one and linking it). */
  private async removeUnlinkedScratch(): Promise<void> {
    if (!this.scratchDir) return;
    for (const name of await fsp.readdir(this.scratchDir)) {
      const linked = await this.scratchTarget(this.dirOf(name));
      if (linked !== path.join(this.scratchDir, name)) await fsp.rm(path.join(this.scratchDir, name), { recursive: true, force: true });
    }
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
      await this.entrypoints.startEntrypointUnlocked(state, spec);
      await this.saveState(state);
      return this.entrypointStatus(id);
    });
  }

  async entrypointStatus(id: string): Promise<EntrypointStatus> {
    return this.entrypoints.entrypointStatus(id);
  }

  /** See Entrypoints.waitEntrypoint: the status once the entrypoint has exited or `waitMs` has passed. */
  async waitEntrypoint(id: string, waitMs: number, signal?: AbortSignal): Promise<EntrypointStatus> {
    return this.entrypoints.waitEntrypoint(id, waitMs, signal);
  }

  /** See Entrypoints.entrypointLog: stdout and stderr in the order they were written. */
  async entrypointLog(id: string, maxBytes: number, since: { stdout?: number; stderr?: number } = {}): Promise<EntrypointLog> {
    return this.entrypoints.entrypointLog(id, maxBytes, since);
  }

  async entrypointOutput(id: string, stream: 'stdout' | 'stderr', maxBytes: number): Promise<Buffer> {
    return this.entrypoints.entrypointOutput(id, stream, maxBytes);
  }

  async checkpoint(id: string, layerId: string): Promise<{ layerId: string; parents: string[]; sizeBytes?: number }> {
    void id;
    void layerId;
    throw new SandboxError('invalid_request', `checkpoints are not supported by the ${this.kind} provider`);
  }

  /** Expands checkpoint layers with the layers they were taken over; throws not_found for a missing one. */
  protected async expandLayers(layers: string[]): Promise<string[]> {
    return this.layers.expandLayers(layers);
  }

  async deleteLayer(layerId: string): Promise<boolean> {
    return this.layers.deleteLayer(layerId);
  }

  /** See SandboxProvider.hasLayer. */
  async hasLayer(layerId: string): Promise<boolean> {
    return this.layers.hasLayer(layerId);
  }

  /** See SandboxProvider.exportLayer (./base/layers). */
  async exportLayer(layerId: string): Promise<{ sha256: string; stream: NodeJS.ReadableStream; done: Promise<void> }> {
    return this.layers.exportLayer(layerId);
  }

  /** See SandboxProvider.importLayer (./base/layers). */
  async importLayer(layerId: string, stream: NodeJS.ReadableStream, sha256: string): Promise<{ parents: string[] }> {
    return this.layers.importLayer(layerId, stream, sha256);
  }

  async layerHash(layerId: string): Promise<string> {
    void layerId;
    throw new SandboxError('invalid_request', `layers are not supported by the ${this.kind} provider`);
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

