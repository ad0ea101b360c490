/**
 * Maps paths inside a sandbox to files the host can open, the way the sandbox itself would see them:
 * symlinks are resolved as if the sandbox root were `/` (a link to `/etc` stays inside the sandbox),
 * `..` components of the path are refused (those of a link target are clamped at the sandbox root).
 *
 * The walk never hands the kernel more than one component of sandbox-controlled text at a time: each
 * directory is opened (O_DIRECTORY | O_NOFOLLOW) relative to the descriptor of its parent, through
 * `/proc/self/fd/<parent>/<name>`, and the file itself is opened the same way with O_NOFOLLOW. A
 * symlink, or a directory swapped for one by the sandbox mid-walk, is therefore never followed by the
 * kernel (which would resolve an absolute target against the HOST's root when the walk started under
 * /proc/<pid>/root): the walk reads the link and goes on from the sandbox root itself.
 *
 * When the map names the sandbox's own mounts (`mountIds`, as the namespaces provider does: its tree is
 * reached through /proc/<init pid>/root, in the sandbox's mount namespace), every descriptor opened
 * on the way, directories included and before anything is created in them, must be on one of those
 * mounts (`mnt_id` in /proc/self/fdinfo): the sandbox's /proc, /dev and any other mount are refused.
 * Otherwise the opened file's path (readlink of /proc/self/fd/N) must lie under one of the map's dirs.
 *
 * A walk holds at most two directory descriptors whatever the depth (the root and the current
 * directory: each parent is closed as the walk descends; a `..` of a link target walks again from the
 * root). A path asked for has at most `pathLimits.maxDepth` components (SANDBOX_PATH_MAX_DEPTH, 256)
 * and `pathLimits.maxBytes` bytes (SANDBOX_PATH_MAX_BYTES, 4096), each component at most 255 bytes
 * (the kernel's NAME_MAX); beyond them, invalid_request (400). Every error of the filesystem leaves
 * here as a SandboxError (see fsError) whose message names only the sandbox path, never a host path.
 */
import { constants as fsc, promises as fsp } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import * as path from 'node:path';
import { isSandboxError, SandboxError } from './errors';

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

const MAX_SYMLINKS = 40;
/** The kernel's NAME_MAX: the longest component of a path, in bytes. */
export const NAME_MAX = 255;

/** Limits on a path asked for (SANDBOX_PATH_MAX_DEPTH, SANDBOX_PATH_MAX_BYTES; set by the host at start). */
export const pathLimits = { maxDepth: 256, maxBytes: 4096 };

