/**
 * The sandbox host against real bubblewrap sandboxes: isolation, limits, entrypoints, patches, restarts.
 * Needs root, the sandbox helpers, overlayfs and cgroup v1 (the machine described in TOOLCHAIN.md).
 */
import { promises as fsp, existsSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { HostClient, HostError } from '../../sandbox/host-contract/client';
import { startHost, type RunningHost } from '../../sandbox/host/server';
import type { SandboxProvider } from '../../sandbox/driver';
import { createSandboxProvider } from '../../sandbox/factory';
import { eventually } from '../helpers/env';

/** CapEff of sandbox root: Docker's default set (CHOWN … SETFCAP), inside the sandbox's user namespace. */
const DEFAULT_CAPS = '00000000a80425fb';
const TOKEN = 'test-token-' + Math.random().toString(36).slice(2);

/** Runs a bash script inside a live sandbox through the provider. */
function sh(provider: SandboxProvider, id: string, script: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = provider.spawn(id, { argv: ['/bin/bash', '-c', script] });
    let stdout = '';
    let stderr = '';
    child.stdin?.end();
    child.stdout?.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

const p50 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

function pidsOfCgroup(id: string, controller = 'pids'): string[] {
  const f = `/sys/fs/cgroup/${controller}/sap/${id}/cgroup.procs`;
  return existsSync(f) ? require('node:fs').readFileSync(f, 'utf8').split('\n').filter(Boolean) : [];
}

/** The host's mount table lines that mention `id` (a sandbox of the init helper has none, ever). */
function hostMountsOf(id: string): string[] {
  return require('node:fs').readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l: string) => l.includes(id));
}

/** The sandbox's init (pid 1 of its namespaces) from its state.json. */
async function initPid(dataDir: string, id: string): Promise<number> {
  const state = JSON.parse(await fsp.readFile(path.join(dataDir, 'sandboxes', id, 'state.json'), 'utf8'));
  return state.init.ns.pid as number;
}

/** Cgroups (pids controller) of this process's spare init helpers that have joined them. */
function readySpares(): string[] {
  const names: string[] = require('node:fs').readdirSync('/sys/fs/cgroup/pids/sap');
  return names.filter((n) => n.startsWith(`spare-${process.pid}-`) && pidsOfCgroup(n).length === 1);
}

