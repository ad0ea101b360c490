/** The namespaces provider's mounts: what a sandbox left mounted on the host, and a sandbox's own trees. */
import { promises as fsp } from 'node:fs';
import { SandboxError } from '../../contract/errors';
import type { Spawner } from '../spawner';

/** Mount points under `dir` in the host's mount namespace, deepest first. */
async function mountsUnder(dir: string): Promise<string[]> {
  const text = await fsp.readFile('/proc/self/mountinfo', 'utf8');
  const prefix = dir.endsWith('/') ? dir : dir + '/';
  const out: string[] = [];
  for (const line of text.split('\n')) {
    const mp = line.split(' ')[4];
    if (!mp) continue;
    const decoded = mp.replace(/\\([0-7]{3})/g, (_m, o: string) => String.fromCharCode(parseInt(o, 8)));
    if (decoded.startsWith(prefix)) out.push(decoded);
  }
  return out.sort((a, b) => b.length - a.length);
}

/**
 * Unmounts everything under `dir` (umount2 through the spawner: no process per unmount), lazily
 * when a plain unmount fails. Throws internal if something stays mounted.
 */
export async function unmountUnder(dir: string, spawner: Spawner): Promise<void> {
  const mounts = await mountsUnder(dir);
  if (mounts.length === 0) return;
  let failed = await spawner.umount(mounts);
  if (failed.length === 0) return;
  failed = await spawner.umount(
    failed.map((f) => f.path),
    { lazy: true },
  );
  if (failed.length > 0) throw new SandboxError('internal', `could not unmount ${failed.map((f) => `${f.path} (${f.error})`).join(', ')}`);
}

/**
 * The ids of the overlay mounts on `/`, `/usr` and `/workspace` (a bind of the overlay of `/`) in a
 * mountinfo table: a sandbox's own trees. (Its processes have no capability to mount anything else there.)
 */
export function sandboxMountIds(mountinfo: string): Set<number> {
  const ids = new Set<number>();
  for (const line of mountinfo.split('\n')) {
    const f = line.split(' ');
    const sep = f.indexOf('-', 6);
    if (sep < 0 || f[sep + 1] !== 'overlay') continue;
    if (f[4] === '/' || f[4] === '/usr' || f[4] === '/workspace') ids.add(Number(f[0]));
  }
  return ids;
}
