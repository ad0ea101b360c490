/**
 * Maps paths inside a sandbox to paths on the host, the way the sandbox itself would see them:
 * symlinks are resolved as if the sandbox root were `/` (a link to `/etc` stays inside the sandbox),
 * `..` components are refused, and the final open uses O_NOFOLLOW plus a check of where the opened
 * descriptor really lives, so nothing outside the sandbox's directories can be read or written.
 */
import { constants as fsc, promises as fsp } from 'node:fs';
import * as path from 'node:path';
import { SandboxError } from './errors';

/** Where the sandbox's tree lives on the host: mount points inside the sandbox → host directories. */
export interface RootMap {
  mounts: { at: string; dir: string }[];
}

const MAX_SYMLINKS = 40;

/**
 * Splits an absolute sandbox path into its components.
 * Throws invalid_request for relative paths, NUL bytes and `..` components.
 */
export function sandboxPathComponents(p: string): string[] {
  if (typeof p !== 'string' || p.length === 0 || p.length > 4096) {
    throw new SandboxError('invalid_request', 'path must be a non-empty string of at most 4096 characters');
  }
  if (p.includes('\0')) throw new SandboxError('invalid_request', 'path must not contain NUL bytes');
  if (!p.startsWith('/')) throw new SandboxError('invalid_request', `path must be absolute: ${p}`);
  const parts = p.split('/').filter((c) => c !== '' && c !== '.');
  if (parts.includes('..')) throw new SandboxError('invalid_request', `path must not contain '..': ${p}`);
  return parts;
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

/**
 * Resolves a sandbox path to a host path, following symlinks inside the sandbox.
 * With `createDirs`, missing parent directories are created (mode 0755). A missing final component
 * is allowed (the caller creates or reports it). Throws invalid_request on bad paths or symlink loops,
 * not_found when a parent is missing and `createDirs` is off.
 */
export async function resolveSandboxPath(
  map: RootMap,
  sandboxPath: string,
  opts: { createDirs?: boolean } = {},
): Promise<{ hostPath: string; parts: string[] }> {
  const pending = sandboxPathComponents(sandboxPath);
  const done: string[] = [];
  let links = 0;
  while (pending.length > 0) {
    const comp = pending.shift() as string;
    if (comp === '..') {
      done.pop();
      continue;
    }
    if (comp === '.' || comp === '') continue;
    const candidate = [...done, comp];
    const host = hostPathOf(map, candidate);
    let st;
    try {
      st = await fsp.lstat(host);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      if (pending.length === 0) return { hostPath: host, parts: candidate };
      if (!opts.createDirs) throw new SandboxError('not_found', `no such file or directory: ${sandboxPath}`);
      await fsp.mkdir(host, { mode: 0o755 });
      done.push(comp);
      continue;
    }
    if (st.isSymbolicLink()) {
      if (++links > MAX_SYMLINKS) throw new SandboxError('invalid_request', `too many symlinks: ${sandboxPath}`);
      const target = await fsp.readlink(host);
      if (target.startsWith('/')) done.length = 0;
      // Components of the link target (which may contain '..', clamped at the sandbox root).
      pending.unshift(...target.split('/').filter((c) => c !== '' && c !== '.'));
      continue;
    }
    if (pending.length > 0 && !st.isDirectory()) {
      throw new SandboxError('invalid_request', `not a directory: /${candidate.join('/')}`);
    }
    done.push(comp);
  }
  return { hostPath: hostPathOf(map, done), parts: done };
}

/** Checks that an open descriptor really lives inside the sandbox (guards against races with the sandbox). */
async function assertFdInside(map: RootMap, fd: number, sandboxPath: string): Promise<void> {
  const real = await fsp.readlink(`/proc/self/fd/${fd}`);
  if (!isInsideRoot(map, real)) throw new SandboxError('invalid_request', `path escapes the sandbox: ${sandboxPath}`);
}

/** Writes a file inside the sandbox, creating parent directories. Throws invalid_request for bad paths. */
export async function writeSandboxFile(map: RootMap, sandboxPath: string, content: Buffer, mode = 0o644): Promise<void> {
  const { hostPath } = await resolveSandboxPath(map, sandboxPath, { createDirs: true });
  let fh;
  try {
    fh = await fsp.open(hostPath, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_TRUNC | fsc.O_NOFOLLOW, mode);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ELOOP') throw new SandboxError('invalid_request', `path is a symlink: ${sandboxPath}`);
    if (code === 'EISDIR') throw new SandboxError('invalid_request', `path is a directory: ${sandboxPath}`);
    throw err;
  }
  try {
    await assertFdInside(map, fh.fd, sandboxPath);
    await fh.writeFile(content);
  } finally {
    await fh.close();
  }
}

/**
 * Reads a file inside the sandbox. Throws not_found when absent, payload_too_large when bigger than
 * `maxBytes`, invalid_request for directories and bad paths.
 */
export async function readSandboxFile(map: RootMap, sandboxPath: string, maxBytes: number): Promise<Buffer> {
  const { hostPath } = await resolveSandboxPath(map, sandboxPath);
  let fh;
  try {
    fh = await fsp.open(hostPath, fsc.O_RDONLY | fsc.O_NOFOLLOW);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new SandboxError('not_found', `no such file: ${sandboxPath}`);
    if (code === 'ELOOP') throw new SandboxError('invalid_request', `path is a symlink: ${sandboxPath}`);
    throw err;
  }
  try {
    await assertFdInside(map, fh.fd, sandboxPath);
    const st = await fh.stat();
    if (st.isDirectory()) throw new SandboxError('invalid_request', `path is a directory: ${sandboxPath}`);
    if (!st.isFile()) throw new SandboxError('invalid_request', `not a regular file: ${sandboxPath}`);
    if (st.size > maxBytes) {
      throw new SandboxError('payload_too_large', `${sandboxPath} is ${st.size} bytes, more than the limit of ${maxBytes}`);
    }
    const buf = Buffer.alloc(Math.min(st.size, maxBytes) + 1);
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