/** True while the process exists and is not a zombie (it may vanish between two looks). */
function isRunning(pid: number): boolean {
  try {
    return !/\) [ZX] /.test(require('node:fs').readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

/** SIGKILLs each process; one already gone (the init's death takes its namespace along) is fine. */
function killAllOf(pids: (number | string)[]): void {
  for (const pid of pids) {
    try {
      process.kill(Number(pid), 'SIGKILL');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
    }
  }
}

describe('sandbox host (namespaces)', () => {
  let dataDir: string;
  let host: RunningHost;
  let client: HostClient;
  let n = 0;
  const newId = () => `sb-t${process.pid}-${++n}`;

  beforeAll(async () => {
    dataDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-host-'));
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', network: null, hostId: 'test-host' });
    client = new HostClient({ url: host.url, token: TOKEN });
  });

  afterAll(async () => {
    for (const sb of await client.listSandboxes()) await client.destroySandbox(sb.id);
    const scratch = (host.provider as unknown as { scratchDir: string | null }).scratchDir;
    await host.close();
    await fsp.rm(dataDir, { recursive: true, force: true });
    if (scratch) await fsp.rm(scratch, { recursive: true, force: true });
  });

  it('refuses requests without the token', async () => {
    const bad = new HostClient({ url: host.url, token: 'wrong' });
    await expect(bad.listSandboxes()).rejects.toMatchObject({ type: 'unauthorized', status: 401 });
    expect((await client.health()).ok).toBe(true);
  });

  it('creates a sandbox idempotently, runs the entrypoint and reports its exit code and output', async () => {
    const id = newId();
    const req = {
      id,
      orgId: 'org1',
      owner: { kind: 'session' as const, id: 'sess_1' },
      envs: { GREETING: 'hello' },
      files: { '/tmp/agent_input.json': '{"x":1}' },
      entrypoint: { argv: ['bash', '-c', 'cat /tmp/agent_input.json; echo " $GREETING $MINE $(pwd)"; echo err >&2; exit 7'], env: { MINE: 'mine' } },
    };
    const info = await client.createSandbox(req);
    expect(info).toMatchObject({ id, orgId: 'org1', hostId: 'test-host', status: 'running', provider: 'namespaces' });
    expect(await client.createSandbox(req)).toMatchObject({ id, createdAt: info.createdAt });
    const st = await client.entrypointStatus(id, { waitMs: 10000 });
    expect(st).toMatchObject({ state: 'exited', exitCode: 7, timedOut: false, signal: null });
    expect((await client.entrypointOutput(id)).toString()).toBe('{"x":1} hello mine /workspace\n');
    expect((await client.entrypointOutput(id, { stream: 'stderr' })).toString()).toBe('err\n');
    await expect(client.startEntrypoint(id, { argv: ['true'] })).rejects.toMatchObject({ type: 'conflict' });
    expect((await client.listSandboxes({ owner: 'session:sess_1' })).map((s) => s.id)).toEqual([id]);
    expect(await client.listSandboxes({ owner: 'instance' })).toEqual([]);
    expect(await client.getSandbox(id)).toMatchObject({ id });
  });

  it('records every entrypoint run once, fsync\'d once its helper claimed it, in the audit log (not a create that finds the sandbox)', async () => {
    const log = path.join(dataDir, 'audit', 'entrypoints.ndjson');
    const linesOf = async (sessionId: string) =>
      (await fsp.readFile(log, 'utf8').catch(() => ''))
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l))
        .filter((e) => e.owner?.id === sessionId);
    const sessionId = `sess_audit${process.pid}`;
    const id = newId();
    const req = { id, orgId: 'org1', owner: { kind: 'session' as const, id: sessionId }, entrypoint: { argv: ['true'] } };
    await client.createSandbox(req);
    await client.createSandbox(req);
    await expect(client.startEntrypoint(id, { argv: ['true'] })).rejects.toMatchObject({ type: 'conflict' });
    const st = await client.entrypointStatus(id, { waitMs: 10000 });
    const lines = await linesOf(sessionId);
    expect(lines).toEqual([{ at: expect.any(String), event: 'entrypoint_start', sandboxId: id, orgId: 'org1', hostId: 'test-host', owner: { kind: 'session', id: sessionId }, run: expect.stringMatching(/^[0-9a-f]{16}$/) }]);
    expect(st.state).toBe('exited');
    // The line records the helper's claim, which comes after the host's decision to start.
    if (st.state !== 'none') expect(Date.parse(lines[0].at)).toBeGreaterThanOrEqual(Date.parse(st.startedAt));
    // A sandbox without an entrypoint has no line until one is started.
    const other = newId();
    const otherOwner = `${sessionId}b`;
    await client.createSandbox({ id: other, orgId: 'org1', owner: { kind: 'session', id: otherOwner } });
    expect(await linesOf(otherOwner)).toEqual([]);
    await client.startEntrypoint(other, { argv: ['true'] });
    expect((await linesOf(otherOwner)).map((e) => e.sandboxId)).toEqual([other]);
    expect((await fsp.stat(log)).mode & 0o777).toBe(0o600);
    await client.destroySandbox(id);
    await client.destroySandbox(other);
  });

  it('never starts an entrypoint twice when the host died while starting it: adopts one that started, starts one that did not', async () => {
    const log = path.join(dataDir, 'audit', 'entrypoints.ndjson');
    const startsOf = async (owner: string) => (await fsp.readFile(log, 'utf8')).split('\n').filter((l) => l.includes(`"${owner}"`)).length;
    const stateFile = (id: string) => path.join(dataDir, 'sandboxes', id, 'state.json');
    const tag = `sess_crash${process.pid}`;
    const running = { id: newId(), orgId: 'o', owner: { kind: 'session' as const, id: `${tag}r` }, entrypoint: { argv: ['sleep', '300'] } };
    const exited = { id: newId(), orgId: 'o', owner: { kind: 'session' as const, id: `${tag}e` }, entrypoint: { argv: ['bash', '-c', 'exit 4'] } };
    const never = { id: newId(), orgId: 'o', owner: { kind: 'session' as const, id: `${tag}n` }, entrypoint: { argv: ['bash', '-c', 'exit 5'] } };
    await client.createSandbox(running);
    await client.createSandbox(exited);
    await client.createSandbox({ ...never, entrypoint: undefined });
    const helper = await client.entrypointStatus(running.id);
    expect(helper.state).toBe('running');
    expect((await client.entrypointStatus(exited.id, { waitMs: 10_000 })).state).toBe('exited');
    await host.close();
    // What a host that died between saving `starting` and saving the helper's pid leaves: for the
    // first two the start happened, for the third it did not.
    for (const { id } of [running, exited]) {
      const st = JSON.parse(await fsp.readFile(stateFile(id), 'utf8'));
      await fsp.writeFile(stateFile(id), JSON.stringify({ ...st, entrypoint: { ...st.entrypoint, wrapper: { pid: 0, start: -1 }, starting: true } }));
    }
    const st = JSON.parse(await fsp.readFile(stateFile(never.id), 'utf8'));
    await fsp.writeFile(stateFile(never.id), JSON.stringify({ ...st, entrypoint: { wrapper: { pid: 0, start: -1 }, startedAt: new Date().toISOString(), starting: true } }));
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', network: null, hostId: 'test-host' });
    client = new HostClient({ url: host.url, token: TOKEN });
    try {
      expect(await client.entrypointStatus(running.id)).toMatchObject({ state: 'running', pid: helper.state === 'running' ? helper.pid : -1 });
      expect(await client.entrypointStatus(exited.id)).toMatchObject({ state: 'exited', exitCode: 4 });
      expect(await client.entrypointStatus(never.id)).toEqual({ state: 'none' });
      // The callers' retries: the two that started are not started again; the third starts now.
      for (const req of [running, exited, never]) await client.createSandbox(req);
      expect(await client.entrypointStatus(running.id)).toMatchObject({ state: 'running' });
      expect(await client.entrypointStatus(never.id, { waitMs: 10_000 })).toMatchObject({ state: 'exited', exitCode: 5 });
      // One line each: the adopted runs' lines were written before the "crash" and are not written again.
      for (const req of [running, exited, never]) expect(await startsOf(req.owner.id)).toBe(1);
    } finally {
      for (const req of [running, exited, never]) await client.destroySandbox(req.id);
    }
  });

  it('never makes a sandbox again for a create that waited behind its destroy (a second provisioning of one session): its entrypoint runs once', async () => {
    const log = path.join(dataDir, 'audit', 'entrypoints.ndjson');
    const owner = `sess_twice${process.pid}`;
    const req = { id: newId(), orgId: 'o', owner: { kind: 'session' as const, id: owner }, entrypoint: { argv: ['true'] } };
    const provider = host.provider;
    // In this order, in one turn: the first attempt's create, the session's end (destroy), a late twin's create.
    const first = provider.create(req);
    const destroyed = provider.destroy(req.id);
    const late = provider.create(req);
    try {
      await expect(first).resolves.toMatchObject({ created: true });
      await expect(destroyed).resolves.toBe(true);
      await expect(late).rejects.toMatchObject({ type: 'conflict' });
      expect(provider.get(req.id)).toBeNull();
      const lines = (await fsp.readFile(log, 'utf8')).split('\n').filter((l) => l.includes(`"${owner}"`));
      expect(lines).toHaveLength(1);
      // A create that comes after the destroy (not queued behind it) is a new sandbox, as before.
      await expect(provider.create({ ...req, entrypoint: undefined })).resolves.toMatchObject({ created: true });
    } finally {
      await Promise.allSettled([first, destroyed, late]);
      await provider.destroy(req.id);
    }
  });

  it('answers a create with the exit and a file of an entrypoint that ends within awaitExit, and says running otherwise', async () => {
    const quick = (argv: string[], maxBytes = 100) =>
      client.createSandbox({ id: newId(), orgId: 'o', entrypoint: { argv }, awaitExit: { waitMs: 10_000, readFile: { path: '/tmp/out.json', maxBytes } } });
    const wrote = await quick(['bash', '-c', 'echo -n \'{"ok":true}\' > /tmp/out.json; exit 3']);
    expect(wrote.entrypoint).toMatchObject({ state: 'exited', exitCode: 3, timedOut: false });
    expect(Buffer.from((wrote.file as { content: string }).content, 'base64').toString()).toBe('{"ok":true}');
    expect((await quick(['true'])).file).toEqual({ missing: true });
    expect((await quick(['bash', '-c', 'head -c 200 /dev/zero > /tmp/out.json'])).file).toEqual({ tooLarge: true });
    // A directory cannot be read: the answer leaves the file out (the caller reads it itself to learn why).
    const dir = await quick(['mkdir', '/tmp/out.json']);
    expect(dir.entrypoint).toMatchObject({ state: 'exited', exitCode: 0 });
    expect(dir.file).toBeUndefined();
    const t0 = Date.now();
    const slow = await client.createSandbox({ id: newId(), orgId: 'o', entrypoint: { argv: ['sleep', '30'] }, awaitExit: { waitMs: 300 } });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(290);
    expect(slow.entrypoint).toMatchObject({ state: 'running' });
    expect(slow.file).toBeUndefined();
    // Bad awaitExit values are refused before anything is created.
    const bad = newId();
    await expect(client.createSandbox({ id: bad, orgId: 'o', entrypoint: { argv: ['true'] }, awaitExit: { waitMs: -1 } })).rejects.toMatchObject({ type: 'invalid_request', status: 400 });
    await expect(client.createSandbox({ id: bad, orgId: 'o', entrypoint: { argv: ['true'] }, awaitExit: { waitMs: 10, readFile: { path: '', maxBytes: 0 } } })).rejects.toMatchObject({ type: 'invalid_request', status: 400 });
    expect(await client.getSandbox(bad)).toBeNull();
    // Without awaitExit, a create answers at once, as before.
    expect((await client.createSandbox({ id: newId(), orgId: 'o', entrypoint: { argv: ['sleep', '30'] } })).entrypoint).toBeUndefined();
  });

  it('kills an entrypoint at its timeout and says so', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', entrypoint: { argv: ['sleep', '30'], timeoutSeconds: 1 } });
    expect(await client.entrypointStatus(id)).toMatchObject({ state: 'running' });
    const st = await client.entrypointStatus(id, { waitMs: 10000 });
    expect(st).toMatchObject({ state: 'exited', timedOut: true, exitCode: 124 });
  });

  it('reads and writes files with limits, and refuses escapes', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o' });
    await client.writeFile(id, '/workspace/a/b.txt', 'content');
    await client.writeFile(id, '/workspace/bin.dat', Buffer.from([0, 1, 2, 255]));
    expect((await client.readFile(id, '/workspace/a/b.txt'))?.toString()).toBe('content');
    expect([...((await client.readFile(id, '/workspace/bin.dat')) as Buffer)]).toEqual([0, 1, 2, 255]);
    expect(await client.readFile(id, '/workspace/none')).toBeNull();
    await expect(client.readFile(id, '/workspace/a/b.txt', { maxBytes: 3 })).rejects.toMatchObject({
      type: 'payload_too_large',
      status: 413,
    });
    await expect(client.readFile(id, '/workspace/../etc/passwd')).rejects.toMatchObject({ type: 'invalid_request' });
    // A symlink made inside the sandbox to a host path resolves inside the sandbox.
    expect((await sh(host.provider, id, `ln -s /etc/passwd /workspace/pw && ln -s ${dataDir} /workspace/dd`)).code).toBe(0);
    const pw = (await client.readFile(id, '/workspace/pw'))?.toString() ?? '';
    expect(pw).toContain('root:x:0:0');
    expect(pw).not.toContain('daemon:');
    expect(await client.readFile(id, '/workspace/dd/sandboxes/' + id + '/state.json')).toBeNull();
    // The overlays are in the sandbox's own mount namespace, not the host's; files go through its init's root.
    expect(hostMountsOf(id)).toEqual([]);
    const mine = await fsp.readFile(`/proc/${await initPid(dataDir, id)}/mountinfo`, 'utf8');
    expect(mine).toMatch(new RegExp(` / \\S+ - overlay ${id} `));
    expect(mine).toMatch(new RegExp(` /usr \\S+ - overlay ${id} `));
    // Its layers are named by relative names only: no host path in the sandbox's mount table.
    // (l0 is the base; the agent SDK's layer, when the toolchain installed it, comes after it as l1.)
    expect(mine).toMatch(/lowerdir=l0(:l\d+)*,upperdir=w\/root,workdir=w\/work-root/);
    expect(mine).not.toContain(dataDir);
    // A parent directory that is a symlink to a host path is resolved inside the sandbox, and so is `..`.
    const hostDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-host-only-'));
    await fsp.writeFile(path.join(hostDir, 'secret'), 'HOST');
    expect((await sh(host.provider, id, `ln -s ${hostDir} /workspace/hd && ln -s ../../../../etc /workspace/up`)).code).toBe(0);
    expect(await client.readFile(id, '/workspace/hd/secret')).toBeNull();
    await client.writeFile(id, '/workspace/hd/secret', 'sandbox');
    expect(await fsp.readFile(path.join(hostDir, 'secret'), 'utf8')).toBe('HOST');
    expect((await sh(host.provider, id, `cat ${hostDir}/secret`)).stdout).toBe('sandbox');
    expect((await client.readFile(id, '/workspace/up/passwd'))?.toString()).toBe(pw);
    // The sandbox's /proc and /dev are other mounts: refused, and nothing is created there.
    await expect(client.readFile(id, '/proc/1/cmdline')).rejects.toMatchObject({ type: 'invalid_request' });
    await expect(client.readFile(id, '/proc/sys/kernel/hostname')).rejects.toMatchObject({ type: 'invalid_request' });
    await expect(client.writeFile(id, '/dev/sap-x/y', 'x')).rejects.toMatchObject({ type: 'invalid_request' });
    expect((await sh(host.provider, id, 'ls /dev/sap-x 2>&1 || echo absent')).stdout).toContain('absent');
    // /usr is the sandbox's own overlay, writable through the files API without touching the host's.
    await client.writeFile(id, '/usr/local/sap-files-marker', 'usr');
    expect((await sh(host.provider, id, 'cat /usr/local/sap-files-marker')).stdout).toBe('usr');
    expect(existsSync('/usr/local/sap-files-marker')).toBe(false);
    // The sandbox swaps a directory for a symlink to the host directory as fast as it can, while the
    // host reads and writes through it: the host's file is never read or written.
    expect((await sh(host.provider, id, `mkdir -p /workspace/race/d && echo sandbox > /workspace/race/d/secret && ln -s ${hostDir} /workspace/race/l`)).code).toBe(0);
    // Through the real directory, before the race: the read path works.
    expect((await client.readFile(id, '/workspace/race/d/secret'))?.toString()).toBe('sandbox\n');
    const swapper = host.provider.spawn(id, {
      argv: ['/bin/bash', '-c', 'cd /workspace/race; while :; do mv -T d t; mv -T l d; mv -T d l; mv -T t d; done'],
    });
    swapper.stdin?.end();
    try {
      const seen = new Set<string>();
      for (let i = 0; i < 300; i++) {
        const got = await client.readFile(id, '/workspace/race/d/secret').then((b) => b?.toString() ?? 'missing', (e: HostError) => `${e.type}: ${e.message}`);
        seen.add(got);
        await client.writeFile(id, '/workspace/race/d/w' + (i % 5), 'w').catch(() => undefined);
      }
      expect(seen.has('HOST')).toBe(false);
      // 'sandbox' (no newline): through the symlink, the sandbox's own copy at the host directory's path.
      expect([...seen].filter((v) => !(['sandbox\n', 'sandbox', 'missing'].includes(v) || /^(invalid_request|conflict):/.test(v)))).toEqual([]);
      // No read is required to land on the real directory during the race: a write that finds `d`
      // missing between two renames creates it (as writes do with parents), after which the swapper's
      // renames fail and every later read sees that new directory ('missing'). What matters is above:
      // the host's file is never read or written, whatever the interleaving.
    } finally {
      swapper.kill('SIGKILL');
    }
    expect(await fsp.readFile(path.join(hostDir, 'secret'), 'utf8')).toBe('HOST');
    expect((await fsp.readdir(hostDir)).sort()).toEqual(['secret']);
    await fsp.rm(hostDir, { recursive: true, force: true });
  });

  it('checkpoints the writable layer and starts a sandbox from it', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', files: { '/workspace/from-files.txt': 'files api' } });
    expect((await sh(host.provider, id, 'echo from-shell > /workspace/shell.txt && echo tool > /usr/local/bin/sap-tool')).code).toBe(0);
    const layer = `ck-${process.pid}-${n}`;
    expect(await client.createCheckpoint(id, layer)).toMatchObject({ layerId: layer, parents: [] });
    const id2 = newId();
    await client.createSandbox({ id: id2, orgId: 'o', layers: [layer] });
    expect(hostMountsOf(id2)).toEqual([]);
    expect((await client.readFile(id2, '/workspace/from-files.txt'))?.toString()).toBe('files api');
    expect((await client.readFile(id2, '/workspace/shell.txt'))?.toString()).toBe('from-shell\n');
    expect((await client.readFile(id2, '/usr/local/bin/sap-tool'))?.toString()).toBe('tool\n');
    await client.writeFile(id2, '/workspace/shell.txt', 'changed');
    expect((await client.readFile(id, '/workspace/shell.txt'))?.toString()).toBe('from-shell\n');
    await client.destroySandbox(id2);
    await client.destroySandbox(id);
    expect(await client.deleteLayer(layer)).toBe(true);
  });

  it('answers conflict for the files of a sandbox whose init has died', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', files: { '/workspace/x': 'x' } });
    process.kill(await initPid(dataDir, id), 'SIGKILL');
    await eventually(async () => (await client.getSandbox(id))?.status === 'stopped');
    await expect(client.readFile(id, '/workspace/x')).rejects.toMatchObject({ type: 'conflict', status: 409 });
    await expect(client.writeFile(id, '/workspace/y', 'y')).rejects.toMatchObject({ type: 'conflict', status: 409 });
    expect(await client.destroySandbox(id)).toBe(true);
    expect(existsSync(path.join(dataDir, 'sandboxes', id))).toBe(false);
  });

  it('gives bash, node and python3 a small machine of their own, with no host files in sight', async () => {
    const id = newId();
    await fsp.writeFile(path.join(dataDir, 'host-secret'), 'TOPSECRET');
    await client.createSandbox({ id, orgId: 'o' });
    const r = await sh(
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
        'ls -A /home | wc -l',
        'ip -o link 2>/dev/null | wc -l || cat /proc/net/dev | tail -n +3 | wc -l',
      ].join('; '),
    );
    expect(r.stderr).toBe('');
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^bash 5/);
    expect(lines[1]).toMatch(/^node v\d+/);
    expect(lines[2]).toBe('python 3');
    expect(lines[3]).toBe(id);
    // /etc/shadow is the base skeleton's (root and nobody, no passwords), not the host's.
    expect(lines.slice(4, 9)).toEqual(['no-datadir', 'no-work', 'root:2', '0', '0']);
    expect(lines[9]).toBe('1'); // loopback only (this file's hosts run with the network off: the stack's host owns the machine's sandbox network)
  });

  it('shows each sandbox only its own processes', async () => {
    const a = newId();
    const b = newId();
    await client.createSandbox({ id: a, orgId: 'o', entrypoint: { argv: ['sleep', '123'] } });
    await client.createSandbox({ id: b, orgId: 'o', entrypoint: { argv: ['sleep', '456'] } });
    const psA = await sh(host.provider, a, 'ps -eo args');
    const psB = await sh(host.provider, b, 'ls /proc | grep -c "^[0-9]"; ps -eo args');
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
    const w = await sh(host.provider, a, `echo mine > /usr/bin/${marker} && cat /usr/bin/${marker} && rm /usr/bin/env.not-there 2>/dev/null; echo ok`);
    expect(w.stdout).toBe('mine\nok\n');
    expect(existsSync(`/usr/bin/${marker}`)).toBe(false);
    // The writable layer is a tmpfs in the mount namespace of the sandbox's init helper.
    const outer = JSON.parse(await fsp.readFile(path.join(dataDir, 'sandboxes', a, 'state.json'), 'utf8')).init.outer.pid;
    expect(existsSync(path.join(`/proc/${outer}/root`, dataDir, 'sandboxes', a, 'm', 'w', 'usr', 'bin', marker))).toBe(true);
    expect((await sh(host.provider, b, `test -e /usr/bin/${marker}; echo $?`)).stdout).toBe('1\n');
    const m = await sh(host.provider, a, 'mount -t tmpfs x /mnt; echo "rc=$?"; grep Cap /proc/self/status');
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
    const r = await sh(host.provider, id, `python3 -c '${script}'`);
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
      const r = await sh(host.provider, id, 'hostname; ls /proc | grep -c "^[0-9]"');
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
      .createSandbox({ id: bad, orgId: 'o', patches: [{ id: 'pa-ok', script: 'true' }, { id: 'pa-bad', script: 'echo broken; exit 3' }] })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(HostError);
    expect(err).toMatchObject({ type: 'patch_failed' });
    expect((err as Error).message).toContain('pa-bad');
    expect((err as Error).message).toContain('broken');
    expect(await client.getSandbox(bad)).toBeNull();
    expect(existsSync(path.join(dataDir, 'sandboxes', bad))).toBe(false);
  });

  it('starts the next init ahead: its cgroups become the new sandbox\'s, with its limits', async () => {
    const [spare] = await eventually(async () => (readySpares().length === 1 ? readySpares() : null), 10_000, 20);
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
    expect((await sh(host.provider, id, 'hostname; grep CapEff /proc/self/status')).stdout).toBe(`${id}\nCapEff:\t${DEFAULT_CAPS}\n`);
    // The helper stays as the keeper of the sandbox's mounts, and the next spare is on its way.
    expect(require('node:fs').readFileSync(`/proc/${helper}/comm`, 'utf8').trim()).toBe('sap-sandbox-ini');
    await eventually(async () => readySpares().length === 1 && readySpares()[0] !== spare, 10_000, 20);
  });

  it('keeps a session\'s sandbox files on the scratch tmpfs, linked from DATA_DIR, and removes both; cleans up after a reboot', async () => {
    const scratch = (host.provider as unknown as { scratchDir: string | null }).scratchDir;
    expect(scratch).toMatch(/^\/dev\/shm\/sap-sandboxes-[0-9a-f]{12}$/);
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', owner: { kind: 'session', id: 'sess_x' }, files: { '/tmp/in.json': '{"a":1}' }, entrypoint: { argv: ['bash', '-c', 'cp /tmp/in.json /tmp/out.json'] }, awaitExit: { waitMs: 10_000, readFile: { path: '/tmp/out.json', maxBytes: 100 } } });
    const link = path.join(dataDir, 'sandboxes', id);
    expect(await fsp.readlink(link)).toBe(path.join(scratch!, id));
    expect((await fsp.statfs(path.join(scratch!, id))).type).toBe(0x01021994);
    expect((await client.readFile(id, '/tmp/out.json'))!.toString()).toBe('{"a":1}');
    // Other owners keep their files in DATA_DIR (instances and API sandboxes outlive reboots).
    const kept = newId();
    await client.createSandbox({ id: kept, orgId: 'o', owner: { kind: 'instance', id: 'inst_x' } });
    expect((await fsp.lstat(path.join(dataDir, 'sandboxes', kept))).isDirectory()).toBe(true);
    expect(await client.destroySandbox(id)).toBe(true);
    expect(existsSync(link) || existsSync(path.join(scratch!, id))).toBe(false);
    // A reboot empties the tmpfs: the link is left dangling, and an unlinked scratch directory may be left too.
    const lost = newId();
    await client.createSandbox({ id: lost, orgId: 'o', owner: { kind: 'session', id: 'sess_y' }, entrypoint: { argv: ['sleep', '300'] } });
    await host.close();
    killAllOf(pidsOfCgroup(lost));
    await fsp.rm(path.join(scratch!, lost), { recursive: true, force: true });
    await fsp.mkdir(path.join(scratch!, 'sb-unlinked'));
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', network: null, hostId: 'test-host' });
    client = new HostClient({ url: host.url, token: TOKEN });
    expect(await client.getSandbox(lost)).toBeNull();
    await expect(fsp.lstat(path.join(dataDir, 'sandboxes', lost))).rejects.toMatchObject({ code: 'ENOENT' });
    expect(existsSync(path.join(scratch!, 'sb-unlinked'))).toBe(false);
    expect(existsSync(`/sys/fs/cgroup/pids/sap/${lost}`)).toBe(false);
  });

  it('removes its scratch directory when it stops with no session sandbox left, and keeps it otherwise', async () => {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-host-scratch-'));
    const other = await startHost({ dataDir: dir, token: TOKEN, listen: '127.0.0.1:0', network: null, hostId: 'test-host-2' });
    const scratch = (other.provider as unknown as { scratchDir: string }).scratchDir;
    const c = new HostClient({ url: other.url, token: TOKEN });
    const id = newId();
    await c.createSandbox({ id, orgId: 'o', owner: { kind: 'session', id: 'sess_z' } });
    await other.close();
    expect(existsSync(path.join(scratch, id))).toBe(true);
    const again = await startHost({ dataDir: dir, token: TOKEN, listen: '127.0.0.1:0', network: null, hostId: 'test-host-2' });
    expect(await new HostClient({ url: again.url, token: TOKEN }).destroySandbox(id)).toBe(true);
    await again.close();
    expect(existsSync(scratch)).toBe(false);
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('removes, at restart, a sandbox whose state was never written (the host died while creating it)', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', entrypoint: { argv: ['sleep', '300'] } });
    // The init helper and pid 1 are in the cgroups when the create answers; the entrypoint's helper
    // joins them itself, just after it was started.
    const pids = await eventually(async () => (pidsOfCgroup(id).length >= 3 ? pidsOfCgroup(id) : null), 10_000, 20);
    // What a crash between starting the init and writing state.json leaves behind; and the cgroups
    // of a spare init helper whose host process is gone.
    await fsp.rm(path.join(dataDir, 'sandboxes', id, 'state.json'));
    const stale = 'spare-999999999-1';
    for (const c of ['memory', 'pids', 'cpu', 'freezer']) await fsp.mkdir(`/sys/fs/cgroup/${c}/sap/${stale}`);
    await host.close();
    expect(readySpares()).toEqual([]);
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', network: null, hostId: 'test-host' });
    client = new HostClient({ url: host.url, token: TOKEN });
    expect(await client.getSandbox(id)).toBeNull();
    // Killed and out of the cgroup; give them a moment to finish exiting.
    const alive = () => pids.filter((pid) => isRunning(Number(pid)));
    for (let i = 0; i < 100 && alive().length > 0; i++) await new Promise((r) => setTimeout(r, 20));
    expect(alive()).toEqual([]);
    expect(existsSync(path.join(dataDir, 'sandboxes', id))).toBe(false);
    expect(await fsp.readFile('/proc/mounts', 'utf8')).not.toContain(id);
    expect(existsSync(`/sys/fs/cgroup/pids/sap/${id}`)).toBe(false);
    for (const c of ['memory', 'pids', 'cpu', 'freezer']) expect(existsSync(`/sys/fs/cgroup/${c}/sap/${stale}`)).toBe(false);
  });

  it('keeps sandboxes and entrypoints across a host restart', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', entrypoint: { argv: ['bash', '-c', 'sleep 1.5; echo survived; exit 5'] } });
    await host.close();
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', network: null, hostId: 'test-host' });
    client = new HostClient({ url: host.url, token: TOKEN });
    expect(await client.getSandbox(id)).toMatchObject({ status: 'running' });
    expect(await client.entrypointStatus(id)).toMatchObject({ state: 'running' });
    expect(await client.entrypointStatus(id, { waitMs: 10000 })).toMatchObject({ state: 'exited', exitCode: 5 });
    expect((await client.entrypointOutput(id)).toString()).toBe('survived\n');
    expect((await sh(host.provider, id, 'echo still-alive')).stdout).toBe('still-alive\n');
    // The adopted sandbox's files, through its init's root.
    await client.writeFile(id, '/workspace/after-restart', 'adopted');
    expect((await sh(host.provider, id, 'cat /workspace/after-restart')).stdout).toBe('adopted');
  });

  it('after a reboot (every sandbox process gone), marks the sandbox stopped and destroys it cleanly', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', entrypoint: { argv: ['sleep', '300'] } });
    await host.close();
    const pids = pidsOfCgroup(id);
    killAllOf(pids);
    const alive = () => pids.filter((pid) => isRunning(Number(pid)));
    for (let i = 0; i < 100 && alive().length > 0; i++) await new Promise((r) => setTimeout(r, 20));
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', network: null, hostId: 'test-host' });
    client = new HostClient({ url: host.url, token: TOKEN });
    expect(await client.getSandbox(id)).toMatchObject({ status: 'stopped' });
    await expect(client.readFile(id, '/workspace/x')).rejects.toMatchObject({ type: 'conflict' });
    expect(await client.destroySandbox(id)).toBe(true);
    expect(existsSync(path.join(dataDir, 'sandboxes', id))).toBe(false);
    expect(hostMountsOf(id)).toEqual([]);
    expect(existsSync(`/sys/fs/cgroup/pids/sap/${id}`)).toBe(false);
  });

  it('measures create latency', async () => {
    const create: number[] = [];
    const withEntrypoint: number[] = [];
    for (let i = 0; i < 15; i++) {
      const id = newId();
      let t = performance.now();
      await client.createSandbox({ id, orgId: 'o' });
      create.push(performance.now() - t);
      await client.destroySandbox(id);
      const id2 = newId();
      t = performance.now();
      await client.createSandbox({ id: id2, orgId: 'o', entrypoint: { argv: ['true'] } });
      const st = await client.entrypointStatus(id2, { waitMs: 10000 });
      withEntrypoint.push(performance.now() - t);
      expect(st).toMatchObject({ state: 'exited', exitCode: 0 });
      const t2 = performance.now();
      await client.destroySandbox(id2);
      if (i === 0) console.log(`destroy took ${(performance.now() - t2).toFixed(1)} ms`);
    }
    console.log(
      `sandbox create p50 ${p50(create).toFixed(1)} ms; create + entrypoint 'true' + wait p50 ${p50(withEntrypoint).toFixed(1)} ms`,
    );
  });
});

