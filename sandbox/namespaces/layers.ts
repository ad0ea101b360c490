/**
 * The namespaces provider's layers: capturing a sandbox's writable layer (a checkpoint: frozen, copied,
 * its ids shifted to the sandbox's own), the set-id bits a layer keeps off the disk (setid.json) and
 * puts back on a sandbox's copy, and the content hash of a layer (sandbox/layer-hash.py).
 */
import { execFile } from 'node:child_process';
import { existsSync, promises as fsp, constants as fsc } from 'node:fs';
import * as path from 'node:path';
import { promisify } from 'node:util';
import type { Logger } from 'pino';
import { PROJECT_ROOT } from '../../config';
import type { LayerScan, SandboxState } from '../base';
import { SandboxError } from '../../contract/errors';
import { shiftIdsToSandbox, stripSetIds, type SetIdFile } from '../id-slots';
import { openSandboxFileForRead, type RootMap } from '../paths';
import { isAlive, SandboxCgroups } from '../proc-refs-and-cgroups';

export const execFileP = promisify(execFile);

/** The layer hasher (sandbox/layer-hash.py): beside this module's folder (the source tree), else in the project's sandbox/. */
const LAYER_HASH =
  [path.join(__dirname, '..', 'layer-hash.py'), path.join(PROJECT_ROOT, 'sandbox', 'layer-hash.py')].find((f) => existsSync(f)) ?? 'layer-hash.py';
/** Where a layer keeps the set-id bits its regular files had in the sandbox (never on disk: see shiftIdsToSandbox). */
const SET_ID_FILE = 'setid.json';
/** Marks a layers directory whose layers of older hosts have had their set-id bits moved to setid.json (migrateSetIds). */
const SET_ID_MIGRATED = '.setid-v1';

export async function captureLayer(
  state: SandboxState,
  layerId: string,
  layersDir: string,
  sandboxDir: string,
): Promise<{ layerId: string; parents: string[]; sizeBytes?: number }> {
  const id = state.id;
  const target = path.join(layersDir, layerId);
  if (
    await fsp.stat(target).then(
      () => true,
      () => false,
    )
  )
    throw new SandboxError('conflict', `layer ${layerId} exists`);
  const tmp = `${target}.tmp-${process.pid}-${Date.now()}`;
  const cgroups = SandboxCgroups.of(id);
  // Root's alone (0700): the layer's files keep the sandbox's ids, which are host ids too.
  await fsp.mkdir(tmp, { mode: 0o700 });
  try {
    // Freeze the sandbox so the copy is consistent; cp -a keeps whiteouts (0/0 char devices) and
    // the trusted.overlay.* xattrs that mark opaque directories, --sparse=always a sparse file's
    // holes. The writable layer is a tmpfs in the namespace of the sandbox's init helper, reached through it.
    const outer = state.init?.outer;
    if (!outer || !isAlive(outer) || state.idBase === undefined) throw new SandboxError('conflict', `sandbox ${id} is not running`);
    const upper = path.join(`/proc/${outer.pid}/root`, sandboxDir, 'm', 'w');
    cgroups.pause();
    try {
      await execFileP('cp', ['-a', '--sparse=always', path.join(upper, 'root'), path.join(upper, 'usr'), tmp]);
    } finally {
      cgroups.resume();
    }
    // On disk, a layer holds the sandbox's own ids (0..65535), not the host ids of this sandbox's slot.
    const setIds = await shiftIdsToSandbox(tmp, state.idBase);
    if (setIds.length > 0) await fsp.writeFile(path.join(tmp, SET_ID_FILE), JSON.stringify(setIds), { mode: 0o600 });
    const parents = [...state.layers];
    await fsp.writeFile(path.join(tmp, 'layer.json'), JSON.stringify({ id: layerId, parents, sandboxId: id, createdAt: new Date().toISOString() }));
    // Its size: the larger of its files' bytes and the blocks it takes on the host's disk (many small
    // files take a block each, so the bytes alone would let a layer store far more than it counts).
    const du = (args: string[]) =>
      execFileP('du', ['-s', ...args, tmp]).then(
        (r) => Number(r.stdout.split('\t')[0]),
        () => NaN,
      );
    const [bytes, blocks] = await Promise.all([du(['-b', '--apparent-size']), du(['-B1'])]);
    const size = Math.max(...[bytes, blocks].filter(Number.isFinite));
    await fsp.rename(tmp, target);
    return { layerId, parents, ...(Number.isFinite(size) ? { sizeBytes: size } : {}) };
  } catch (err) {
    await fsp.rm(tmp, { recursive: true, force: true });
    throw err;
  }
}

/**
 * The content hash of a layer's directory (layer.json left out: names, types, modes, owners, bytes)
 * and its regular files with set-id bits, from sandbox/layer-hash.py: a process of its own, so the
 * event loop never waits on a big layer, that reads only the data extents of sparse files.
 */
