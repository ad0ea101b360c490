/**
 * The base skeleton every namespaces sandbox's `/` starts from (`${dataDir}/base-vN`): the top-level
 * directories, the /usr links, an /etc with root and the `sandbox` user (uid 1000, passwordless sudo,
 * see ./sandbox-user), and the few host /etc files su, sudo and PAM need. Made once per data dir,
 * under a temporary name and renamed into place, so that two host processes never see half of it.
 */
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'pino';
import { execFileP } from './layers';
import { SANDBOX_HOME, SANDBOX_UID, writeSandboxUser } from './sandbox-user';

const BASE_DIRS = ['root', 'tmp', 'workspace', 'home', 'proc', 'dev', 'usr', 'opt', 'var', 'var/tmp', 'run', 'mnt', 'srv', 'etc'];
const BASE_LINKS: [string, string][] = [
  ['bin', 'usr/bin'],
  ['lib', 'usr/lib'],
  ['lib64', 'usr/lib64'],
  ['sbin', 'usr/sbin'],
];
/** Files of the host's /etc copied into the base skeleton, so that su, useradd and PAM work as root inside. */
const BASE_ETC_COPIES = ['pam.d', 'login.defs', 'security', 'default/useradd', 'skel'];

/** Makes the base skeleton at `base` unless it is there. */
export async function ensureBaseSkeleton(base: string, log: Logger): Promise<void> {
  if (
    await fsp.stat(base).then(
      () => true,
      () => false,
    )
  )
    return;
  const tmp = `${base}.tmp-${process.pid}`;
  await fsp.rm(tmp, { recursive: true, force: true });
  for (const d of BASE_DIRS) await fsp.mkdir(path.join(tmp, d), { recursive: true, mode: 0o755 });
  await fsp.chmod(path.join(tmp, 'tmp'), 0o1777);
  await fsp.chmod(path.join(tmp, 'var/tmp'), 0o1777);
  await fsp.chmod(path.join(tmp, 'root'), 0o700);
  for (const [name, target] of BASE_LINKS) await fsp.symlink(target, path.join(tmp, name));
  const etc = path.join(tmp, 'etc');
  await fsp.writeFile(
    path.join(etc, 'passwd'),
    `root:x:0:0:root:/root:/bin/bash\nsandbox:x:${SANDBOX_UID}:${SANDBOX_UID}:sandbox:${SANDBOX_HOME}:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n`,
  );
  await fsp.writeFile(path.join(etc, 'group'), `root:x:0:\nsudo:x:27:sandbox\nsandbox:x:${SANDBOX_UID}:\nnogroup:x:65534:\n`);
  await fsp.writeFile(path.join(etc, 'hosts'), '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n');
  await fsp.writeFile(path.join(etc, 'resolv.conf'), '# no network inside the sandbox\n');
  await fsp.writeFile(path.join(etc, 'nsswitch.conf'), 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n');
  await fsp.writeFile(path.join(etc, 'shadow'), 'root:*:19000:0:99999:7:::\nsandbox:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n', { mode: 0o640 });
  await fsp.writeFile(path.join(etc, 'gshadow'), 'root:*::\nsudo:*::sandbox\nsandbox:*::\nnogroup:*::\n', { mode: 0o640 });
  await writeSandboxUser(tmp);
  for (const name of BASE_ETC_COPIES) {
    await fsp.mkdir(path.dirname(path.join(etc, name)), { recursive: true });
    await execFileP('cp', ['-a', path.join('/etc', name), path.join(etc, name)]).catch(() => undefined);
  }
  await fsp.symlink('../usr/lib/os-release', path.join(etc, 'os-release'));
  await fsp.copyFile('/etc/ld.so.cache', path.join(etc, 'ld.so.cache')).catch(() => undefined);
  // The alternatives system's symlinks (e.g. /usr/bin/awk → /etc/alternatives/awk → /usr/bin/mawk).
  try {
    await fsp.mkdir(path.join(etc, 'alternatives'));
    for (const name of await fsp.readdir('/etc/alternatives')) {
      const src = path.join('/etc/alternatives', name);
      const st = await fsp.lstat(src);
      if (st.isSymbolicLink()) await fsp.symlink(await fsp.readlink(src), path.join(etc, 'alternatives', name));
    }
  } catch {
    /* no alternatives on this machine */
  }
  try {
    await fsp.rename(tmp, base);
  } catch (err) {
    // Another host process built it first.
    await fsp.rm(tmp, { recursive: true, force: true });
    if (
      !(await fsp.stat(base).then(
        () => true,
        () => false,
      ))
    )
      throw err;
  }
  log.info({ base }, 'base filesystem created');
}
