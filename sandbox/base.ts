/**
 * What every provider shares: the on-disk state of a sandbox (`${dataDir}/sandboxes/<id>/state.json`),
 * the create sequence (provision → files → patches → entrypoint), the durable entrypoint wrapper, and
 * adoption of existing sandboxes after a restart. Providers supply isolation through a few hooks.
 */
import { sealedOf } from './seal';
import type { ChildProcess } from 'node:child_process';
import { type PipedProcess, Spawner } from './spawner';
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'pino';
import pino from 'pino';
import { SandboxError } from '../contract/errors';
import { defaultScratchDir, makeSandboxDir, resolveScratchDir, scratchTarget } from './scratch';
import { normaliseEgress, type Egress } from './network';
import { AuditLog, defaultAuditLogPath } from './audit-log';
import { existsNoFollow, removeDir } from './quick-fs';
import { readSandboxFile, writeSandboxFile, type RootMap } from './paths';
import { isAlive, signalRef, type ProcRef } from './proc-refs-and-cgroups';
import type { EntrypointLog, EntrypointLogChunk, CreateResult, ListFilter, ProviderKind, ProviderOptions, SandboxProvider, SpawnOptions } from './driver';
import { type CreateSandboxRequest, type EntrypointSpec, type EntrypointStatus, type SandboxInfo } from './host-contract/types';
import { assertId, DEFAULT_ENV, envPairs, KeyedLock, sleep } from './base/common';
import { DEFAULT_ENTRYPOINT_CLAIM_TIMEOUT_MS, Entrypoints, type EnterOptions } from './base/entrypoint';
import { Layers, type LayerScan } from './base/layers';
import { infoOf, StateFile, type SandboxState } from './base/state-file';
import { Hibernation } from './base/hibernation';
import { adoptSandboxes, type AdoptionDeps } from './base/adoption';
import { SandboxProcesses } from './base/sandbox-processes';
import { SandboxResourceControl, type ResourceProbe } from './base/resources';

