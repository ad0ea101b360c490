/**
 * Commands started from inside: each sandbox's pid 1 is its exec server (tools/sandbox-init/exec-server.h,
 * docs/exec-server.md). What it starts ends with exactly the isolation a command entered through
 * sap-sandbox-enter gets; and the sandbox, as root in it, attacks it: signals, ptrace, its
 * descriptors, the host's socket, a fork bomb. The host stays up and every other sandbox's exec works.
 */
import { readFileSync } from 'node:fs';
import type { Socket } from 'node:net';
import type { ExecChannels } from '../../../sandbox/namespaces/exec-channel';
import { DEFAULT_POOL_SIZE } from '../../../sandbox/namespaces/init-helpers';
import { eventually } from '../../helpers/env';
import { pidsOfCgroup, providerRun, readySpares, startTestHost, stopTestHost, type TestHost } from '../../helpers/sandbox-host';

/** What a process's isolation is, read from inside: the fields of /proc/self/status that say it, and the rest. */
const PROBE = [
  'grep -E "^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp|Seccomp_filters|SigBlk|SigIgn):" /proc/self/status',
  'echo oom $(cat /proc/self/oom_score_adj)',
  'for n in user mnt pid net ipc uts cgroup; do echo ns $n $(readlink /proc/self/ns/$n); done',
  'cat /proc/self/cgroup | sort',
  'cat /proc/self/limits',
  'echo cwd $(pwd)',
  'env | grep -v "^_=" | sort',
].join('; ');

