/** The filesystem routes' operations on sandbox paths: stream, stat, list, mkdir, rename, remove (see ../paths.ts). */
import { constants as fsc, promises as fsp } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { SandboxError } from '../../contract/errors';
import type { SandboxEntry } from '../host-contract/types';
import { DIR_FLAGS, type RootMap, closeAll, errCode, keepIfInside, openResolved, walk } from './resolve';
import { guarded, resolveSandboxPathUnguarded } from './resolve';

function entryOf(name: string, sandboxPath: string, st: import('node:fs').Stats, target?: string): SandboxEntry {
  const type = st.isFile() ? 'file' : st.isDirectory() ? 'dir' : st.isSymbolicLink() ? 'symlink' : 'other';
  return {
    name,
    path: sandboxPath,
    type,
    isDir: type === 'dir',
    size: type === 'dir' ? 0 : st.size,
    mode: st.mode & 0o7777,
    modTime: st.mtime.toISOString(),
    ...(target !== undefined ? { target } : {}),
  };
}

const joinSandbox = (parts: string[]): string => '/' + parts.join('/');

/**
 * Opens a regular file of the sandbox for streaming it out. Throws not_found when absent,
 * invalid_request for a directory, a device or a FIFO. The caller closes the handle.
 */
export async function openSandboxFileForReadUnguarded(map: RootMap, sandboxPath: string): Promise<{ fh: FileHandle; size: number }> {
  const r = await walk(map, sandboxPath, {});
  const fh = await openResolved(map, r, fsc.O_RDONLY, 0, sandboxPath);
  try {
    const st = await fh.stat();
    if (st.isDirectory()) throw new SandboxError('invalid_request', `path is a directory: ${sandboxPath}`);
    if (!st.isFile()) throw new SandboxError('invalid_request', `not a regular file: ${sandboxPath}`);
    return { fh, size: st.size };
  } catch (err) {
    await fh.close();
    throw err;
  }
}

/**
 * Opens (creating it and its parent directories, truncating it) a regular file of the sandbox for
 * streaming content in. Throws invalid_request for a directory or anything else that is not a
 * regular file. The caller closes the handle.
 */
export async function openSandboxFileForWriteUnguarded(map: RootMap, sandboxPath: string, mode = 0o644): Promise<FileHandle> {
  const r = await walk(map, sandboxPath, { createDirs: true });
  // Truncated only once the descriptor is known to be inside the sandbox.
  const fh = await openResolved(map, r, fsc.O_WRONLY | fsc.O_CREAT, mode, sandboxPath);
  try {
    const st = await fh.stat();
    if (st.isDirectory()) throw new SandboxError('invalid_request', `path is a directory: ${sandboxPath}`);
    if (!st.isFile()) throw new SandboxError('invalid_request', `not a regular file: ${sandboxPath}`);
    // Created just now by the host (sandbox files never belong to the host's uid): sandbox root's.
    if (map.owner && st.uid === process.getuid?.()) await fh.chown(map.owner.uid, map.owner.gid);
    await fh.truncate(0);
    return fh;
  } catch (err) {
    await fh.close();
    throw err;
  }
}

/** `stat` of a sandbox path (symlinks followed inside the sandbox); not_found when absent. */
export async function statSandboxPathUnguarded(map: RootMap, sandboxPath: string, opts: { noFollow?: boolean } = {}): Promise<SandboxEntry> {
  const r = await walk(map, sandboxPath, { noFollowLast: opts.noFollow });
  try {
    if (r.name === null) return entryOf(r.parts[r.parts.length - 1] ?? '/', joinSandbox(r.parts), await r.dirs[r.dirs.length - 1]!.stat());
    const rel = `/proc/self/fd/${r.dirs[r.dirs.length - 1]!.fd}/${r.name}`;
    const st = await fsp.lstat(rel).catch((err) => {
      if (errCode(err) === 'ENOENT') throw new SandboxError('not_found', `no such file or directory: ${sandboxPath}`);
      throw err;
    });
    const target = st.isSymbolicLink() ? await fsp.readlink(rel).catch(() => '') : undefined;
    return entryOf(r.name, joinSandbox(r.parts), st, target);
  } finally {
    await closeAll(r.dirs);
  }
}

/**
 * The entries of a sandbox directory (`lstat` of each: symlinks are listed as such), sorted by name,
 * at most `max`. not_found when absent, invalid_request when not a directory.
 */
