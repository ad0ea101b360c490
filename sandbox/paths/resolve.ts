/**
 * Resolution of a sandbox path to an open host descriptor, one component at a time (see ../paths.ts
 * for the rules), and the small reads and writes of whole files built on it.
 */
import { constants as fsc, promises as fsp } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import * as path from 'node:path';
import { isSandboxError, SandboxError } from '../../contract/errors';

/** Where the sandbox's tree lives on the host: mount points inside the sandbox → host directories. */
export interface RootMap {
  mounts: { at: string; dir: string }[];
  /**
   * The sandbox's cgroups, when it has some: what the host writes into the sandbox's files is written
   * by a helper process that joins them first (`procsFiles`), so that the pages (a tmpfs's, RAM) are
   * charged to the sandbox's memory, not the host's (see ./charged-write).
   */
  charge?: { procsFiles: string[]; oomKills: () => number; memoryDir?: string };
  /**
   * The mount ids every opened descriptor must be on. Set when `dir` is reached through another
   * mount namespace (/proc/<pid>/root), where the path of a descriptor says nothing.
   */
  mountIds?: ReadonlySet<number>;
  /** Called once the root directory is open; throws when it may not be the sandbox's (e.g. its init died). */
  verifyRoot?: () => void;
  /**
   * Host ids of the sandbox's root, when the sandbox has a user namespace: what the host creates
   * there (files, parent directories) is given to sandbox root, as if root inside had made it.
   */
  owner?: { uid: number; gid: number };
}

export const MAX_SYMLINKS = 40;
/** The kernel's NAME_MAX: the longest component of a path, in bytes. */
export const NAME_MAX = 255;

/** Limits on a path asked for (SANDBOX_PATH_MAX_DEPTH, SANDBOX_PATH_MAX_BYTES; set by the host at start). */
export const pathLimits = { maxDepth: 256, maxBytes: 4096 };

/** A path as a message may show it: the sandbox path, cut short when long. */
export function shownPath(p: string): string {
  return p.length > 200 ? `${p.slice(0, 200)}…` : p;
}
export const DIR_FLAGS = fsc.O_RDONLY | fsc.O_DIRECTORY | fsc.O_NOFOLLOW;
/** Never block on a FIFO the sandbox made, never acquire a terminal. */
export const FILE_FLAGS = fsc.O_NOFOLLOW | fsc.O_NONBLOCK | fsc.O_NOCTTY;

/**
 * Splits an absolute sandbox path into its components.
 * Throws invalid_request for relative paths, NUL bytes and `..` components.
 */
export function sandboxPathComponents(p: string): string[] {
  if (typeof p !== 'string' || p.length === 0 || Buffer.byteLength(p) > pathLimits.maxBytes) {
    throw new SandboxError('invalid_request', `path must be a non-empty string of at most ${pathLimits.maxBytes} bytes (SANDBOX_PATH_MAX_BYTES)`);
  }
  if (p.includes('\0')) throw new SandboxError('invalid_request', 'path must not contain NUL bytes');
  if (!p.startsWith('/')) throw new SandboxError('invalid_request', `path must be absolute: ${shownPath(p)}`);
  const parts = p.split('/').filter((c) => c !== '' && c !== '.');
  if (parts.includes('..')) throw new SandboxError('invalid_request', `path must not contain '..': ${shownPath(p)}`);
  if (parts.length > pathLimits.maxDepth) {
    throw new SandboxError('invalid_request', `path has ${parts.length} components, more than the limit of ${pathLimits.maxDepth} (SANDBOX_PATH_MAX_DEPTH)`);
  }
  if (parts.some((c) => Buffer.byteLength(c) > NAME_MAX)) {
    throw new SandboxError('invalid_request', `a component of the path is longer than ${NAME_MAX} bytes: ${shownPath(p)}`);
  }
  return parts;
}

