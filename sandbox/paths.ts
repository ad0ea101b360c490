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

export type { SandboxEntry } from './host-contract/types';
export { NAME_MAX, fsError, hostPathOf, isInsideRoot, mountIdOf, pathLimits, sandboxPathComponents, shownPath, type RootMap } from './paths/resolve';
export {
  resolveSandboxPath,
  writeSandboxFile,
  readSandboxFile,
  openSandboxFileForRead,
  openSandboxFileForWrite,
  statSandboxPath,
  listSandboxDir,
  makeSandboxDir,
  renameSandboxPath,
  removeSandboxEntry,
} from './paths/entries';
