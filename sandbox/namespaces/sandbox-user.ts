/**
 * The sandbox user (CreateSandboxRequest.user `sandbox`, OpenComputer's convention): uid and gid 1000,
 * HOME=/home/sandbox, /workspace its own, passwordless sudo to sandbox root. How its processes are
 * started is tools/sandbox-enter's `-u`; why sudo widens nothing on the host: docs/isolation.md.
 */
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';
import type { SandboxState } from '../base';
import { writeSandboxFile, type RootMap } from '../paths';
import { execFileP } from './layers';

/** The sandbox user's uid and gid inside the sandbox, and its home. */
export const SANDBOX_UID = 1000;
export const SANDBOX_HOME = '/home/sandbox';

/** Host ids of what the host creates in a sandbox's files: its root's, or its sandbox user's. */
export function ownerOf(idBase: number, user: SandboxState['user']): { uid: number; gid: number } {
  const id = idBase + (user === 'sandbox' ? SANDBOX_UID : 0);
  return { uid: id, gid: id };
}

/**
 * The sandbox user in the base skeleton `dir`: its home (a copy of /etc/skel) and /workspace owned by
 * it (ids as the sandbox sees them: the layer is idmapped), and sudo without a password. sudo wants
 * its files owned by root and not writable by others.
 */
export async function writeSandboxUser(dir: string): Promise<void> {
  const home = path.join(dir, SANDBOX_HOME);
  await fsp.mkdir(home, { recursive: true, mode: 0o755 });
  await execFileP('cp', ['-a', '/etc/skel/.', home]).catch(() => undefined);
  await execFileP('chown', ['-R', `${SANDBOX_UID}:${SANDBOX_UID}`, home, path.join(dir, 'workspace')]);
  await fsp.writeFile(path.join(dir, 'etc/sudoers'), 'Defaults env_reset\nroot ALL=(ALL:ALL) ALL\n@includedir /etc/sudoers.d\n', { mode: 0o440 });
  await fsp.mkdir(path.join(dir, 'etc/sudoers.d'), { mode: 0o755 });
  await fsp.writeFile(path.join(dir, 'etc/sudoers.d/sandbox'), 'sandbox ALL=(ALL:ALL) NOPASSWD: ALL\n', { mode: 0o440 });
}

/**
 * /etc/hosts naming the sandbox's own host name (root's file): sudo resolves it at every call, and
 * without it waits for the DNS and warns "unable to resolve host" on stderr.
 */
export async function writeHostsFile(map: RootMap, idBase: number, hostname: string): Promise<void> {
  const text = `127.0.0.1\tlocalhost\n127.0.1.1\t${hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n`;
  await writeSandboxFile({ ...map, owner: ownerOf(idBase, 'root') }, '/etc/hosts', Buffer.from(text), 0o644);
}
