/**
 * Hibernation and restore: a sandbox made into a layer and a respawn record (see ./state-file), then
 * made again from them under the same id; and the hibernation layers dropped with the sandbox.
 */
import { promises as fsp } from 'node:fs';
import type { Logger } from 'pino';
import type { CreateResult } from '../driver';
import { SandboxError } from '../../contract/errors';
import { HIBERNATION_LAYER_MARK, type CreateSandboxRequest, type SandboxInfo } from '../host-contract/types';
import { assertId, type KeyedLock } from './common';
import type { Respawn, SandboxState, StateFile } from './state-file';

/** What Hibernation needs of its provider. */
export interface HibernationDeps {
  log: Logger;
  lock: KeyedLock;
  states: Map<string, SandboxState>;
  /** Ids of the sandboxes hibernated on this host (their respawn records). */
  hibernated: Set<string>;
  stateFile: StateFile;
  isLive(state: SandboxState): boolean;
  stateOf(id: string): SandboxState;
  layersDir(): string;
  checkpoint(id: string, layerId: string): Promise<{ layerId: string; parents: string[]; sizeBytes?: number }>;
  expandLayers(layers: string[]): Promise<string[]>;
  deleteLayer(layerId: string): Promise<boolean>;
  create(req: CreateSandboxRequest): Promise<CreateResult>;
  /** Destroys the sandbox with its lock already held. */
  destroyUnlocked(id: string): Promise<boolean>;
}

/** The hibernated sandboxes of a provider; see the module comment. */
export class Hibernation {
  constructor(private readonly deps: HibernationDeps) {}

  async readRespawn(id: string): Promise<Respawn | null> {
    return this.deps.stateFile.readRespawn(id);
  }

  async writeRespawn(r: Respawn): Promise<void> {
    await this.deps.stateFile.writeRespawn(r);
    this.deps.hibernated.add(r.id);
  }

  async dropRespawn(id: string): Promise<void> {
    await this.deps.stateFile.dropRespawn(id);
    this.deps.hibernated.delete(id);
  }

  /** What it takes to make a live sandbox again under the same id, over `layer`. */
  respawnOf(state: SandboxState, layer: string, kind: Respawn['kind']): Respawn {
    return {
      version: 1,
      kind,
      id: state.id,
      orgId: state.orgId,
      ...(state.owner ? { owner: state.owner } : {}),
      layer,
      envs: state.envs,
      ...(state.sealed?.length ? { sealed: state.sealed } : {}),
      ...(state.cwd ? { cwd: state.cwd } : {}),
      ...(state.user ? { user: state.user } : {}),
      ...(state.network ? { network: state.network } : {}),
      limits: state.limits,
      metadata: state.metadata,
      at: new Date().toISOString(),
    };
  }

  /** Creates the sandbox a respawn record describes (idempotent: create is), then forgets the record. */
  async respawn(r: Respawn, patches: { id: string; script: string }[], keepOnPatchFailure = false): Promise<SandboxInfo> {
    const { info } = await this.deps.create({
      id: r.id,
      orgId: r.orgId,
      ...(r.owner ? { owner: r.owner } : {}),
      layers: [r.layer],
      envs: r.envs,
      ...(r.sealed?.length ? { restoredSealed: r.sealed } : {}),
      ...(r.cwd ? { cwd: r.cwd } : {}),
      ...(r.user ? { user: r.user } : {}),
      ...(r.network ? { network: r.network } : {}),
      memoryMB: r.limits.memoryMB,
      cpuCount: r.limits.cpuCount,
      maxProcesses: r.limits.maxProcesses,
      diskMB: r.limits.diskMB,
      metadata: r.metadata,
      patches,
      ...(keepOnPatchFailure ? { keepOnPatchFailure } : {}),
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
    return this.deps.lock.run(id, async () => {
      const state = this.deps.states.get(id);
      if (!state) {
        const r = await this.readRespawn(id);
        if (r?.kind === 'hibernated') return { layerId: r.layer, parents: [] };
        throw new SandboxError('not_found', `sandbox ${id} not found`);
      }
      if (state.status !== 'running' || !this.deps.isLive(state)) throw new SandboxError('conflict', `sandbox ${id} is not running`);
      const layer = await this.deps.checkpoint(id, layerId);
      await this.writeRespawn(this.respawnOf(state, layerId, 'hibernated'));
      await this.deps.destroyUnlocked(id);
      this.deps.log.info({ sandboxId: id, layerId }, 'sandbox hibernated');
      return layer;
    });
  }

  /**
   * Wakes a hibernated sandbox: the same id, env, limits, network policy and metadata, its files from
   * the hibernation layer; `patches` run first, in order. A failed one leaves it hibernated and throws
   * patch_failed, or with `keepOnPatchFailure` stops the chain and wakes it (its outcome is the last
   * of the answer's `patches`). Throws not_found when it is not hibernated here, conflict when it is running.
   */
  async wake(id: string, patches: { id: string; script: string }[] = [], keepOnPatchFailure = false): Promise<SandboxInfo> {
    assertId(id);
    const live = this.deps.states.get(id);
    if (live) throw new SandboxError('conflict', `sandbox ${id} is ${live.status === 'running' ? 'running' : live.status}, not hibernated`);
    const r = await this.readRespawn(id);
    if (!r) throw new SandboxError('not_found', `no hibernated sandbox ${id}`);
    const info = await this.respawn(r, patches, keepOnPatchFailure);
    this.deps.log.info({ sandboxId: id }, 'sandbox woken');
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
    await this.deps.expandLayers([layerId]);
    const r = await this.deps.lock.run(id, async () => {
      const state = this.deps.stateOf(id);
      if (state.status !== 'running' || !this.deps.isLive(state)) throw new SandboxError('conflict', `sandbox ${id} is not running`);
      const rec = this.respawnOf(state, layerId, 'restoring');
      await this.writeRespawn(rec);
      await this.deps.destroyUnlocked(id);
      return rec;
    });
    const info = await this.respawn(r, patches);
    this.deps.log.info({ sandboxId: id, layerId }, 'sandbox restored');
    return info;
  }

  /** Releases the hibernation layers of a sandbox that is gone (one a layer stands on stays until that layer goes: see ./layer-gc). */
  async dropHibernationLayers(id: string): Promise<void> {
    const names = await fsp.readdir(this.deps.layersDir()).catch(() => [] as string[]);
    for (const n of names.filter((x) => x.startsWith(`${id}${HIBERNATION_LAYER_MARK}`) && !x.includes('.tmp-')))
      await this.deps.deleteLayer(n).catch((err) => this.deps.log.warn({ err, layerId: n }, 'could not delete a hibernation layer'));
  }
}