describe('sandbox host (namespaces), data directory too long for the helpers\' socket there', () => {
  let dataDir: string;
  let host: RunningHost;
  let client: HostClient;

  beforeAll(async () => {
    dataDir = path.join(await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-host-long-')), 'x'.repeat(100));
    await fsp.mkdir(dataDir);
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', network: null, hostId: 'test-host-long' });
    client = new HostClient({ url: host.url, token: TOKEN });
  });

  afterAll(async () => {
    for (const sb of await client.listSandboxes()) await client.destroySandbox(sb.id);
    await host.close();
    await fsp.rm(path.dirname(dataDir), { recursive: true, force: true });
  });

  it('listens for its init helpers in a private directory of the system\'s temporary directory instead, and starts sandboxes the same way', async () => {
    expect(existsSync(path.join(dataDir, 'init.sock'))).toBe(false);
    const [spare] = await eventually(async () => (readySpares().length === 1 ? readySpares() : null), 10_000, 20);
    const [helper] = pidsOfCgroup(spare!);
    // Started by the spawner, not forked by the host.
    expect(Number(/^PPid:\s+(\d+)/m.exec(require('node:fs').readFileSync(`/proc/${helper}/status`, 'utf8'))![1])).not.toBe(process.pid);
    // One from the spare, the others without one (a burst).
    const ids = [1, 2, 3].map((i) => `sb-long${process.pid}-${i}`);
    await Promise.all(ids.map((id) => client.createSandbox({ id, orgId: 'o', files: { '/workspace/f': id } })));
    for (const id of ids) {
      expect((await client.readFile(id, '/workspace/f'))?.toString()).toBe(id);
      expect((await sh(host.provider, id, 'hostname')).stdout).toBe(`${id}\n`);
      expect(hostMountsOf(id)).toEqual([]);
    }
    for (const id of ids) expect(await client.destroySandbox(id)).toBe(true);
    for (const id of ids) expect(existsSync(`/sys/fs/cgroup/pids/sap/${id}`)).toBe(false);
  });
});

/** Runs argv inside a live sandbox through the provider; answers how the host saw it end. */
function run(
  provider: SandboxProvider,
  id: string,
  argv: string[],
  opts: { env?: Record<string, string>; cwd?: string } = {},
): Promise<{ code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string; comm: string }> {
  return new Promise((resolve, reject) => {
    const child = provider.spawn(id, { argv, ...opts });
    let stdout = '';
    let stderr = '';
    let comm = '';
    child.stdin?.end();
    child.stdout?.on('data', (d: Buffer) => {
      // What the host started, once the command runs (it has written something).
      if (!stdout) comm = require('node:fs').readFileSync(`/proc/${child.pid}/comm`, 'utf8').trim();
      stdout += d.toString();
    });
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code, signal) => resolve({ code, signal, stdout, stderr, comm }));
  });
}