export async function scanLayer(dir: string): Promise<LayerScan> {
  const { stdout } = await execFileP('python3', [LAYER_HASH, dir], { maxBuffer: 1 << 26 }).catch((err: Error & { stderr?: string }) => {
    throw new SandboxError('internal', `could not hash layer ${path.basename(dir)}: ${(err.stderr || err.message).trim()}`);
  });
  return JSON.parse(stdout) as LayerScan;
}

/**
 * Once per DATA_DIR: the layers of an older host, which kept set-id files on disk (host set-id
 * files, since on-disk ids are host ids), lose those bits to setid.json as new layers do, and
 * their directories become root's alone.
 */
export async function migrateSetIds(layersDir: string, log: Logger): Promise<void> {
  const mark = path.join(layersDir, SET_ID_MIGRATED);
  if (
    await fsp.lstat(mark).then(
      () => true,
      () => false,
    )
  )
    return;
  for (const name of await fsp.readdir(layersDir)) {
    const dir = path.join(layersDir, name);
    const st = await fsp.lstat(dir);
    if (
      !st.isDirectory() ||
      !(await fsp.lstat(path.join(dir, 'layer.json')).then(
        (s) => s.isFile(),
        () => false,
      ))
    )
      continue;
    const found = await stripSetIds(dir);
    if (found.length > 0) {
      const kept = await readSetIds(dir);
      // Written aside and renamed over: never through whatever the name is now.
      const tmp = path.join(dir, `${SET_ID_FILE}.tmp-${process.pid}`);
      await fsp.writeFile(tmp, JSON.stringify([...kept, ...found]), { mode: 0o600, flag: 'wx' });
      await fsp.rename(tmp, path.join(dir, SET_ID_FILE));
      log.warn({ layerId: name, files: found.length }, 'layer of an older host: set-id bits moved off the disk into setid.json');
    }
    await fsp.chown(dir, 0, 0);
    await fsp.chmod(dir, 0o700);
  }
  await fsp.writeFile(mark, '', { mode: 0o600 });
}

/**
 * Puts back the set-id bits that the files of the sandbox's layers had when they were captured
 * (kept in each layer's setid.json, never on disk), on the sandbox's own copy: the chmod goes
 * through the sandbox's tree (its overlay copies the file up into the writable layer). A record is
 * skipped when a layer above its own holds that path, or a non-directory on the way to it: the
 * file the sandbox sees is then another.
 */
export async function restoreSetIds(state: SandboxState, layersDir: string, rootMap: () => Promise<RootMap>, log: Logger): Promise<void> {
  if (state.layers.length === 0) return;
  const dirs = state.layers.map((l) => path.join(layersDir, l));
  const records = await Promise.all(dirs.map((d) => readSetIds(d)));
  if (records.every((r) => r.length === 0)) return;
  const map = await rootMap();
  for (let i = 0; i < dirs.length; i++) {
    for (const [rel, mode] of records[i]!) {
      const parts = rel.split('/');
      const where = parts[0] === 'root' ? parts.slice(1) : parts[0] === 'usr' ? parts : null;
      if (!where || where.length === 0 || !Number.isInteger(mode) || mode & ~0o7777) continue;
      if (await shadowed(dirs.slice(0, i), parts)) continue;
      try {
        const { fh } = await openSandboxFileForRead(map, '/' + where.join('/'));
        try {
          await fh.chmod(mode);
        } finally {
          await fh.close();
        }
      } catch (err) {
        log.warn({ sandboxId: state.id, path: rel, err: (err as Error).message }, 'could not restore the set-id bits of a layer file');
      }
    }
  }
}

/** A layer's set-id records (none when it has no setid.json). */
async function readSetIds(layerDir: string): Promise<SetIdFile[]> {
  const text = await fsp
    .readFile(path.join(layerDir, SET_ID_FILE), { encoding: 'utf8', flag: fsc.O_RDONLY | fsc.O_NOFOLLOW })
    .catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return '[]';
      throw err;
    });
  const list = JSON.parse(text) as unknown;
  return Array.isArray(list) ? list.filter((r): r is SetIdFile => Array.isArray(r) && typeof r[0] === 'string' && typeof r[1] === 'number') : [];
}

/**
 * True when one of the layers `above` holds the path `parts` (`root`/`usr` first), or something other
 * than a directory on the way to it. Each component is looked at only once its parent is known to be
 * a directory, so no symlink in a layer is followed.
 */
async function shadowed(above: string[], parts: string[]): Promise<boolean> {
  for (const dir of above) {
    let p = path.join(dir, parts[0]!);
    for (let k = 1; k < parts.length; k++) {
      p = path.join(p, parts[k]!);
      const st = await fsp.lstat(p).catch(() => null);
      if (!st) break;
      if (k === parts.length - 1 || !st.isDirectory()) return true;
    }
  }
  return false;
}
