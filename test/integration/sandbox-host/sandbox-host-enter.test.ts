/**
 * The sandbox host against real sandboxes: every process that enters a sandbox (exec, patches,
 * entrypoints) goes through sap-sandbox-enter: exits and signals, environment, capabilities,
 * seccomp, namespaces, timeouts. Needs root, overlayfs and cgroup v1 (the machine described in TOOLCHAIN.md).
 */
import { promises as fsp, existsSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { HostClient } from '../../../sandbox/host-contract/client';
import { startHost, type RunningHost } from '../../../sandbox/host/server';
import { createSandboxProvider } from '../../../sandbox/factory';
import { eventually } from '../../helpers/env';
import { DEFAULT_CAPS, ENTER_HELPER, TOKEN, pidsOfCgroup, providerRun } from '../../helpers/sandbox-host';

// Every process that enters a sandbox (exec, patches, entrypoints) goes through sap-sandbox-enter.
describe.each([['sap-sandbox-enter', undefined, 'sap-sandbox-ent']] as const)('entering a sandbox through %s', (_name, enterHelper, comm) => {
  let dataDir: string;
  let host: RunningHost;
  let client: HostClient;
  let n = 0;
  const newId = () => `sb-eh${process.pid}-${++n}`;
  const start = async () => {
    const provider = createSandboxProvider({ kind: 'namespaces', dataDir, hostId: 'test-host-enter', enterHelper, network: null });
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', provider });
    client = new HostClient({ url: host.url, token: TOKEN });
  };

  beforeAll(async () => {
    if (enterHelper === undefined) expect(existsSync(ENTER_HELPER)).toBe(true);
    dataDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-host-enter-'));
    await start();
  });

  afterAll(async () => {
    for (const sb of await client.listSandboxes()) await client.destroySandbox(sb.id);
    await host.close();
    await fsp.rm(dataDir, { recursive: true, force: true });
  });

  it('passes exit codes and signals, runs in the given directory, reports missing programs', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', patches: [{ id: 'pa-1', script: 'mkdir -p /srv/here && echo patched' }] });
    const r = await providerRun(host.provider, id, ['/bin/sh', '-c', 'pwd; echo out; echo err >&2; exit 42'], { cwd: '/srv/here' });
    expect(r).toMatchObject({ code: 42, signal: null, stdout: '/srv/here\nout\n', stderr: 'err\n', comm });
    expect(await providerRun(host.provider, id, ['/bin/sh', '-c', 'kill -USR1 $$'])).toMatchObject({ code: null, signal: 'SIGUSR1' });
    const missing = await providerRun(host.provider, id, ['no-such-program-here']);
    expect(missing.code).toBe(127);
    expect(missing.stderr).toContain('no-such-program-here');
    expect((await providerRun(host.provider, id, ['/etc/passwd'])).code).toBe(126);
    expect((await providerRun(host.provider, id, ['true'], { cwd: '/no/such/dir' })).code).toBe(125);
    expect((await providerRun(host.provider, id, ['cat'])).stdout).toBe('');
  });

  it('delivers a signal sent to the process group of an exec once', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o' });
    const child = host.provider.spawn(id, { argv: ['bash', '-c', 'trap "echo got-term; exit 3" TERM; echo ready; sleep 30 & wait'] });
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    await eventually(async () => out === 'ready\n', 5000, 10);
    const closed = new Promise<[number | null, string | null]>((r) => child.on('close', (code, signal) => r([code, signal])));
    process.kill(-child.pid!, 'SIGTERM');
    const [code, signal] = await closed;
    expect(out).toBe('ready\ngot-term\n');
    // nsenter dies of the signal itself; the helper waits for the command and reports its status.
    if (enterHelper === undefined) expect([code, signal]).toEqual([3, null]);
    else expect(signal).toBe('SIGTERM');
    // A signal sent at once, while the process is still entering the sandbox, is not lost either.
    for (let i = 0; i < 20; i++) {
      const early = host.provider.spawn(id, { argv: ['sleep', '30'] });
      const ended = new Promise<[number | null, string | null]>((r) => early.on('close', (c, s) => r([c, s])));
      process.kill(-early.pid!, 'SIGTERM');
      // Ended by the signal (a lost one would let sleep run its 30 s and exit 0).
      const [c, s] = await ended;
      expect(c === 143 || s === 'SIGTERM').toBe(true);
    }
    await host.provider.destroy(id);
  });

  it("gives exactly the environment asked for, a container root's capabilities, seccomp, and the sandbox's pid namespace and cgroups", async () => {
    const a = newId();
    const b = newId();
    process.env.SAP_HOST_ONLY = 'leak';
    await client.createSandbox({ id: a, orgId: 'o', envs: { FROM_SANDBOX: 's', LANG: 'C' }, entrypoint: { argv: ['sleep', '123'] } });
    await client.createSandbox({ id: b, orgId: 'o', entrypoint: { argv: ['sleep', '456'] } });
    const env = await providerRun(host.provider, a, ['/usr/bin/env'], { env: { MINE: 'a=b c', FROM_SANDBOX: 'overridden' } });
    delete process.env.SAP_HOST_ONLY;
    expect(env.stdout.split('\n').filter(Boolean).sort()).toEqual(
      [
        'FROM_SANDBOX=overridden',
        `HOSTNAME=${a}`,
        'HOME=/root',
        'LANG=C',
        // Who it runs as (a sandbox-user sandbox gets sandbox and its HOME: sandbox-host-user.test.ts).
        'LOGNAME=root',
        'USER=root',
        'MINE=a=b c',
        'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
        'TERM=xterm',
      ].sort(),
    );
    const caps = await providerRun(host.provider, a, ['grep', 'Cap', '/proc/self/status']);
    // Inheritable, permitted, effective, bounding: a container root's set; ambient: none. Seccomp on, no_new_privs.
    expect(
      caps.stdout
        .trim()
        .split('\n')
        .map((l) => l.split(':\t')[1]),
    ).toEqual([...Array(4).fill(DEFAULT_CAPS), '0000000000000000']);
    const status = (await providerRun(host.provider, a, ['cat', '/proc/self/status'])).stdout;
    expect(status).toMatch(/^NoNewPrivs:\t1$/m);
    expect(status).toMatch(/^Seccomp:\t2$/m);
    const seen = await providerRun(host.provider, a, ['ps', '-eo', 'args']);
    expect(seen.stdout).toContain('sleep 123');
    expect(seen.stdout).not.toContain('sleep 456');
    expect(seen.stdout).not.toContain('jest');
    // Every process entered joins the same pid namespace, not the host's. (pid 1 is the host's helper:
    // not dumpable, so the sandbox cannot read its /proc/1/ns.)
    const nsSelf = (await providerRun(host.provider, a, ['readlink', '/proc/self/ns/pid'])).stdout.trim();
    const nsAgain = (await providerRun(host.provider, a, ['readlink', '/proc/self/ns/pid'])).stdout.trim();
    expect(nsSelf).toMatch(/^pid:\[\d+\]$/);
    expect(nsSelf).toBe(nsAgain);
    expect(nsSelf).not.toBe(await fsp.readlink('/proc/self/ns/pid'));
    expect((await providerRun(host.provider, a, ['readlink', '/proc/1/ns/pid'])).code).not.toBe(0);
    // Inside its cgroup namespace, the sandbox's own cgroups are the root.
    const cgroups = (await providerRun(host.provider, a, ['cat', '/proc/self/cgroup'])).stdout;
    expect(cgroups).toMatch(/:pids:\/\n/);
    expect(cgroups).toMatch(/:memory:\/\n/);
    // On the host: the process and what it starts are in the sandbox's cgroups.
    const child = host.provider.spawn(a, { argv: ['sleep', '30'] });
    const cmdline = (pid: string) => {
      try {
        return require('node:fs').readFileSync(`/proc/${pid}/cmdline`, 'utf8') as string;
      } catch {
        return '';
      }
    };
    const sleeper = await eventually(async () => pidsOfCgroup(a).find((p) => cmdline(p) === 'sleep\u000030\u0000'), 5000, 20);
    for (const c of ['pids', 'memory', 'cpu', 'freezer']) {
      expect(pidsOfCgroup(a, c)).toContain(String(child.pid));
      expect(pidsOfCgroup(a, c)).toContain(sleeper);
    }
    process.kill(-child.pid!, 'SIGKILL');
    await new Promise((r) => child.on('close', r));
  });

  it('kills an entrypoint at its timeout: 124 after SIGTERM, 137 when SIGKILL was needed', async () => {
    const soft = newId();
    const hard = newId();
    await client.createSandbox({ id: soft, orgId: 'o', entrypoint: { argv: ['bash', '-c', 'sleep 30 & wait'], timeoutSeconds: 1 } });
    await client.createSandbox({ id: hard, orgId: 'o', entrypoint: { argv: ['bash', '-c', 'trap "" TERM; sleep 30; sleep 30'], timeoutSeconds: 1 } });
    expect(await client.entrypointStatus(soft, { waitMs: 5000 })).toMatchObject({ state: 'exited', timedOut: true, exitCode: 124, signal: 'SIGTERM' });
    // The timeout signals the command's whole process group: its sleep is gone too.
    expect((await providerRun(host.provider, soft, ['/bin/sh', '-c', 'ps -eo args | grep -c "^sleep 30"'])).stdout.trim()).toBe('0');
    expect(await client.entrypointStatus(hard, { waitMs: 10000 })).toMatchObject({ state: 'exited', timedOut: true, exitCode: 137 });
    const quick = newId();
    await client.createSandbox({ id: quick, orgId: 'o', entrypoint: { argv: ['bash', '-c', 'kill -TERM $$'], timeoutSeconds: 5 } });
    expect(await client.entrypointStatus(quick, { waitMs: 5000 })).toMatchObject({ state: 'exited', timedOut: false, exitCode: 143, signal: 'SIGTERM' });
  }, 30_000);

  it("records the entrypoint's exit in its file while the host is down", async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', envs: { X: 'x' }, entrypoint: { argv: ['bash', '-c', 'sleep 1; echo "$X $(pwd)"; exit 5'], cwd: '/tmp' } });
    await host.close();
    const exitFile = path.join(dataDir, 'sandboxes', id, 'entrypoint.exit');
    await eventually(async () => existsSync(exitFile) && (await fsp.readFile(exitFile, 'utf8')) === '5\n', 10_000, 50);
    await start();
    expect(await client.entrypointStatus(id)).toMatchObject({ state: 'exited', exitCode: 5, timedOut: false });
    expect((await client.entrypointOutput(id)).toString()).toBe('x /tmp\n');
  });

  if (enterHelper === undefined) {
    it("forwards SIGTERM sent to the entrypoint's helper to the entrypoint", async () => {
      const id = newId();
      await client.createSandbox({ id, orgId: 'o', entrypoint: { argv: ['bash', '-c', 'trap "echo got-term; exit 3" TERM; echo ready; sleep 30 & wait'] } });
      const st = await client.entrypointStatus(id);
      expect(st.state).toBe('running');
      await eventually(async () => (await client.entrypointOutput(id)).toString() === 'ready\n', 5000, 20);
      process.kill((st as { pid: number }).pid, 'SIGTERM');
      expect(await client.entrypointStatus(id, { waitMs: 5000 })).toMatchObject({ state: 'exited', exitCode: 3 });
      expect((await client.entrypointOutput(id)).toString()).toBe('ready\ngot-term\n');
    });
  }
});
