/**
 * The sandbox user against real sandboxes (CreateSandboxRequest.user `sandbox`): uid 1000 with no
 * capabilities, HOME and /workspace its own, passwordless sudo to sandbox root, and, as an attacker
 * would try, nothing of that reaching the host: what sudo gives is sandbox root (the sandbox's own
 * host id range, Docker's capabilities, the seccomp filter), never more. A root sandbox is unchanged.
 * Needs root, overlayfs and cgroup v1 (the machine described in TOOLCHAIN.md), and sudo on the host's
 * /usr (scripts/toolchain.sh installs it).
 */
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';
import type { HostClient } from '../../../sandbox/host-contract/client';
import type { RunningHost } from '../../../sandbox/host/server';
import { DEFAULT_CAPS, providerSh, startTestHost, stopTestHost } from '../../helpers/sandbox-host';
import { eventually } from '../../helpers/env';

describe('sandbox host (namespaces): the sandbox user', () => {
  let dataDir: string;
  let host: RunningHost;
  let client: HostClient;
  let n = 0;
  const newId = () => `sb-tu${process.pid}-${++n}`;
  /** The sandbox's host id base (its root is this host uid), from its state.json. */
  const idBaseOf = async (id: string): Promise<number> =>
    (JSON.parse(await fsp.readFile(path.join(dataDir, 'sandboxes', id, 'state.json'), 'utf8')) as { idBase: number }).idBase;
  /** The sandbox's tree as the host sees it. */
  const rootOf = async (id: string): Promise<string> => {
    const st = JSON.parse(await fsp.readFile(path.join(dataDir, 'sandboxes', id, 'state.json'), 'utf8')) as { init: { ns: { pid: number } } };
    return `/proc/${st.init.ns.pid}/root`;
  };

  beforeAll(async () => {
    ({ dataDir, host, client } = await startTestHost());
  });
  afterAll(() => stopTestHost(host && { dataDir, host, client }));

  it('runs commands as sandbox (uid 1000, no capabilities, HOME and /workspace its own)', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', user: 'sandbox' });
    const r = await providerSh(
      host.provider,
      id,
      [
        'whoami',
        'id -u; id -g; id -G',
        'echo "$HOME $USER $LOGNAME"',
        'pwd',
        'grep -E "^(CapEff|CapPrm|CapInh|CapAmb|NoNewPrivs|Seccomp):" /proc/self/status | tr "\\t" " "',
        'echo hi > /workspace/mine && cat /workspace/mine',
        'echo hi > ~/.mine && cat ~/.mine',
        'touch /etc/nope 2>/dev/null && echo wrote-etc || echo no-etc',
        'cat /etc/shadow 2>/dev/null || echo no-shadow',
        'ls /root 2>/dev/null || echo no-root',
      ].join('; '),
    );
    expect(r.stderr).toBe('');
    expect(r.stdout.trim().split('\n')).toEqual([
      'sandbox',
      '1000',
      '1000',
      '1000',
      '/home/sandbox sandbox sandbox',
      '/workspace',
      'CapInh: 0000000000000000',
      'CapPrm: 0000000000000000',
      'CapEff: 0000000000000000',
      'CapAmb: 0000000000000000',
      'NoNewPrivs: 0',
      'Seccomp: 2',
      'hi',
      'hi',
      'no-etc',
      'no-shadow',
      'no-root',
    ]);
  });

  it('gives passwordless sudo to sandbox root: the root capabilities and the seccomp filter, nothing more', async () => {
    const id = newId();
    await fsp.writeFile(path.join(dataDir, 'host-secret'), 'TOPSECRET');
    await client.createSandbox({ id, orgId: 'o', user: 'sandbox' });
    const r = await providerSh(
      host.provider,
      id,
      [
        'sudo -n true && echo sudo-ok',
        'sudo -n id -u',
        'sudo -n grep -E "^(CapEff|Seccomp):" /proc/self/status | tr "\\t" " "',
        // What root of a sandbox cannot do, sudo cannot either.
        'sudo -n mount -t tmpfs x /mnt 2>/dev/null && echo mounted || echo no-mount',
        'sudo -n unshare -U -r true 2>/dev/null && echo userns || echo no-userns',
        `sudo -n cat ${dataDir}/host-secret 2>/dev/null || echo no-host-file`,
        'sudo -n touch /workspace/by-sudo /usr/local/by-sudo && echo made',
        // A setuid-root copy of id in /usr (its only set-id mount) gives the user sandbox root, as sudo does.
        'sudo -n cp /usr/bin/id /usr/local/bin/suid-id && sudo -n chmod 4755 /usr/local/bin/suid-id && /usr/local/bin/suid-id -u',
      ].join('; '),
    );
    // Quiet: its host name resolves from /etc/hosts (no DNS wait, no "unable to resolve host").
    expect(r.stderr).toBe('');
    expect(r.stdout.trim().split('\n')).toEqual([
      'sudo-ok',
      '0',
      `CapEff: ${DEFAULT_CAPS}`,
      'Seccomp: 2',
      'no-mount',
      'no-userns',
      'no-host-file',
      'made',
      '0',
    ]);
    // On the host, what sudo made is the sandbox's root's: its own unprivileged id, never host root.
    const base = await idBaseOf(id);
    expect(base).toBeGreaterThan(65535);
    const root = await rootOf(id);
    for (const f of ['workspace/by-sudo', 'usr/local/by-sudo', 'usr/local/bin/suid-id']) {
      const st = await fsp.stat(path.join(root, f));
      expect([f, st.uid, st.gid]).toEqual([f, base, base]);
    }
  });

  it('writes files for the sandbox user as that user (the files API), and the user can edit them', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', user: 'sandbox', files: { '/home/sandbox/given.txt': 'given\n' } });
    await client.writeFile(id, '/workspace/dir/new.txt', 'one\n');
    const base = await idBaseOf(id);
    const root = await rootOf(id);
    for (const f of ['workspace/dir/new.txt', 'workspace/dir', 'home/sandbox/given.txt']) {
      const st = await fsp.stat(path.join(root, f));
      expect([f, st.uid, st.gid]).toEqual([f, base + 1000, base + 1000]);
    }
    const r = await providerSh(host.provider, id, 'echo two >> /workspace/dir/new.txt && cat /workspace/dir/new.txt && stat -c %U /home/sandbox/given.txt');
    expect(r.stdout).toBe('one\ntwo\nsandbox\n');
  });

  it('runs the entrypoint as the sandbox user and patches as root', async () => {
    const id = newId();
    await client.createSandbox({
      id,
      orgId: 'o',
      user: 'sandbox',
      patches: [{ id: 'p1', script: 'id -u > /tmp/patch-uid' }],
      entrypoint: { argv: ['/bin/bash', '-c', 'echo "$(id -u) $HOME $(pwd)" > /tmp/ep'] },
    });
    const ep = await eventually(async () => (await client.readFile(id, '/tmp/ep'))?.toString());
    expect(ep).toBe('1000 /home/sandbox /workspace\n');
    expect((await client.readFile(id, '/tmp/patch-uid'))?.toString()).toBe('0\n');
  });

  it('keeps the user through hibernate and wake (the respawn record holds it)', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', user: 'sandbox' });
    await providerSh(host.provider, id, 'echo kept > ~/kept');
    await client.hibernate(id, `hib-${id}`);
    await client.wake(id);
    const r = await providerSh(host.provider, id, 'whoami; cat ~/kept; sudo -n id -u');
    expect(r.stdout).toBe('sandbox\nkept\n0\n');
  });

  it('leaves a root sandbox as it was: root, the default capabilities, no_new_privs (setuid bits inert)', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o' });
    const r = await providerSh(
      host.provider,
      id,
      [
        'id -u',
        'echo "$HOME $USER"',
        'pwd',
        'grep -E "^(CapEff|NoNewPrivs):" /proc/self/status | tr "\\t" " "',
        'cp /usr/bin/id /usr/local/bin/suid-id && chown 1000 /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id',
        // The sandbox user's id through a setuid file: no_new_privs keeps root's command root.
        '/usr/local/bin/suid-id -u',
      ].join('; '),
    );
    expect(r.stdout.trim().split('\n')).toEqual(['0', '/root root', '/workspace', `CapEff: ${DEFAULT_CAPS}`, 'NoNewPrivs: 1', '0']);
  });
});
