/**
 * File calls the kernel answers from memory, made synchronously on the host's hot path (create,
 * claim, destroy and teardown): cgroupfs and procfs, renames, directories, small files in DATA_DIR.
 *
 * Why: each call through `fs.promises` crosses libuv's thread pool (a request, a futex wake, an eventfd,
 * a callback and a promise on the way back). Measured on this project's 2-core machine, one `fsp.stat`
 * costs about 40 µs of the process's CPU and one `fs.statSync` 3 µs; the kernel's own work is the same
 * either way. A lifecycle made about 100 such calls (see docs/performance.md, "fourth stop").
 *
 * What stays asynchronous: anything that may wait on the disk or grow with what a sandbox wrote
 * (`fdatasync`, removing a disk image or a scratch directory, reading a layer, a memory limit lowered
 * under a running sandbox, which makes the kernel reclaim).
 */
import { lstatSync, mkdirSync, readdirSync, readlinkSync, renameSync, rmdirSync, unlinkSync, writeFileSync, promises as fsp } from 'node:fs';
import * as path from 'node:path';

/** Files larger than this are removed through the pool (an unlink of a large file frees many extents). */
const SMALL_FILE = 1024 * 1024;

const code = (err: unknown) => (err as NodeJS.ErrnoException).code;

/** rename(2), throwing as `fsp.rename` would. */
export function renameNow(from: string, to: string): void {
  renameSync(from, to);
}

/** rename(2); a source that is already gone is skipped (false). */
export function renameIfThere(from: string, to: string): boolean {
  try {
    renameSync(from, to);
    return true;
  } catch (err) {
    if (code(err) === 'ENOENT') return false;
    throw err;
  }
}

/** Writes a small file (a cgroup knob, a state record) in one call. */
export function writeSmall(file: string, text: string, mode?: number): void {
  writeFileSync(file, text, mode === undefined ? undefined : { mode });
}

/** Writes `text` to `file` atomically: a temporary file renamed into place (no fsync: a crash may lose the last write, never half of one). */
export function writeSmallAtomically(file: string, text: string, mode = 0o600): void {
  writeFileSync(`${file}.tmp`, text, { mode });
  renameSync(`${file}.tmp`, file);
}

export function mkdirNow(dir: string, mode: number, recursive = false): void {
  mkdirSync(dir, { mode, recursive });
}

/** rmdir(2); true once the directory is gone (also when it was not there). Other errors (EBUSY, ENOTEMPTY) answer false. */
export function rmdirIfEmpty(dir: string): boolean {
  try {
    rmdirSync(dir);
    return true;
  } catch (err) {
    return code(err) === 'ENOENT';
  }
}

/** The target of symlink `file`, or null when it is not one (or gone). */
export function readlinkOrNull(file: string): string | null {
  try {
    return readlinkSync(file);
  } catch {
    return null;
  }
}

/** True when `file` exists (a dangling symlink counts). */
export function existsNoFollow(file: string): boolean {
  try {
    lstatSync(file);
    return true;
  } catch {
    return false;
  }
}

/**
 * Removes directory `dir`: its small files, links and empty directories at once; when anything else is
 * left (a large file, a tree), the rest goes through `fsp.rm`. Gone already is fine; a link or a file
 * there is removed itself (never what it points to).
 */
export async function removeDir(dir: string): Promise<void> {
  let entries;
  try {
    if (!lstatSync(dir).isDirectory()) return unlinkSync(dir);
    entries = readdirSync(dir, { withFileTypes: true });
  } catch (err) {
    if (code(err) === 'ENOENT') return;
    throw err;
  }
  let left = false;
  for (const e of entries) {
    const p = path.join(dir, e.name);
    try {
      if (e.isDirectory()) left = !rmdirIfEmpty(p) || left;
      else if (e.isFile() && lstatSync(p).size > SMALL_FILE) left = true;
      else unlinkSync(p);
    } catch (err) {
      if (code(err) !== 'ENOENT') left = true;
    }
  }
  if (!left && rmdirIfEmpty(dir)) return;
  await fsp.rm(dir, { recursive: true, force: true });
}
