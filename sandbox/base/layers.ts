/**
 * The layers of a host (`${dataDir}/layers/<id>`, each with its layer.json naming its parents): the
 * stack a sandbox is made over, and moving a layer between hosts (export as tar with its content hash,
 * import checked against it, set-id bits refused). Capturing a checkpoint and the set-id records are
 * the namespaces provider's (see ../namespaces/).
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { SandboxError } from '../../contract/errors';
import { assertId } from './common';
import { LayerGc, type LayerGcDeps } from './layer-gc';

/** A layer directory's content hash, and its regular files that carry set-id bits (path in the layer, mode). */
export interface LayerScan {
  sha256: string;
  setid: [string, number][];
}

/** A host's layer directory; hashing and scanning a layer are the provider's (`scan`, `hash`). */
export class Layers {
  /** Released layers, removed with their last user (see ./layer-gc). */
  readonly gc: LayerGc;

  constructor(
    private readonly layersDir: () => string,
    private readonly scanLayerDir: (dir: string) => Promise<LayerScan>,
    private readonly layerHash: (layerId: string) => Promise<string>,
    gcDeps: Omit<LayerGcDeps, 'layersDir'>,
  ) {
    this.gc = new LayerGc({ ...gcDeps, layersDir });
  }

  /** expandLayers for the create of sandbox `id`: the layers are kept from collection until it runs or is destroyed. */
  async expandFor(id: string, layers: string[]): Promise<string[]> {
    this.gc.hold(id, layers);
    try {
      return await this.expandLayers(layers);
    } catch (err) {
      this.gc.drop(id);
      throw err;
    }
  }

  /** Expands checkpoint layers with the layers they were taken over; throws not_found for a missing one. */
  async expandLayers(layers: string[]): Promise<string[]> {
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

  /** See SandboxProvider.deleteLayer: removed now when nothing on this host uses it, else when its last user goes. */
  async deleteLayer(layerId: string): Promise<boolean> {
    return (await this.gc.release(layerId)) !== 'absent';
  }

  /** See SandboxProvider.hasLayer. */
  async hasLayer(layerId: string): Promise<boolean> {
    assertId(layerId, 'layer id');
    return fsp.stat(path.join(this.layersDir(), layerId, 'layer.json')).then(
      () => true,
      () => false,
    );
  }

  /**
   * See SandboxProvider.exportLayer: the layer's directory as a tar stream (numeric owners, modes,
   * xattrs and the overlay's whiteouts kept), with its content hash (layerHash) for the receiver to check.
   */
  async exportLayer(layerId: string): Promise<{ sha256: string; stream: NodeJS.ReadableStream; done: Promise<void> }> {
    if (!(await this.hasLayer(layerId))) throw new SandboxError('not_found', `layer ${layerId} not found`);
    const sha256 = await this.layerHash(layerId);
    // --sparse: holes are recorded, not sent (tar finds a file's data with SEEK_DATA / SEEK_HOLE).
    const tar = spawn('tar', ['-C', this.layersDir(), '--numeric-owner', '--xattrs', '--xattrs-include=*', '--sparse', '-cf', '-', layerId], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
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
      const tar = spawn('tar', ['-C', tmp, '--numeric-owner', '--same-owner', '--same-permissions', '--xattrs', '--xattrs-include=*', '-xf', '-'], {
        stdio: ['pipe', 'ignore', 'pipe'],
      });
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
}
