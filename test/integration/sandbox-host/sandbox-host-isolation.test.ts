/**
 * The sandbox host against real sandboxes: what a sandbox sees (its own machine, its own processes,
 * no host files), limits through cgroups, destroying, bursts, patches, spare init helpers.
 * Needs root, overlayfs and cgroup v1 (the machine described in TOOLCHAIN.md).
 */
import { promises as fsp, existsSync } from 'node:fs';
import * as path from 'node:path';
import { HostClient, HostError } from '../../../sandbox/host-contract/client';
import type { RunningHost } from '../../../sandbox/host/server';
import { eventually } from '../../helpers/env';
import { DEFAULT_POOL_SIZE } from '../../../sandbox/namespaces/init-helpers';
import { DEFAULT_CAPS, hostMountsOf, isRunning, pidsOfCgroup, providerSh, readySpares, startTestHost, stopTestHost } from '../../helpers/sandbox-host';

describe('sandbox host (namespaces): isolation and limits', () => {
  let dataDir: string;
  let host: RunningHost;
  let client: HostClient;
  let n = 0;
  const newId = () => `sb-ti${process.pid}-${++n}`;

  beforeAll(async () => {
    ({ dataDir, host, client } = await startTestHost());
  });
  // The host as it is at the end (a test may have restarted it).
  afterAll(() => stopTestHost(host && { dataDir, host, client }));

  it('gives bash, node and python3 a small machine of their own, with no host files in sight', async () => {
    const id = newId();
    await fsp.writeFile(path.join(dataDir, 'host-secret'), 'TOPSECRET');
    await client.createSandbox({ id, orgId: 'o' });
    const r = await providerSh(
      host.provider,
      id,
      [
        'echo "bash $BASH_VERSION"',
        'node -e "console.log(\'node\', process.version)"',
        'python3 -c "import sys; print(\'python\', sys.version_info[0])"',
        'hostname',
        `cat ${dataDir}/host-secret 2>/dev/null || echo no-datadir`,
        'ls /work 2>/dev/null || echo no-work',
        'head -c 5 /etc/shadow 2>/dev/null; grep -c . /etc/shadow',
        'ls -A /root | wc -l',
        'ls -A /home',
        'ip -o link 2>/dev/null | wc -l || cat /proc/net/dev | tail -n +3 | wc -l',
      ].join('; '),
    );
    expect(r.stderr).toBe('');
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^bash 5/);
    expect(lines[1]).toMatch(/^node v\d+/);
    expect(lines[2]).toBe('python 3');
    expect(lines[3]).toBe(id);
    // /etc/shadow is the base skeleton's (root, sandbox and nobody, no passwords), not the host's; /home holds the sandbox user's only.
    expect(lines.slice(4, 9)).toEqual(['no-datadir', 'no-work', 'root:3', '0', 'sandbox']);
    expect(lines[9]).toBe('1'); // loopback only (this file's hosts run with the network off: the stack's host owns the machine's sandbox network)
  });

  it('shows each sandbox only its own processes', async () => {
    const a = newId();
    const b = newId();
    await client.createSandbox({ id: a, orgId: 'o', entrypoint: { argv: ['sleep', '123'] } });
    await client.createSandbox({ id: b, orgId: 'o', entrypoint: { argv: ['sleep', '456'] } });
    const psA = await providerSh(host.provider, a, 'ps -eo args');
    const psB = await providerSh(host.provider, b, 'ls /proc | grep -c "^[0-9]"; ps -eo args');
    expect(psA.stdout).toContain('sleep 123');
    expect(psA.stdout).not.toContain('sleep 456');
    expect(psB.stdout).toContain('sleep 456');
    expect(psB.stdout).not.toContain('sleep 123');
    expect(psB.stdout).not.toContain('jest');
    expect(Number(psB.stdout.split('\n')[0])).toBeLessThan(10);
  });

  it('keeps writes to /usr inside the sandbox and forbids mounting', async () => {
    const a = newId();
    const b = newId();
    await client.createSandbox({ id: a, orgId: 'o' });
    await client.createSandbox({ id: b, orgId: 'o' });
    const marker = `sap-marker-${process.pid}`;
    const w = await providerSh(host.provider, a, `echo mine > /usr/bin/${marker} && cat /usr/bin/${marker} && rm /usr/bin/env.not-there 2>/dev/null; echo ok`);
    expect(w.stdout).toBe('mine\nok\n');
    expect(existsSync(`/usr/bin/${marker}`)).toBe(false);
    // The writable layer (an ext4 image on a loop device) is mounted in the mount namespace of the sandbox's init helper.
    const outer = JSON.parse(await fsp.readFile(path.join(dataDir, 'sandboxes', a, 'state.json'), 'utf8')).init.outer.pid;
    expect(existsSync(path.join(`/proc/${outer}/root`, dataDir, 'sandboxes', a, 'm', 'w', 'usr', 'bin', marker))).toBe(true);
    expect((await providerSh(host.provider, b, `test -e /usr/bin/${marker}; echo $?`)).stdout).toBe('1\n');
    const m = await providerSh(host.provider, a, 'mount -t tmpfs x /mnt; echo "rc=$?"; grep Cap /proc/self/status');
    expect(m.stdout).toMatch(/rc=(32|1)\b/);
    expect(m.stderr).toMatch(/permission denied|must be superuser|Operation not permitted/i);
    // Root's capabilities are a container's default set, inside its user namespace only (no CAP_SYS_ADMIN).
    expect(m.stdout).toContain(`CapEff:\t${DEFAULT_CAPS}`);
    expect(m.stdout).toContain(`CapBnd:\t${DEFAULT_CAPS}`);
  });

  it('applies memory and process limits through cgroups', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', memoryMB: 64, maxProcesses: 50, cpuCount: 1 });
    const cg = (c: string, f: string) => require('node:fs').readFileSync(`/sys/fs/cgroup/${c}/sap/${id}/${f}`, 'utf8').trim();
    expect(cg('memory', 'memory.limit_in_bytes')).toBe(String(64 * 1024 * 1024));
    expect(cg('pids', 'pids.max')).toBe('50');
    expect(cg('cpu', 'cpu.cfs_quota_us')).toBe('100000');
    const script = [
      'import subprocess',
      'procs = []',
      'try:',
      '    for i in range(80): procs.append(subprocess.Popen(["sleep", "5"]))',
      'except OSError as e: print("refused", e.errno)',
      'print("started", len(procs))',
      'for p in procs: p.kill()',
    ].join('\n');
    const r = await providerSh(host.provider, id, `python3 -c '${script}'`);
    expect(r.stdout).toMatch(/refused 11\nstarted 4\d\n/);
  });

  it('destroys everything: processes, mounts, directory and cgroups', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', entrypoint: { argv: ['bash', '-c', 'sleep 300 & sleep 300'] } });
    const child = host.provider.spawn(id, { argv: ['sleep', '301'] });
    // Helpers join the cgroups themselves, just after they were started.
    const pids = await eventually(async () => (pidsOfCgroup(id).length >= 5 ? pidsOfCgroup(id) : null), 10_000, 20);
    expect(await client.destroySandbox(id)).toBe(true);
    expect(await client.destroySandbox(id)).toBe(false);
    expect(await client.getSandbox(id)).toBeNull();
    for (const pid of pids) expect(isRunning(Number(pid))).toBe(false);
    expect(existsSync(path.join(dataDir, 'sandboxes', id))).toBe(false);
    expect(await fsp.readFile('/proc/mounts', 'utf8')).not.toContain(id);
    expect(hostMountsOf(id)).toEqual([]);
    expect(existsSync(`/sys/fs/cgroup/pids/sap/${id}`)).toBe(false);
    expect(existsSync(`/sys/fs/cgroup/memory/sap/${id}`)).toBe(false);
    child.kill();
  });

  it('creates many at once (most without a spare ready), each isolated, each destroyed cleanly', async () => {
    const ids = Array.from({ length: 8 }, () => newId());
    await Promise.all(ids.map((id) => client.createSandbox({ id, orgId: 'o', maxProcesses: 40 })));
    // Whichever way each started (spare or not), none is in the host's mount table.
    expect(ids.flatMap(hostMountsOf)).toEqual([]);
    for (const id of ids) {
      const r = await providerSh(host.provider, id, 'hostname; ls /proc | grep -c "^[0-9]"');
      expect(r.stdout.split('\n')[0]).toBe(id);
      // Its own pid namespace: its init, the shell and ls, nothing of the other sandboxes.
      expect(Number(r.stdout.split('\n')[1])).toBeLessThan(6);
      expect(pidsOfCgroup(id).length).toBeGreaterThanOrEqual(1);
    }
    await Promise.all(ids.map((id) => client.destroySandbox(id)));
    const mounts = await fsp.readFile('/proc/mounts', 'utf8');
    for (const id of ids) {
      expect(mounts).not.toContain(id);
      expect(existsSync(path.join(dataDir, 'sandboxes', id))).toBe(false);
      expect(existsSync(`/sys/fs/cgroup/pids/sap/${id}`)).toBe(false);
    }
  });

  it('runs patches in order and names the one that fails', async () => {
    const id = newId();
    const info = await client.createSandbox({
      id,
      orgId: 'o',
      patches: [
        { id: 'pa-1', script: 'echo one >> /workspace/order' },
        { id: 'pa-2', script: 'echo two >> /workspace/order; echo done-two' },
      ],
    });
    expect(info.patches).toEqual([
      { id: 'pa-1', exitCode: 0, outputTail: '' },
      { id: 'pa-2', exitCode: 0, outputTail: 'done-two\n' },
    ]);
    expect((await client.readFile(id, '/workspace/order'))?.toString()).toBe('one\ntwo\n');

    const bad = newId();
    const err = await client
      .createSandbox({
        id: bad,
        orgId: 'o',
        patches: [
          { id: 'pa-ok', script: 'true' },
          { id: 'pa-bad', script: 'echo broken; exit 3' },
        ],
      })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(HostError);
    expect(err).toMatchObject({ type: 'patch_failed' });
    expect((err as Error).message).toContain('pa-bad');
    expect((err as Error).message).toContain('broken');
    expect(await client.getSandbox(bad)).toBeNull();
    expect(existsSync(path.join(dataDir, 'sandboxes', bad))).toBe(false);

    // keepOnPatchFailure: the chain stops at the failing patch; the sandbox runs with the patches before it.
    const kept = newId();
    const k = await client.createSandbox({
      id: kept,
      orgId: 'o',
      keepOnPatchFailure: true,
      patches: [
        { id: 'pa-ok', script: 'echo ok >> /workspace/order' },
        { id: 'pa-bad', script: 'echo broken; exit 3' },
        { id: 'pa-after', script: 'echo after >> /workspace/order' },
      ],
    });
    expect(k.patches).toEqual([
      { id: 'pa-ok', exitCode: 0, outputTail: '' },
      { id: 'pa-bad', exitCode: 3, outputTail: 'broken\n' },
    ]);
    expect((await client.readFile(kept, '/workspace/order'))?.toString()).toBe('ok\n');
    await client.destroySandbox(kept);

    // A patch that never ends is killed after SANDBOX_PATCH_TIMEOUT_S: exit 124, and the chain stops there.
    const slow = newId();
    process.env.SANDBOX_PATCH_TIMEOUT_S = '1';
    try {
      const sl = await client.createSandbox({
        id: slow,
        orgId: 'o',
        keepOnPatchFailure: true,
        patches: [
          { id: 'pa-hang', script: 'echo start; sleep 600 & sleep 600' },
          { id: 'pa-never', script: 'echo never > /workspace/never' },
        ],
      });
      expect(sl.patches).toEqual([{ id: 'pa-hang', exitCode: 124, outputTail: expect.stringMatching(/^start\n[\s\S]*longer than 1 s/) }]);
      expect(await client.readFile(slow, '/workspace/never').catch(() => null)).toBeNull();
    } finally {
      delete process.env.SANDBOX_PATCH_TIMEOUT_S;
      await client.destroySandbox(slow);
    }
  });

  it("starts the next init ahead: its cgroups become the new sandbox's, with its limits", async () => {
    const [spare] = await eventually(async () => (readySpares().length >= 1 ? readySpares() : null), 10_000, 20);
    const [helper] = pidsOfCgroup(spare!);
    // Started by the spawner (posix_spawn), not forked by the host; it reached the host over init.sock.
    const ppid = (pid: string | number) => Number(/^PPid:\s+(\d+)/m.exec(require('node:fs').readFileSync(`/proc/${pid}/status`, 'utf8'))![1]);
    expect(ppid(helper!)).not.toBe(process.pid);
    expect(require('node:fs').readFileSync(`/proc/${ppid(helper!)}/cmdline`, 'utf8')).toContain('spawner.py');
    expect(existsSync(path.join(dataDir, 'init.sock'))).toBe(true);
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', memoryMB: 48, maxProcesses: 30 });
    expect(existsSync(`/sys/fs/cgroup/pids/sap/${spare}`)).toBe(false);
    for (const c of ['memory', 'pids', 'cpu', 'freezer']) expect(pidsOfCgroup(id, c)).toContain(helper);
    const cg = (c: string, f: string) => require('node:fs').readFileSync(`/sys/fs/cgroup/${c}/sap/${id}/${f}`, 'utf8').trim();
    expect(cg('memory', 'memory.limit_in_bytes')).toBe(String(48 * 1024 * 1024));
    expect(cg('pids', 'pids.max')).toBe('30');
    expect((await providerSh(host.provider, id, 'hostname; grep CapEff /proc/self/status')).stdout).toBe(`${id}\nCapEff:\t${DEFAULT_CAPS}\n`);
    // The helper stays as the keeper of the sandbox's mounts, and the pool refills to its size.
    expect(require('node:fs').readFileSync(`/proc/${helper}/comm`, 'utf8').trim()).toBe('sap-sandbox-ini');
    await eventually(async () => readySpares().length === DEFAULT_POOL_SIZE && !readySpares().includes(spare!), 10_000, 20);
  });
});