export async function listSandboxDirUnguarded(map: RootMap, sandboxPath: string, max = 10_000): Promise<SandboxEntry[]> {
  const r = await walk(map, sandboxPath, {});
  let dir: FileHandle;
  try {
    if (r.name === null) {
      // `/` or a mount point: the walk's last directory.
      dir = r.dirs.pop()!;
    } else {
      dir = await fsp.open(`/proc/self/fd/${r.dirs[r.dirs.length - 1]!.fd}/${r.name}`, DIR_FLAGS).catch((err) => {
        const code = errCode(err);
        if (code === 'ENOENT') throw new SandboxError('not_found', `no such file or directory: ${sandboxPath}`);
        if (code === 'ENOTDIR' || code === 'ELOOP') throw new SandboxError('invalid_request', `not a directory: ${sandboxPath}`);
        throw err;
      });
      dir = await keepIfInside(map, dir, sandboxPath);
    }
  } finally {
    await closeAll(r.dirs);
  }
  try {
    const base = joinSandbox(r.parts);
    const names = (await fsp.readdir(`/proc/self/fd/${dir.fd}`)).sort().slice(0, max);
    const out: SandboxEntry[] = [];
    for (const name of names) {
      const rel = `/proc/self/fd/${dir.fd}/${name}`;
      const st = await fsp.lstat(rel).catch(() => null);
      if (!st) continue; // removed meanwhile
      const target = st.isSymbolicLink() ? await fsp.readlink(rel).catch(() => '') : undefined;
      out.push(entryOf(name, base === '/' ? `/${name}` : `${base}/${name}`, st, target));
    }
    return out;
  } finally {
    await dir.close();
  }
}

/** `mkdir -p` inside the sandbox. conflict when the path (or a parent) exists and is not a directory. */
export async function makeSandboxDirUnguarded(map: RootMap, sandboxPath: string, mode = 0o755): Promise<void> {
  const r = await walk(map, sandboxPath, { createDirs: true }).catch((err) => {
    if (err instanceof SandboxError && err.type === 'invalid_request' && err.message.startsWith('not a directory')) {
      throw new SandboxError('conflict', `${err.message} (a file is in the way)`);
    }
    throw err;
  });
  try {
    if (r.name === null) return;
    const rel = `/proc/self/fd/${r.dirs[r.dirs.length - 1]!.fd}/${r.name}`;
    try {
      await fsp.mkdir(rel, { mode });
      if (map.owner) await fsp.lchown(rel, map.owner.uid, map.owner.gid);
    } catch (err) {
      if (errCode(err) !== 'EEXIST') throw err;
      const st = await fsp.lstat(rel);
      if (!st.isDirectory()) throw new SandboxError('conflict', `exists and is not a directory: ${sandboxPath}`);
    }
  } finally {
    await closeAll(r.dirs);
  }
}

/**
 * Renames a path inside the sandbox (the last component of `from` is not followed: a symlink is
 * renamed, not its target). Parents of `to` are created. not_found when `from` is absent; conflict
 * when `to` is a non-empty directory or the two are on different mounts of the sandbox.
 */
export async function renameSandboxPathUnguarded(map: RootMap, from: string, to: string): Promise<void> {
  const a = await walk(map, from, { noFollowLast: true });
  try {
    if (a.name === null)
      throw new SandboxError(
        a.parts.length ? 'conflict' : 'invalid_request',
        `cannot rename ${a.parts.length ? 'a mount point of the sandbox' : '/'}: ${from}`,
      );
    const b = await walk(map, to, { createDirs: true, noFollowLast: true });
    try {
      if (b.name === null)
        throw new SandboxError(
          b.parts.length ? 'conflict' : 'invalid_request',
          `cannot rename onto ${b.parts.length ? 'a mount point of the sandbox' : '/'}: ${to}`,
        );
      await fsp.rename(`/proc/self/fd/${a.dirs[a.dirs.length - 1]!.fd}/${a.name}`, `/proc/self/fd/${b.dirs[b.dirs.length - 1]!.fd}/${b.name}`).catch((err) => {
        const code = errCode(err);
        if (code === 'ENOENT') throw new SandboxError('not_found', `no such file or directory: ${from}`);
        if (code === 'ENOTEMPTY' || code === 'EEXIST') throw new SandboxError('conflict', `destination is a directory that is not empty: ${to}`);
        if (code === 'EISDIR' || code === 'ENOTDIR')
          throw new SandboxError(
            'conflict',
            `cannot replace ${code === 'EISDIR' ? 'a directory with a non-directory' : 'a non-directory with a directory'}: ${to}`,
          );
        if (code === 'EXDEV') throw new SandboxError('conflict', `${from} and ${to} are on different mounts of the sandbox; copy instead`);
        if (code === 'EINVAL') throw new SandboxError('invalid_request', `cannot move a directory into itself: ${to}`);
        throw err;
      });
    } finally {
      await closeAll(b.dirs);
    }
  } finally {
    await closeAll(a.dirs);
  }
}

