/**
 * Released layers: a layer asked to go (its checkpoint or snapshot was deleted, its sandbox destroyed)
 * while something still stands on it is marked released (`${dataDir}/layers/.released/<id>`) and
 * removed once its last user is gone. A layer's users on this host: a running sandbox (its expanded
 * layers), a create under way (the layers it asked for), a hibernated sandbox or a restore under way
 * (the layer of its respawn record), a sandbox directory that was not adopted (its state.json), and
 * any other layer that names it as a parent (a checkpoint, a snapshot or a hibernation taken over it).
 * Collection runs after a restore, a release and at the host's start, and after a destroy whose
 * sandbox stood on a released layer (collectAfter): a destroy that frees none reads nothing, so a
 * released layer that waits for its users does not make every destroy read every layer.
 */
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'pino';
import { assertId } from './common';
import type { SandboxState } from './state-file';

/** The marks' directory under the layers (a dot name: never a layer id). */
export const RELEASED_DIR = '.released';

/** What LayerGc needs of its provider. */
export interface LayerGcDeps {
  log: Logger;
  layersDir(): string;
  sandboxesDir(): string;
  respawnDir(): string;
  /** The running sandboxes of the host. */
  states: Map<string, SandboxState>;
  /** state.json of a sandbox directory as it lies on disk, or undefined. */
  readPlain(id: string): Promise<SandboxState | undefined>;
}

/** How a layer answered a release: removed now, kept for its users (removed with the last), or not on this host. */
export type ReleaseResult = 'deleted' | 'released' | 'absent';

const readJson = <T>(file: string): Promise<T | null> =>
  fsp.readFile(file, 'utf8').then(
    (t) => JSON.parse(t) as T,
    () => null,
  );

const exists = (p: string): Promise<boolean> =>
  fsp.lstat(p).then(
    () => true,
    () => false,
  );

/** The released layers of a provider; see the module comment. */
export class LayerGc {
  /** Layers named by creates under way, by sandbox id (dropped when it runs or is destroyed). */
  private readonly holds = new Map<string, string[]>();
  /** Collections run one at a time. */
  private running: Promise<unknown> = Promise.resolve();
  /** The released layers as the last collection found them (this process writes every mark); undefined before the first. */
  private marks: Set<string> | undefined;
  /** True when a user of a released layer may have gone since the last collection: the next collectAfter runs one. */
  private stale = true;

  constructor(private readonly deps: LayerGcDeps) {}

  private releasedDir(): string {
    return path.join(this.deps.layersDir(), RELEASED_DIR);
  }

  /** Keeps `layers` (and what they stand on) from collection while sandbox `id` is being created. */
  hold(id: string, layers: string[]): void {
    this.holds.set(id, [...layers]);
  }

  /** Forgets the hold of sandbox `id` (it failed or was destroyed; a running one counts by its state). */
  drop(id: string): void {
    const held = this.holds.get(id);
    this.holds.delete(id);
    if (held) this.freed(held);
  }

  /** Notes that a user of `layers` went: a collection is due if one of them is released (or none has been read yet). */
  private freed(layers: readonly string[]): void {
    const marks = this.marks;
    if (!marks || layers.some((l) => marks.has(l))) this.stale = true;
  }

  /**
   * Collects after sandbox whose (expanded) layers were `layers` went: only when one of them, or a
   * hold dropped since, is released, or a collection was left to the next one; else answers [] at once.
   */
  collectAfter(layers: readonly string[]): Promise<string[]> {
    this.freed(layers);
    return this.stale ? this.collect() : Promise.resolve([]);
  }

  /**
   * Releases layer `layerId`: removed at once when nothing on this host uses it, else marked and
   * removed when its last user goes (see collect).
   */
  async release(layerId: string): Promise<ReleaseResult> {
    assertId(layerId, 'layer id');
    if (!(await exists(path.join(this.deps.layersDir(), layerId, 'layer.json')))) return 'absent';
    await fsp.mkdir(this.releasedDir(), { recursive: true, mode: 0o700 });
    await fsp.writeFile(path.join(this.releasedDir(), layerId), '', { mode: 0o600 });
    this.marks?.add(layerId);
    const removed = await this.collect();
    return removed.includes(layerId) ? 'deleted' : 'released';
  }