// The parts' names, for the providers and the tests that import them from here.
export { defaultScratchDir };
export type { EntrypointLog, EntrypointLogChunk, EnterOptions, LayerScan, SandboxState };
export { assertId, cgroupJoin, DEFAULT_ENV, envPairs, shq } from './base/common';
export { DEFAULT_ENTRYPOINT_CLAIM_TIMEOUT_MS } from './base/entrypoint';
export { runFiles, settleInterruptedRun } from './base/run-files';

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
  /** Hibernated sandboxes and restores (see ./base/hibernation). */
  private readonly hibernation: Hibernation;
  /** Processes in the sandboxes (see ./base/sandbox-processes). */
  private readonly processes: SandboxProcesses;
  /** What adoption at start calls back (see ./base/adoption). */
  private readonly adoption: AdoptionDeps;
  /** The entrypoints' lifecycle (see ./base/entrypoint). */
  private readonly entrypoints: Entrypoints;
  /** Metrics and live resizes of running sandboxes (see ./base/resources). */
  readonly resources: SandboxResourceControl;

  constructor(opts: ProviderOptions) {
    this.dataDir = path.resolve(opts.dataDir);
    this.hostId = opts.hostId;
    this.log = opts.logger ?? pino({ level: 'silent' });
    this.scratchOption = opts.scratchDir;
    this.audit = opts.auditLog === null ? null : new AuditLog(opts.auditLog ?? defaultAuditLogPath(this.dataDir));
    if (/[,:\s]/.test(this.dataDir)) throw new Error(`DATA_DIR must not contain ',', ':' or spaces: ${this.dataDir}`);
    this.layers = new Layers(
      () => this.layersDir(),
      (dir) => this.scanLayerDir(dir),
      (layerId) => this.layerHash(layerId),
      {
        log: this.log,
        states: this.states,
        sandboxesDir: () => this.sandboxesDir(),
        respawnDir: () => this.respawnDir(),
        readPlain: (id) => this.stateFile.readPlain(id),
      },
    );
    this.stateFile = new StateFile(this.dataDir, this.log, (id) => this.dirOf(id));
    // What the parts below call back: the provider's hooks and state, late-bound (subclasses override them).
    const hooks = {
      log: this.log,
      spawner: this.spawner,
      states: this.states,
      hibernated: this.hibernated,
      stateFile: this.stateFile,
      kind: () => this.kind,
      dirOf: (id: string) => this.dirOf(id),
      stateOf: (id: string) => this.stateOf(id),
      isLive: (state: SandboxState) => this.isLive(state),
      saveState: (state: SandboxState) => this.saveState(state),
      enterArgv: (state: SandboxState, o: SpawnOptions, how: EnterOptions) => this.enterArgv(state, o, how),
      enterEnv: (state: SandboxState, o: SpawnOptions) => this.enterEnv(state, o),
      innerArgv: (state: SandboxState, o: SpawnOptions) => this.innerArgv(state, o),
      destroyUnlocked: (id: string) => this.destroyUnlocked(id),
    };
    this.hibernation = new Hibernation({
      ...hooks,
      lock: this.lock,
      layersDir: () => this.layersDir(),
      checkpoint: (id, layerId) => this.checkpoint(id, layerId),
      expandLayers: (layers) => this.expandLayers(layers),
      deleteLayer: (layerId) => this.deleteLayer(layerId),
      create: (req) => this.create(req),
    });
    this.processes = new SandboxProcesses({ ...hooks, spawn: (id, o) => this.spawn(id, o) });
    this.entrypoints = new Entrypoints({
      ...hooks,
      audit: this.audit,
      claimTimeoutMs: opts.entrypointClaimTimeoutMs ?? (Number(process.env.SANDBOX_ENTRYPOINT_CLAIM_TIMEOUT_MS) || DEFAULT_ENTRYPOINT_CLAIM_TIMEOUT_MS),
      testPauseFile: process.env.SANDBOX_TEST_PAUSE_FILE || null,
      has: (id) => this.states.has(id),
    });
    this.resources = new SandboxResourceControl({ ...hooks, lock: this.lock, probe: (state) => this.resourceProbe(state) });
    this.adoption = {
      ...hooks,
      scratchDir: () => this.scratchDir,
      sandboxesDir: () => this.sandboxesDir(),
      respawnDir: () => this.respawnDir(),
      adopted: (state) => this.adopted(state),
      adoptInterruptedStart: (state) => this.entrypoints.adoptInterruptedStart(state),
    };
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

  protected info(state: SandboxState): SandboxInfo {
    return infoOf(state, state.status === 'running' && this.isLive(state));
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

  /** Where the sandbox's writable layer and link are, for its metrics (providers with them override it). */
  protected resourceProbe(_state: SandboxState): ResourceProbe {
    return { upperDir: null, ifname: null };
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

  // Hibernation (./base/hibernation), processes (./base/sandbox-processes), entrypoints (./base/entrypoint)
  // and layers (./base/layers) are the parts' own; the provider's methods below hand them on.
  async hibernate(id: string, layerId: string): Promise<{ layerId: string; parents: string[] }> {
    return this.hibernation.hibernate(id, layerId);
  }

  async wake(id: string, patches: { id: string; script: string }[] = [], opts: { keepOnPatchFailure?: boolean } = {}): Promise<SandboxInfo> {
    return this.hibernation.wake(id, patches, opts.keepOnPatchFailure === true);
  }

  async restore(id: string, layerId: string, patches: { id: string; script: string }[] = []): Promise<SandboxInfo> {
    const info = await this.hibernation.restore(id, layerId, patches);
    await this.layers.gc.collect();
    return info;
  }

  async init(): Promise<SandboxInfo[]> {
    // Root's alone: other host users may not read sandboxes' files and layers, nor replace anything
    // there (a layer redirected by a symlink, say). Directories made by an older host are closed too.
    for (const dir of [this.dataDir, this.sandboxesDir(), this.layersDir()]) {
      await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
      await fsp.chmod(dir, 0o700);
    }
    this.scratchDir = await resolveScratchDir(this.scratchOption, this.dataDir);
    await this.prepare();
    await adoptSandboxes(this.adoption);
    await this.layers.gc.collect();
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
      const sealed = sealedOf(req, this.stateFile.envSealer());
      const t0 = Date.now();
      const state: SandboxState = {
        version: 1,
        id: req.id,
        orgId: req.orgId,
        hostId: this.hostId,
        provider: this.kind,
        ...(req.owner ? { owner: req.owner } : {}),
        layers: await this.layers.expandFor(req.id, req.layers ?? []),
        ...sealed,
        ...(req.cwd ? { cwd: req.cwd } : {}),
        ...(req.user && req.user !== 'root' ? { user: req.user } : {}),
        ...(req.network ? { network: req.network } : {}),
        limits: { memoryMB: req.memoryMB, cpuCount: req.cpuCount, maxProcesses: req.maxProcesses ?? 512, diskMB: req.diskMB },
        createdAt: new Date().toISOString(),
        metadata: req.metadata ?? {},
        patches: [],
        status: 'creating',
      };
      // In DATA_DIR, or for a session's sandbox in the scratch directory (see makeSandboxDir).
      await makeSandboxDir(this.dirOf(req.id), this.scratchDir && req.owner?.kind === 'session' ? path.join(this.scratchDir, req.id) : null, () =>
        this.destroyUnlocked(req.id),
      );
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
          const outcome = await this.processes.runPatch(state, patch);
          state.patches.push(outcome);
          if (outcome.exitCode !== 0) {
            // Kept: the sandbox runs with the patches before it (its outcome, last in `patches`, says which failed).
            if (req.keepOnPatchFailure) break;
            throw new SandboxError('patch_failed', `patch ${patch.id} failed with exit code ${outcome.exitCode}: ${outcome.outputTail.slice(-500)}`);
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
      // What the sandbox stood on, known here when it runs; a directory not adopted or a respawn record is read by a full collection.
      const stoodOn = this.states.get(id)?.layers;
      const live = await this.destroyUnlocked(id);
      const w = this.waitingCreates.get(id);
      if (w && live) w.destroys++;
      const wasHibernated = this.hibernated.has(id) || this.stateFile.hasRespawn(id);
      if (wasHibernated) await this.hibernation.dropRespawn(id);
      await this.hibernation.dropHibernationLayers(id);
      await (stoodOn && !wasHibernated ? this.layers.gc.collectAfter(stoodOn) : this.layers.gc.collect());
      return live || wasHibernated;
    });
  }

  private async destroyUnlocked(id: string): Promise<boolean> {
    const state = this.states.get(id);
    const dir = this.dirOf(id);
    // lstat: a link into the scratch directory whose target is gone (the machine rebooted) still counts.
    const exists = state !== undefined || existsNoFollow(dir);
    if (!exists) return false;
    const scratch = await scratchTarget(this.scratchDir, dir);
    let onDisk = state;
    onDisk ??= await this.stateFile.readPlain(id);
    if (onDisk?.entrypoint) signalRef(onDisk.entrypoint.wrapper, 'SIGKILL');
    await this.teardown(id, onDisk);
    if (scratch) await fsp.rm(scratch, { recursive: true, force: true });
    await removeDir(dir); // usually moved away by the teardown already (./namespaces/teardowns)
    this.states.delete(id);
    this.layers.gc.drop(id);
    this.resources.drop(id);
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
    return this.processes.spawn(id, opts);
  }

  async spawnPiped(id: string, opts: SpawnOptions): Promise<PipedProcess> {
    return this.processes.spawnPiped(id, opts);
  }

  async startEntrypoint(id: string, spec: EntrypointSpec): Promise<EntrypointStatus> {
    return this.lock.run(id, async () => {
      const state = this.stateOf(id);
      await this.entrypoints.startEntrypointUnlocked(state, spec);
      await this.saveState(state);
      return this.entrypointStatus(id);
    });
  }

  // The entrypoint's state, exit and output (see ./base/entrypoint).
  readonly entrypointStatus = (id: string): Promise<EntrypointStatus> => this.entrypoints.entrypointStatus(id);
  readonly waitEntrypoint = (id: string, waitMs: number, signal?: AbortSignal): Promise<EntrypointStatus> =>
    this.entrypoints.waitEntrypoint(id, waitMs, signal);
  readonly entrypointLog = (id: string, maxBytes: number, since: { stdout?: number; stderr?: number } = {}): Promise<EntrypointLog> =>
    this.entrypoints.entrypointLog(id, maxBytes, since);
  readonly entrypointOutput = (id: string, stream: 'stdout' | 'stderr', maxBytes: number): Promise<Buffer> =>
    this.entrypoints.entrypointOutput(id, stream, maxBytes);

  async checkpoint(_id: string, _layerId: string): Promise<{ layerId: string; parents: string[]; sizeBytes?: number }> {
    throw new SandboxError('invalid_request', `checkpoints are not supported by the ${this.kind} provider`);
  }

  /** Expands checkpoint layers with the layers they were taken over; throws not_found for a missing one. */
  protected async expandLayers(layers: string[]): Promise<string[]> {
    return this.layers.expandLayers(layers);
  }

  // Layers kept on this host (see ./base/layers); a deleted one in use stays until its last user goes (./base/layer-gc).
  readonly deleteLayer = (layerId: string): Promise<boolean> => this.layers.deleteLayer(layerId);
  readonly hasLayer = (layerId: string): Promise<boolean> => this.layers.hasLayer(layerId);
  readonly exportLayer = (layerId: string): ReturnType<Layers['exportLayer']> => this.layers.exportLayer(layerId);
  readonly importLayer = (layerId: string, stream: NodeJS.ReadableStream, sha256: string) => this.layers.importLayer(layerId, stream, sha256);

  async layerHash(_layerId: string): Promise<string> {
    throw new SandboxError('invalid_request', `layers are not supported by the ${this.kind} provider`);
  }

  /** hashOfDir, with the directory's regular files that carry set-id bits; providers with layers implement it. */
  protected async scanLayerDir(dir: string): Promise<LayerScan> {
    return { sha256: await this.hashOfDir(dir), setid: [] };
  }

  /** layerHash of a directory that is not (yet) a layer; providers with layers implement it. */
  protected async hashOfDir(_dir: string): Promise<string> {
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

  /** Waits until none of the given processes is alive (bounded; polled from 5 ms up to every 40 ms, so a burst of destroys does not spend the thread). */
  protected async waitGone(refs: (ProcRef | undefined)[], timeoutMs = 2000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (let wait = 5; refs.some((r) => isAlive(r)) && Date.now() < deadline; wait = Math.min(wait * 2, 40)) await sleep(wait);
  }
}