/** What an errno of the filesystem means to the caller (status type, words); every one a 4xx but a host fault's. */
export const ERRNO: Record<string, [SandboxError['type'], string]> = {
  ENOENT: ['not_found', 'no such file or directory'],
  ESRCH: ['conflict', 'the sandbox is not running'],
  ENAMETOOLONG: ['invalid_request', 'file name too long'],
  ELOOP: ['invalid_request', 'too many levels of symbolic links, or a symlink where none may be'],
  ENOTDIR: ['invalid_request', 'not a directory'],
  EISDIR: ['invalid_request', 'is a directory'],
  EINVAL: ['invalid_request', 'invalid argument'],
  ENXIO: ['invalid_request', 'not a regular file'],
  ENODEV: ['invalid_request', 'not a regular file'],
  EOPNOTSUPP: ['invalid_request', 'operation not supported there'],
  ENOTSUP: ['invalid_request', 'operation not supported there'],
  EEXIST: ['conflict', 'already exists'],
  ENOTEMPTY: ['conflict', 'directory not empty'],
  EXDEV: ['conflict', 'on a different mount of the sandbox'],
  EBUSY: ['conflict', 'busy (a mount point?)'],
  ETXTBSY: ['conflict', 'busy (a running program)'],
  EROFS: ['conflict', 'read-only file system'],
  EACCES: ['conflict', 'permission denied'],
  EPERM: ['conflict', 'operation not permitted'],
  EMLINK: ['conflict', 'too many links'],
  ENOSPC: ['payload_too_large', "the sandbox's disk is full (its diskMB limit)"],
  EDQUOT: ['payload_too_large', "the sandbox's disk is full (its diskMB limit)"],
  EFBIG: ['payload_too_large', 'file too large'],
  ENOMEM: ['payload_too_large', "the sandbox's memory is full (its memoryMB limit)"],
  // Faults of the host, not of the request: retry later.
  EMFILE: ['unavailable', 'the sandbox host is out of file descriptors; retry'],
  ENFILE: ['unavailable', 'the sandbox host is out of file descriptors; retry'],
  EIO: ['unavailable', 'I/O error on the sandbox host; retry'],
};

/**
 * The SandboxError of any error of a file operation on `sandboxPath`: SandboxErrors pass, an errno is
 * named with the sandbox path only (the kernel's message names /proc/self/fd/N/…, a host path), an
 * unknown errno is a conflict, anything else internal without its message.
 */
export function fsError(err: unknown, sandboxPath: string): SandboxError {
  if (isSandboxError(err)) return err;
  const code = errCode(err);
  if (typeof code === 'string' && /^E[A-Z0-9]+$/.test(code)) {
    const [type, words] = ERRNO[code] ?? ['conflict', 'the filesystem refused the operation'];
    return new SandboxError(type, `${words} (${code}): ${shownPath(sandboxPath)}`);
  }
  return new SandboxError('internal', `file operation failed: ${shownPath(sandboxPath)}`);
}

/** `fn` whose errors are fsError's of its first argument (a sandbox path). */
export function guarded<A extends [unknown, string, ...unknown[]], R>(fn: (...args: A) => Promise<R>): (...args: A) => Promise<R> {
  return (...args: A) =>
    fn(...args).catch((err: unknown) => {
      throw fsError(err, args[1]);
    });
}

/** The mount of the map whose mount point is exactly `parts`, if any. */
export function mountAt(map: RootMap, parts: string[]): string | undefined {
  for (const m of map.mounts) {
    const at = m.at.split('/').filter(Boolean);
    if (at.length === parts.length && at.every((c, i) => parts[i] === c)) return m.dir;
  }
  return undefined;
}

/** The host path of a (resolved, symlink-free) sandbox path: the longest matching mount wins. */
export function hostPathOf(map: RootMap, parts: string[]): string {
  let best: { at: string[]; dir: string } | undefined;
  for (const m of map.mounts) {
    const at = m.at.split('/').filter(Boolean);
    if (at.length <= parts.length && at.every((c, i) => parts[i] === c) && (!best || at.length > best.at.length)) {
      best = { at, dir: m.dir };
    }
  }
  if (!best) throw new SandboxError('internal', 'sandbox has no root mount');
  return path.join(best.dir, ...parts.slice(best.at.length));
}

/** True when `hostPath` is one of the map's directories or inside one. */
export function isInsideRoot(map: RootMap, hostPath: string): boolean {
  return map.mounts.some((m) => hostPath === m.dir || hostPath.startsWith(m.dir.endsWith('/') ? m.dir : m.dir + '/'));
}

/** The mount id of an open descriptor (from /proc/self/fdinfo). */
export async function mountIdOf(fd: number): Promise<number> {
  const text = await fsp.readFile(`/proc/self/fdinfo/${fd}`, 'latin1');
  const m = /^mnt_id:\s*(\d+)/m.exec(text);
  if (!m) throw new SandboxError('internal', 'no mnt_id in /proc/self/fdinfo');
  return Number(m[1]);
}

/** Throws invalid_request unless the descriptor lies inside the sandbox (see the module comment). */
export async function assertFdInside(map: RootMap, fd: number, sandboxPath: string): Promise<void> {
  const inside = map.mountIds ? map.mountIds.has(await mountIdOf(fd)) : isInsideRoot(map, await fsp.readlink(`/proc/self/fd/${fd}`));
  if (!inside) throw new SandboxError('invalid_request', `path escapes the sandbox: ${sandboxPath}`);
}