/** A path as a message may show it: the sandbox path, cut short when long. */
export function shownPath(p: string): string {
  return p.length > 200 ? `${p.slice(0, 200)}…` : p;
}
const DIR_FLAGS = fsc.O_RDONLY | fsc.O_DIRECTORY | fsc.O_NOFOLLOW;
/** Never block on a FIFO the sandbox made, never acquire a terminal. */
const FILE_FLAGS = fsc.O_NOFOLLOW | fsc.O_NONBLOCK | fsc.O_NOCTTY;

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
const ERRNO: Record<string, [SandboxError['type'], string]> = {
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
function guarded<A extends [unknown, string, ...unknown[]], R>(fn: (...args: A) => Promise<R>): (...args: A) => Promise<R> {
  return (...args: A) => fn(...args).catch((err: unknown) => {
    throw fsError(err, args[1]);
  });
}

/** The mount of the map whose mount point is exactly `parts`, if any. */
function mountAt(map: RootMap, parts: string[]): string | undefined {
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
async function assertFdInside(map: RootMap, fd: number, sandboxPath: string): Promise<void> {
  const inside = map.mountIds
    ? map.mountIds.has(await mountIdOf(fd))
    : isInsideRoot(map, await fsp.readlink(`/proc/self/fd/${fd}`));
  if (!inside) throw new SandboxError('invalid_request', `path escapes the sandbox: ${sandboxPath}`);
}

const errCode = (err: unknown) => (err as NodeJS.ErrnoException).code;

/** A resolved path: the open directory holding the last component, and that component's name (none for `/`). */
interface Resolved {
  parts: string[];
  /** The root and, below it, the parent of the last component (at most two); the caller closes them (closeAll). */
  dirs: FileHandle[];
  name: string | null;
}

async function closeAll(dirs: FileHandle[]): Promise<void> {
  await Promise.all(dirs.splice(0).map((d) => d.close().catch(() => undefined)));
}

/** The handle, once its descriptor is checked to be inside the sandbox; closed when it is not. */
async function keepIfInside(map: RootMap, fh: FileHandle, sandboxPath: string): Promise<FileHandle> {
  try {
    await assertFdInside(map, fh.fd, sandboxPath);
  } catch (err) {
    await fh.close();
    throw err;
  }
  return fh;
}

/** Opens a mount's directory (a host path the map trusts, e.g. /proc/<pid>/root: no O_NOFOLLOW). */
async function openMountDir(map: RootMap, dir: string, sandboxPath: string): Promise<FileHandle> {
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
async function walk(map: RootMap, sandboxPath: string, opts: { createDirs?: boolean; noFollowLast?: boolean }): Promise<Resolved> {
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
            throw new SandboxError('invalid_request', `path is deeper than ${pathLimits.maxDepth} directories (SANDBOX_PATH_MAX_DEPTH): ${shownPath(sandboxPath)}`);
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
async function resolveSandboxPathUnguarded(
  map: RootMap,
  sandboxPath: string,
  opts: { createDirs?: boolean } = {},
): Promise<{ hostPath: string; parts: string[] }> {
  const r = await walk(map, sandboxPath, opts);
  await closeAll(r.dirs);
  return { hostPath: hostPathOf(map, r.parts), parts: r.parts };
}

/** Opens the walk's last component (the root directory itself for `/`), checks where it is, closes the walk's directories. */
async function openResolved(map: RootMap, r: Resolved, flags: number, mode: number, sandboxPath: string): Promise<FileHandle> {
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

/** What the filesystem routes say of a path: `lstat` of a listed entry, `stat` of a path asked for. */
export interface SandboxEntry {
  name: string;
  /** Absolute path inside the sandbox (symlinks on the way resolved for `stat`, as listed for `list`). */
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  isDir: boolean;
  size: number;
  /** Permission bits, e.g. 0o644. */
  mode: number;
  modTime: string;
  /** The link's target (symlinks only). */
  target?: string;
}

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
async function openSandboxFileForReadUnguarded(map: RootMap, sandboxPath: string): Promise<{ fh: FileHandle; size: number }> {
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
async function openSandboxFileForWriteUnguarded(map: RootMap, sandboxPath: string, mode = 0o644): Promise<FileHandle> {
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
async function statSandboxPathUnguarded(map: RootMap, sandboxPath: string, opts: { noFollow?: boolean } = {}): Promise<SandboxEntry> {
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
async function listSandboxDirUnguarded(map: RootMap, sandboxPath: string, max = 10_000): Promise<SandboxEntry[]> {
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
async function makeSandboxDirUnguarded(map: RootMap, sandboxPath: string, mode = 0o755): Promise<void> {
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
async function renameSandboxPathUnguarded(map: RootMap, from: string, to: string): Promise<void> {
  const a = await walk(map, from, { noFollowLast: true });
  try {
    if (a.name === null) throw new SandboxError(a.parts.length ? 'conflict' : 'invalid_request', `cannot rename ${a.parts.length ? 'a mount point of the sandbox' : '/'}: ${from}`);
    const b = await walk(map, to, { createDirs: true, noFollowLast: true });
    try {
      if (b.name === null) throw new SandboxError(b.parts.length ? 'conflict' : 'invalid_request', `cannot rename onto ${b.parts.length ? 'a mount point of the sandbox' : '/'}: ${to}`);
      await fsp.rename(`/proc/self/fd/${a.dirs[a.dirs.length - 1]!.fd}/${a.name}`, `/proc/self/fd/${b.dirs[b.dirs.length - 1]!.fd}/${b.name}`).catch((err) => {
        const code = errCode(err);
        if (code === 'ENOENT') throw new SandboxError('not_found', `no such file or directory: ${from}`);
        if (code === 'ENOTEMPTY' || code === 'EEXIST') throw new SandboxError('conflict', `destination is a directory that is not empty: ${to}`);
        if (code === 'EISDIR' || code === 'ENOTDIR') throw new SandboxError('conflict', `cannot replace ${code === 'EISDIR' ? 'a directory with a non-directory' : 'a non-directory with a directory'}: ${to}`);
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
async function removeSandboxEntryUnguarded(map: RootMap, sandboxPath: string): Promise<'removed' | 'notEmpty'> {
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