  /** True when layer `layerId` is released here and waits for its last user. */
  async isReleased(layerId: string): Promise<boolean> {
    assertId(layerId, 'layer id');
    return exists(path.join(this.releasedDir(), layerId));
  }

  /** Removes the released layers nothing uses any more; answers their ids. Never throws. */
  collect(): Promise<string[]> {
    const run = this.running.then(() => this.collectNow());
    this.running = run.catch(() => undefined);
    return run.catch((err: unknown) => {
      this.stale = true;
      this.deps.log.warn({ err: String(err) }, 'collecting released layers failed; the next destroy or start retries');
      return [];
    });
  }

  private async collectNow(): Promise<string[]> {
    // Cleared before reading: a user that goes while this runs sets it again.
    this.stale = false;
    const marks = await fsp.readdir(this.releasedDir()).catch(() => [] as string[]);
    this.marks = new Set(marks);
    if (marks.length === 0) return [];
    const layersDir = this.deps.layersDir();
    const onDisk = (await fsp.readdir(layersDir)).filter((n) => !n.startsWith('.') && !n.includes('.tmp-'));
    const present = new Set(onDisk);
    // A mark whose layer is gone (removed by hand, say) goes too.
    for (const m of marks)
      if (!present.has(m)) {
        await fsp.rm(path.join(this.releasedDir(), m), { force: true });
        this.marks.delete(m);
      }
    let removable = new Set(marks.filter((m) => present.has(m)));
    if (removable.size === 0) return [];

    const direct = await this.directUsers();
    const parents = new Map<string, string[]>();
    for (const n of onDisk) parents.set(n, (await readJson<{ parents?: string[] }>(path.join(layersDir, n, 'layer.json')))?.parents ?? []);
    // A released layer stays while a user stands on it; so do the layers it stands on (until nothing changes).
    for (;;) {
      const used = new Set(direct);
      for (const n of onDisk) if (!removable.has(n)) for (const p of parents.get(n) ?? []) used.add(p);
      const next = new Set([...removable].filter((n) => !used.has(n)));
      if (next.size === removable.size) break;
      removable = next;
    }
    // A create that began meanwhile and names one of them: leave them all to the next collection.
    for (const h of this.holds.values())
      if (h.some((l) => removable.has(l))) {
        this.stale = true;
        return [];
      }
    const removed: string[] = [];
    for (const id of removable) {
      const dir = path.join(layersDir, id);
      // Renamed first: a create that reads the layer from now on finds none, never half of one.
      const doomed = `${dir}.tmp-delete-${randomBytes(4).toString('hex')}`;
      await fsp.rename(dir, doomed);
      await fsp.rm(path.join(this.releasedDir(), id), { force: true });
      this.marks.delete(id);
      await fsp.rm(doomed, { recursive: true, force: true });
      removed.push(id);
    }
    if (removed.length > 0) this.deps.log.info({ layers: removed }, 'released layers removed: their last user is gone');
    return removed;
  }

  /** The layers used directly: by running sandboxes, creates under way, respawn records and sandbox directories not adopted. */
  private async directUsers(): Promise<Set<string>> {
    const used = new Set<string>();
    for (const s of this.deps.states.values()) for (const l of s.layers) used.add(l);
    for (const [id, layers] of this.holds) {
      if (this.deps.states.has(id)) this.holds.delete(id);
      else for (const l of layers) used.add(l);
    }
    for (const f of await fsp.readdir(this.deps.respawnDir()).catch(() => [] as string[])) {
      if (!f.endsWith('.json')) continue;
      const r = await readJson<{ layer?: string }>(path.join(this.deps.respawnDir(), f));
      if (r?.layer) used.add(r.layer);
    }
    for (const id of await fsp.readdir(this.deps.sandboxesDir()).catch(() => [] as string[])) {
      if (this.deps.states.has(id)) continue;
      for (const l of (await this.deps.readPlain(id))?.layers ?? []) used.add(l);
    }
    return used;
  }
}