export const errCode = (err: unknown) => (err as NodeJS.ErrnoException).code;

/** A resolved path: the open directory holding the last component, and that component's name (none for `/`). */
export interface Resolved {
  parts: string[];
  /** The root and, below it, the parent of the last component (at most two); the caller closes them (closeAll). */
  dirs: FileHandle[];
  name: string | null;
}

export async function closeAll(dirs: FileHandle[]): Promise<void> {
  await Promise.all(dirs.splice(0).map((d) => d.close().catch(() => undefined)));
}

/** The handle, once its descriptor is checked to be inside the sandbox; closed when it is not. */
export async function keepIfInside(map: RootMap, fh: FileHandle, sandboxPath: string): Promise<FileHandle> {
  try {
    await assertFdInside(map, fh.fd, sandboxPath);
  } catch (err) {
    await fh.close();
    throw err;
  }
  return fh;
}

/** Opens a mount's directory (a host path the map trusts, e.g. /proc/<pid>/root: no O_NOFOLLOW). */
export async function openMountDir(map: RootMap, dir: string, sandboxPath: string): Promise<FileHandle> {
  let fh: FileHandle;
  try {
    fh = await fsp.open(dir, fsc.O_RDONLY | fsc.O_DIRECTORY);
  } catch (err) {
    if (errCode(err) === 'ENOENT' || errCode(err) === 'ESRCH') throw new SandboxError('conflict', 'sandbox is not running');
    throw err;
  }
  return keepIfInside(map, fh, sandboxPath);
}

/**
 * Walks a sandbox path (see the module comment). With `createDirs`, missing parent directories are
 * created (mode 0755). A missing last component is allowed. Throws invalid_request on bad paths,
 * symlink loops and escapes, not_found when a parent is missing and `createDirs` is off.
 */
export async function walk(map: RootMap, sandboxPath: string, opts: { createDirs?: boolean; noFollowLast?: boolean }): Promise<Resolved> {
  const pending = sandboxPathComponents(sandboxPath);
  const rootDir = mountAt(map, []);
  if (!rootDir) throw new SandboxError('internal', 'sandbox has no root mount');
  // dirs: the root and, when the walk is below it, the current directory (nothing more is held).
  const dirs: FileHandle[] = [await openMountDir(map, rootDir, sandboxPath)];
  const done: string[] = [];
  let links = 0;
  /** Components looked at (walks again from the root included): bounded, so a walk is. */
  let steps = 0;
  const maxSteps = pathLimits.maxDepth * (MAX_SYMLINKS + 2);
  /** Looks again after a race with the sandbox (or a directory just created): bounded. */
  let again = 0;
  const retry = (comp: string) => {
    if (++again > MAX_SYMLINKS) throw new SandboxError('conflict', `path keeps changing: ${sandboxPath}`);
    pending.unshift(comp);
  };
  try {
    map.verifyRoot?.();
    while (pending.length > 0) {
      const comp = pending.shift() as string;
      if (++steps > maxSteps) throw new SandboxError('invalid_request', `path takes too long to resolve (symlinks): ${shownPath(sandboxPath)}`);
      if (comp === '..') {
        // Only from a link target: clamped at the root. The parent is not held open: walk again from
        // the root to it (a run of `..` at once).
        let up = 1;
        while (pending[0] === '..') {
          pending.shift();
          up++;
        }
        if (done.length > 0) {
          pending.unshift(...done.slice(0, Math.max(0, done.length - up)));
          done.length = 0;
          await closeAll(dirs.splice(1));
        }
        continue;
      }
      if (comp === '.' || comp === '') continue;
      const last = pending.length === 0;
      const parent = dirs[dirs.length - 1]!;
      const rel = `/proc/self/fd/${parent.fd}/${comp}`;
      const mount = mountAt(map, [...done, comp]);
      if (!last || mount) {
        // A directory on the way: open it without following a symlink.
        let fh: FileHandle | null = null;
        try {
          fh = mount ? await openMountDir(map, mount, sandboxPath) : await fsp.open(rel, DIR_FLAGS);
        } catch (err) {
          const code = errCode(err);
          if (err instanceof SandboxError) throw err;
          if (code === 'ENOENT') {
            if (last) return { parts: [...done, comp], dirs, name: comp };
            if (!opts.createDirs) throw new SandboxError('not_found', `no such file or directory: ${sandboxPath}`);
            const made = await fsp.mkdir(rel, { mode: 0o755 }).then(
              () => true,
              (e) => {
                if (errCode(e) !== 'EEXIST') throw e;
                return false;
              },
            );
            // lchown: never follows a link the sandbox may have put there since.
            if (made && map.owner) await fsp.lchown(rel, map.owner.uid, map.owner.gid);
            retry(comp);
            continue;
          }
          if (code !== 'ELOOP' && code !== 'ENOTDIR') throw err;
        }
        if (fh) {
          if (!mount) {
            try {
              await assertFdInside(map, fh.fd, sandboxPath);
            } catch (err) {
              await fh.close();
              throw err;
            }
          }
          if (done.length >= pathLimits.maxDepth) {
            await fh.close();
            throw new SandboxError(
              'invalid_request',
              `path is deeper than ${pathLimits.maxDepth} directories (SANDBOX_PATH_MAX_DEPTH): ${shownPath(sandboxPath)}`,
            );
          }
          // The parent is no longer needed (the root stays): O(1) descriptors per walk.
          if (dirs.length > 1) await dirs.pop()!.close();
          dirs.push(fh);
          done.push(comp);
          continue;
        }
      }
      // The last component, or not a directory: a symlink is followed here, anything else ends the walk.
      let st;
      try {
        st = await fsp.lstat(rel);
      } catch (err) {
        if (errCode(err) !== 'ENOENT') throw err;
        if (last) return { parts: [...done, comp], dirs, name: comp };
        // Removed since the open failed: look again.
        retry(comp);
        continue;
      }
      if (st.isSymbolicLink() && !(last && opts.noFollowLast)) {
        if (++links > MAX_SYMLINKS) throw new SandboxError('invalid_request', `too many symlinks: ${sandboxPath}`);
        let target: string;
        try {
          target = await fsp.readlink(rel);
        } catch (err) {
          // Replaced since the lstat: look again.
          if (errCode(err) !== 'EINVAL' && errCode(err) !== 'ENOENT') throw err;
          retry(comp);
          continue;
        }
        if (target.startsWith('/')) {
          done.length = 0;
          await closeAll(dirs.splice(1));
        }
        // Components of the link target (which may contain '..', clamped at the sandbox root).
        pending.unshift(...target.split('/').filter((c) => c !== '' && c !== '.'));
        continue;
      }
      if (!last) {
        if (st.isDirectory()) {
          // Was a symlink a moment ago: look again.
          retry(comp);
          continue;
        }
        throw new SandboxError('invalid_request', `not a directory: ${shownPath(`/${[...done, comp].join('/')}`)}`);
      }
      return { parts: [...done, comp], dirs, name: comp };
    }
    return { parts: done, dirs, name: null };
  } catch (err) {
    await closeAll(dirs);
    throw err;
  }
}