describe('exec server (commands started by the sandbox pid 1)', () => {
  let t: TestHost;
  let n = 0;
  const newId = () => `sb-xs${process.pid}-${++n}`;
  const channels = () => (t.host.provider as unknown as { execChannels: ExecChannels }).execChannels;

  beforeAll(async () => {
    t = await startTestHost();
  });

  afterAll(async () => {
    await stopTestHost(t);
  });

  it.each([['root'], ['sandbox']] as const)('starts commands as %s with the isolation sap-sandbox-enter gives them', async (user) => {
    const id = newId();
    await t.client.createSandbox({ id, orgId: 'o', user });
    expect(await channels().stateOf(id)).toEqual({ usable: true, running: 0, closedReason: null });
    const inside = await t.client.execRun(id, { cmd: 'bash', args: ['-c', `${PROBE}; echo ppid $PPID`] });
    const entered = await providerRun(t.host.provider, id, ['bash', '-c', `${PROBE}; echo ppid $PPID`]);
    expect(inside.exitCode).toBe(0);
    expect(entered.code).toBe(0);
    // From its exec server (pid 1 of the sandbox), not from a helper outside it (pid 0 seen from inside).
    expect(inside.stdout).toContain('ppid 1\n');
    expect(entered.stdout).toContain('ppid 0\n');
    const strip = (s: string) => s.replace(/^ppid \d+\n/m, '');
    expect(strip(inside.stdout)).toBe(strip(entered.stdout));
    // and that isolation is what docs/isolation.md says
    expect(inside.stdout).toMatch(/^Seccomp:\s+2$/m);
    expect(inside.stdout).toMatch(/^oom 500$/m);
    expect(inside.stdout).toMatch(user === 'root' ? /^NoNewPrivs:\s+1$/m : /^NoNewPrivs:\s+0$/m);
    expect(inside.stdout).toMatch(user === 'root' ? /^CapEff:\s+00000000a80425fb$/m : /^CapEff:\s+0000000000000000$/m);
  });

  it('runs stdin, exit codes, signals, a working directory and a missing program as before', async () => {
    const id = newId();
    await t.client.createSandbox({ id, orgId: 'o' });
    expect(await t.client.execRun(id, { cmd: 'bash', args: ['-c', 'cat; pwd; echo e >&2; exit 3'], stdin: 'in\n', cwd: '/tmp' })).toEqual({
      exitCode: 3,
      signal: null,
      timedOut: false,
      stdout: 'in\n/tmp\n',
      stderr: 'e\n',
    });
    expect(await t.client.execRun(id, { cmd: 'bash', args: ['-c', 'kill -USR1 $$'] })).toMatchObject({ exitCode: 138, signal: 'SIGUSR1' });
    expect(await t.client.execRun(id, { cmd: 'no-such-program-here' })).toMatchObject({ exitCode: 127 });
    expect(await t.client.execRun(id, { cmd: 'true', cwd: '/no/such/dir' })).toMatchObject({ exitCode: 125 });
    expect(await t.client.execRun(id, { cmd: 'sleep', args: ['30'], timeout: 1 })).toMatchObject({ timedOut: true, exitCode: 137, signal: 'SIGKILL' });
    // A large stdin and output pass the credit windows intact.
    const big = 'x'.repeat(3 * 1024 * 1024);
    const r = await t.client.execRun(id, { cmd: 'bash', args: ['-c', 'wc -c; head -c 700000 /dev/zero | tr "\\0" y'], stdin: big });
    expect(r.stdout).toBe(`${big.length}\n${'y'.repeat(700000)}`);
    expect((await channels().stateOf(id))?.running).toBe(0);
  });

  it('cannot be killed, traced or reached from inside; exec goes on working', async () => {
    const id = newId();
    const other = newId();
    await t.client.createSandbox({ id, orgId: 'o', user: 'root' });
    await t.client.createSandbox({ id: other, orgId: 'o' });
    const attack = [
      'for s in KILL TERM HUP INT STOP SEGV; do kill -$s 1 && echo sent $s; done',
      // its descriptors (the channel) and memory: ptrace access is refused
      'ls /proc/1/fd >/dev/null 2>&1 && echo fds-listed',
      'cat /proc/1/environ >/dev/null 2>&1 && echo environ-read',
      'exec 9</proc/1/fd/3 2>/dev/null && echo channel-opened',
      `python3 -c 'import ctypes; l=ctypes.CDLL(None, use_errno=True); print("ptrace", l.ptrace(16, 1, 0, 0), ctypes.get_errno())'`,
      // the host's socket: not in the sandbox's network namespace, nor at its path
      'grep -c init.sock /proc/net/unix',
      `test -e ${t.dataDir}/init.sock && echo socket-visible`,
      'echo done',
    ].join('; ');
    const r = await t.client.execRun(id, { cmd: 'bash', args: ['-c', attack] });
    expect(r.stdout).not.toMatch(/fds-listed|environ-read|channel-opened|socket-visible/);
    expect(r.stdout).toMatch(/^ptrace -1 1$/m); // EPERM
    expect(r.stdout).toMatch(/^0\ndone\n$/m);
    // Every other process of the sandbox but pid 1 killed from inside: the run ends (the sleep held its output).
    expect(await t.client.execRun(id, { cmd: 'bash', args: ['-c', 'sleep 100 & kill -9 -1; echo survived'] })).toMatchObject({
      exitCode: 0,
      stdout: 'survived\n',
    });
    expect(await t.client.execRun(id, { cmd: 'echo', args: ['alive'] })).toMatchObject({ exitCode: 0, stdout: 'alive\n' });
    expect(await channels().stateOf(id)).toMatchObject({ usable: true });
    expect(await t.client.execRun(other, { cmd: 'echo', args: ['other'] })).toMatchObject({ stdout: 'other\n' });
  });

  it('a fork bomb stops at its limit; the other sandbox execs meanwhile and its own again afterwards', async () => {
    const id = newId();
    const other = newId();
    await t.client.createSandbox({ id, orgId: 'o', user: 'root' });
    await t.client.createSandbox({ id: other, orgId: 'o' });
    const bomb = await t.client.createExec(id, { cmd: 'bash', args: ['-c', 'b() { b | b & }; b; sleep 60'], timeout: 5 });
    // While it is at its limit: another sandbox's exec works
    for (let k = 0; k < 3; k++) expect(await t.client.execRun(other, { cmd: 'echo', args: [`ok ${k}`] })).toMatchObject({ stdout: `ok ${k}\n` });
    const done = await t.client.execResult(id, bomb.sessionID, { waitMs: 30_000 });
    expect(done).toMatchObject({ running: false, timedOut: true });
    // Its whole group was killed at the timeout: the sandbox execs again.
    expect(await t.client.execRun(id, { cmd: 'echo', args: ['back'] })).toMatchObject({ exitCode: 0, stdout: 'back\n' });
    expect(await channels().stateOf(id)).toMatchObject({ usable: true });
  });

  it('a spare made whole ahead (its pid 1 forked before the claim) serves exec from that pid 1, at the normal priority once claimed', async () => {
    // The whole pool ready: the claim takes one of these.
    const spares = await eventually(async () => (readySpares().length === DEFAULT_POOL_SIZE ? readySpares().map((n) => pidsOfCgroup(n)) : null), 30_000, 20);
    // Idle: each spare's helper and pid 1 at nice 10, pid 1 already serving (its channel held by the host since it was made).
    const nice = (pid: string | undefined) => readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')[16];
    for (const pids of spares) expect(pids.map(nice)).toEqual(['10', '10']);
    const id = newId();
    await t.client.createSandbox({ id, orgId: 'o' });
    // One of those spares, claimed (the pool's oldest ready one).
    expect(spares.find(([helper]) => pidsOfCgroup(id).includes(helper!))).toBeDefined();
    expect(await channels().stateOf(id)).toEqual({ usable: true, running: 0, closedReason: null });
    // From pid 1, which (like the command) runs at nice 0 by the time any command can start.
    const r = await t.client.execRun(id, { cmd: 'bash', args: ['-c', 'echo $PPID; cut -d" " -f19 /proc/1/stat; cut -d" " -f19 /proc/self/stat; hostname'] });
    expect(r).toMatchObject({ exitCode: 0, stdout: `1\n0\n0\n${id}\n` });
  });

  it('a create of another disk size starts a helper of its own (the spares it discards close their channels), served by its pid 1 too', async () => {
    await eventually(async () => readySpares().length >= 1, 30_000, 20);
    const spares = new Set(readySpares().flatMap((n) => pidsOfCgroup(n)));
    // The channels the host holds for its ready spares (each made whole, pid 1 serving since).
    const pool = (t.host.provider as unknown as { helpers: { pool: { ready: boolean; exec?: Promise<Socket | null> | null }[] } }).helpers.pool;
    const held = (await Promise.all(pool.filter((sp) => sp.ready).map((sp) => sp.exec))).filter((sock): sock is Socket => !!sock);
    const id = newId();
    await t.client.createSandbox({ id, orgId: 'o', diskMB: 300 });
    expect(pidsOfCgroup(id).some((p) => spares.has(p))).toBe(false);
    expect(await channels().stateOf(id)).toEqual({ usable: true, running: 0, closedReason: null });
    expect(await t.client.execRun(id, { cmd: 'bash', args: ['-c', 'echo $PPID'] })).toMatchObject({ exitCode: 0, stdout: '1\n' });
    // The spares it discarded: the channels the host held for them are closed.
    expect(held.length).toBeGreaterThan(0);
    await eventually(async () => held.every((sock) => sock.destroyed), 30_000, 20);
  });

  it('once its channel is gone, running commands are hung up and later ones start through sap-sandbox-enter', async () => {
    const id = newId();
    await t.client.createSandbox({ id, orgId: 'o' });
    const running = await t.client.createExec(id, { cmd: 'sleep', args: ['300'] });
    (await channels().usable(id))!.close();
    expect(await t.client.execResult(id, running.sessionID, { waitMs: 20_000 })).toMatchObject({ running: false, exitCode: 129 });
    expect(await channels().stateOf(id)).toBeNull(); // forgotten once closed
    // PPid 0: entered from outside, as before the exec server
    expect(await t.client.execRun(id, { cmd: 'bash', args: ['-c', 'echo $PPID'] })).toMatchObject({ exitCode: 0, stdout: '0\n' });
  });
});