const ENTER_HELPER = path.join(__dirname, '..', '..', '.tools', 'bin', 'sap-sandbox-enter');

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
    const r = await run(host.provider, id, ['/bin/sh', '-c', 'pwd; echo out; echo err >&2; exit 42'], { cwd: '/srv/here' });
    expect(r).toMatchObject({ code: 42, signal: null, stdout: '/srv/here\nout\n', stderr: 'err\n', comm });
    expect(await run(host.provider, id, ['/bin/sh', '-c', 'kill -USR1 $$'])).toMatchObject({ code: null, signal: 'SIGUSR1' });
    const missing = await run(host.provider, id, ['no-such-program-here']);
    expect(missing.code).toBe(127);
    expect(missing.stderr).toContain('no-such-program-here');
    expect((await run(host.provider, id, ['/etc/passwd'])).code).toBe(126);
    expect((await run(host.provider, id, ['true'], { cwd: '/no/such/dir' })).code).toBe(125);
    expect((await run(host.provider, id, ['cat'])).stdout).toBe('');
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
      const t0 = Date.now();
      const [c, s] = await ended;
      expect(Date.now() - t0).toBeLessThan(5000);
      expect(c === 143 || s === 'SIGTERM').toBe(true);
    }
    await host.provider.destroy(id);
  });

  it('gives exactly the environment asked for, a container root\'s capabilities, seccomp, and the sandbox\'s pid namespace and cgroups', async () => {
    const a = newId();
    const b = newId();
    process.env.SAP_HOST_ONLY = 'leak';
    await client.createSandbox({ id: a, orgId: 'o', envs: { FROM_SANDBOX: 's', LANG: 'C' }, entrypoint: { argv: ['sleep', '123'] } });
    await client.createSandbox({ id: b, orgId: 'o', entrypoint: { argv: ['sleep', '456'] } });
    const env = await run(host.provider, a, ['/usr/bin/env'], { env: { MINE: 'a=b c', FROM_SANDBOX: 'overridden' } });
    delete process.env.SAP_HOST_ONLY;
    expect(env.stdout.split('\n').filter(Boolean).sort()).toEqual(
      [
        'FROM_SANDBOX=overridden',
        `HOSTNAME=${a}`,
        'HOME=/root',
        'LANG=C',
        'MINE=a=b c',
        'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
        'TERM=xterm',
      ].sort(),
    );
    const caps = await run(host.provider, a, ['grep', 'Cap', '/proc/self/status']);
    // Inheritable, permitted, effective, bounding: a container root's set; ambient: none. Seccomp on, no_new_privs.
    expect(caps.stdout.trim().split('\n').map((l) => l.split(':\t')[1])).toEqual([...Array(4).fill(DEFAULT_CAPS), '0000000000000000']);
    const status = (await run(host.provider, a, ['cat', '/proc/self/status'])).stdout;
    expect(status).toMatch(/^NoNewPrivs:\t1$/m);
    expect(status).toMatch(/^Seccomp:\t2$/m);
    const seen = await run(host.provider, a, ['ps', '-eo', 'args']);
    expect(seen.stdout).toContain('sleep 123');
    expect(seen.stdout).not.toContain('sleep 456');
    expect(seen.stdout).not.toContain('jest');
    // Every process entered joins the same pid namespace, not the host's. (pid 1 is the host's helper:
    // not dumpable, so the sandbox cannot read its /proc/1/ns.)
    const nsSelf = (await run(host.provider, a, ['readlink', '/proc/self/ns/pid'])).stdout.trim();
    const nsAgain = (await run(host.provider, a, ['readlink', '/proc/self/ns/pid'])).stdout.trim();
    expect(nsSelf).toMatch(/^pid:\[\d+\]$/);
    expect(nsSelf).toBe(nsAgain);
    expect(nsSelf).not.toBe(await fsp.readlink('/proc/self/ns/pid'));
    expect((await run(host.provider, a, ['readlink', '/proc/1/ns/pid'])).code).not.toBe(0);
    // Inside its cgroup namespace, the sandbox's own cgroups are the root.
    const cgroups = (await run(host.provider, a, ['cat', '/proc/self/cgroup'])).stdout;
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
    expect((await run(host.provider, soft, ['/bin/sh', '-c', 'ps -eo args | grep -c "^sleep 30"'])).stdout.trim()).toBe('0');
    expect(await client.entrypointStatus(hard, { waitMs: 10000 })).toMatchObject({ state: 'exited', timedOut: true, exitCode: 137 });
    const quick = newId();
    await client.createSandbox({ id: quick, orgId: 'o', entrypoint: { argv: ['bash', '-c', 'kill -TERM $$'], timeoutSeconds: 5 } });
    expect(await client.entrypointStatus(quick, { waitMs: 5000 })).toMatchObject({ state: 'exited', timedOut: false, exitCode: 143, signal: 'SIGTERM' });
  }, 30_000);

  it('records the entrypoint\'s exit in its file while the host is down', async () => {
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
    it('forwards SIGTERM sent to the entrypoint\'s helper to the entrypoint', async () => {
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