/**
 * Resolves a sandbox path to a host path, following symlinks inside the sandbox (the path is only
 * meaningful for maps of host directories; file access goes through readSandboxFile/writeSandboxFile).
 * With `createDirs`, missing parent directories are created (mode 0755). A missing final component
 * is allowed. Throws invalid_request on bad paths or symlink loops, not_found when a parent is missing
 * and `createDirs` is off.
 */
export async function resolveSandboxPathUnguarded(
  map: RootMap,
  sandboxPath: string,
  opts: { createDirs?: boolean } = {},
): Promise<{ hostPath: string; parts: string[] }> {
  const r = await walk(map, sandboxPath, opts);
  await closeAll(r.dirs);
  return { hostPath: hostPathOf(map, r.parts), parts: r.parts };
}

/** Opens the walk's last component (the root directory itself for `/`), checks where it is, closes the walk's directories. */
export async function openResolved(map: RootMap, r: Resolved, flags: number, mode: number, sandboxPath: string): Promise<FileHandle> {
  try {
    const parent = r.dirs[r.dirs.length - 1]!;
    if (r.name === null) {
      // `/`: the root directory is open already.
      if (flags & (fsc.O_WRONLY | fsc.O_RDWR)) throw new SandboxError('invalid_request', `path is a directory: ${sandboxPath}`);
      return r.dirs.pop()!;
    }
    let fh: FileHandle;
    try {
      fh = await fsp.open(`/proc/self/fd/${parent.fd}/${r.name}`, flags | FILE_FLAGS, mode);
    } catch (err) {
      const code = errCode(err);
      if (code === 'ENOENT') throw new SandboxError('not_found', `no such file: ${sandboxPath}`);
      if (code === 'ELOOP') throw new SandboxError('invalid_request', `path is a symlink: ${sandboxPath}`);
      if (code === 'EISDIR') throw new SandboxError('invalid_request', `path is a directory: ${sandboxPath}`);
      if (code === 'ENXIO') throw new SandboxError('invalid_request', `not a regular file: ${sandboxPath}`);
      throw err;
    }
    return await keepIfInside(map, fh, sandboxPath);
  } finally {
    await closeAll(r.dirs);
  }
}