/** Removes a file, a symlink (not its target) or an empty directory; `notEmpty` tells the caller to remove a tree another way. */
export async function removeSandboxEntryUnguarded(map: RootMap, sandboxPath: string): Promise<'removed' | 'notEmpty'> {
  const r = await walk(map, sandboxPath, { noFollowLast: true });
  try {
    if (r.name === null) {
      if (!r.parts.length) throw new SandboxError('invalid_request', 'cannot remove /');
      throw new SandboxError('conflict', `${sandboxPath} is a mount point of the sandbox; remove what is in it instead`);
    }
    const rel = `/proc/self/fd/${r.dirs[r.dirs.length - 1]!.fd}/${r.name}`;
    const st = await fsp.lstat(rel).catch((err) => {
      if (errCode(err) === 'ENOENT') throw new SandboxError('not_found', `no such file or directory: ${sandboxPath}`);
      throw err;
    });
    // A directory on another mount (the sandbox's /proc, /dev) is not the sandbox's to remove.
    if (st.isDirectory()) await (await keepIfInside(map, await fsp.open(rel, DIR_FLAGS), sandboxPath)).close();
    try {
      if (st.isDirectory()) await fsp.rmdir(rel);
      else await fsp.unlink(rel);
    } catch (err) {
      const code = errCode(err);
      if (code === 'ENOTEMPTY' || code === 'EEXIST') return 'notEmpty';
      if (code === 'ENOENT') throw new SandboxError('not_found', `no such file or directory: ${sandboxPath}`);
      if (code === 'EBUSY') throw new SandboxError('conflict', `${sandboxPath} is busy (a mount point?)`);
      throw err;
    }
    return 'removed';
  } finally {
    await closeAll(r.dirs);
  }
}

// The exported operations: every error they throw is a SandboxError naming only the sandbox path.

/** Writes a file inside the sandbox, creating parent directories. Throws invalid_request for bad paths. */
async function writeSandboxFileUnguarded(map: RootMap, sandboxPath: string, content: Buffer, mode = 0o644): Promise<void> {
  const fh = await openSandboxFileForWrite(map, sandboxPath, mode);
  try {
    await fh.writeFile(content);
  } finally {
    await fh.close();
  }
}

/**
 * Reads a file inside the sandbox. Throws not_found when absent, payload_too_large when bigger than
 * `maxBytes`, invalid_request for directories and bad paths.
 */
async function readSandboxFileUnguarded(map: RootMap, sandboxPath: string, maxBytes: number): Promise<Buffer> {
  const { fh, size } = await openSandboxFileForRead(map, sandboxPath);
  try {
    if (size > maxBytes) {
      throw new SandboxError('payload_too_large', `${sandboxPath} is ${size} bytes, more than the limit of ${maxBytes}`);
    }
    const buf = Buffer.alloc(Math.min(size, maxBytes) + 1);
    let len = 0;
    while (len < buf.length) {
      const { bytesRead } = await fh.read(buf, len, buf.length - len, len);
      if (bytesRead === 0) break;
      len += bytesRead;
    }
    if (len > maxBytes) throw new SandboxError('payload_too_large', `${sandboxPath} is more than ${maxBytes} bytes`);
    return buf.subarray(0, len);
  } finally {
    await fh.close();
  }
}

export const resolveSandboxPath = guarded(resolveSandboxPathUnguarded);
export const writeSandboxFile = guarded(writeSandboxFileUnguarded);
export const readSandboxFile = guarded(readSandboxFileUnguarded);
export const openSandboxFileForRead = guarded(openSandboxFileForReadUnguarded);
export const openSandboxFileForWrite = guarded(openSandboxFileForWriteUnguarded);
export const statSandboxPath = guarded(statSandboxPathUnguarded);
export const listSandboxDir = guarded(listSandboxDirUnguarded);
export const makeSandboxDir = guarded(makeSandboxDirUnguarded);
export const renameSandboxPath = guarded(renameSandboxPathUnguarded);
export const removeSandboxEntry = guarded(removeSandboxEntryUnguarded);
