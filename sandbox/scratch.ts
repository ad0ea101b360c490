/**
 * Where a host keeps sessions' sandboxes: a scratch directory (by default one of /dev/shm named after
 * its DATA_DIR) that each such sandbox's directory in DATA_DIR links into.
 */
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { readlinkOrNull } from './quick-fs';
import * as path from 'node:path';

/** statfs type of a tmpfs. */
const TMPFS_MAGIC = 0x01021994;

/** The scratch directory a host with this DATA_DIR uses by default when /dev/shm is a tmpfs. */
export function defaultScratchDir(dataDir: string): string {
  return path.join('/dev/shm', `sap-sandboxes-${createHash('sha256').update(path.resolve(dataDir)).digest('hex').slice(0, 12)}`);
}

/**
 * The scratch directory in use (made): `option` when configured (null: none), or by default a
 * directory of this DATA_DIR under /dev/shm when that is a tmpfs (null when there is none).
 */
export async function resolveScratchDir(option: string | null | undefined, dataDir: string): Promise<string | null> {
  if (option === null) return null;
  let dir = option;
  if (dir === undefined) {
    const shm = await fsp.statfs('/dev/shm').catch(() => null);
    if (!shm || shm.type !== TMPFS_MAGIC) return null;
    dir = defaultScratchDir(dataDir);
  }
  dir = path.resolve(dir);
  await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
  return dir;
}

/** The scratch directory a sandbox's directory links to, if it is such a link (and points there). */
export function scratchTarget(scratchDir: string | null, dir: string): Promise<string | null> {
  if (!scratchDir) return Promise.resolve(null);
  const target = readlinkOrNull(dir);
  return Promise.resolve(target && path.dirname(target) === scratchDir ? target : null);
}

/** Removes scratch directories no sandbox links to (the host died between making one and linking it). */
export async function removeUnlinkedScratch(scratchDir: string | null, dirOf: (id: string) => string): Promise<void> {
  if (!scratchDir) return;
  for (const name of await fsp.readdir(scratchDir)) {
    const linked = await scratchTarget(scratchDir, dirOf(name));
    if (linked !== path.join(scratchDir, name)) await fsp.rm(path.join(scratchDir, name), { recursive: true, force: true });
  }
}

/**
 * Makes a sandbox's directory `dir`: in DATA_DIR, or when `real` is given (a session's sandbox) as
 * `real` in the scratch directory with `dir` a link to it (its files are short-lived: a tmpfs spares
 * the disk's inode and journal work of creating and removing them for every session). A leftover of
 * the same id is cleared first (`clear`: the provider destroys it).
 */
export async function makeSandboxDir(dir: string, real: string | null, clear: () => Promise<unknown>): Promise<void> {
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
    await clear();
    if (real) await fsp.rm(real, { recursive: true, force: true });
    await make();
  }
}
