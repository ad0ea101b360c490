/**
 * The sandbox host against real sandboxes: the token, creating sandboxes and running their
 * entrypoints (once each, audited, with timeouts), files, checkpoints.
 * Needs root, overlayfs and cgroup v1 (the machine described in TOOLCHAIN.md).
 * The host's isolation and limits: sandbox-host-isolation.test.ts; restarts, scratch and long data
 * directories: sandbox-host-restart.test.ts; entering a sandbox: sandbox-host-enter.test.ts.
 */
import { promises as fsp, existsSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { HostClient, HostError } from '../../../sandbox/host-contract/client';
import { startHost, type RunningHost } from '../../../sandbox/host/server';
import { eventually } from '../../helpers/env';
import { TOKEN, hostMountsOf, initPid, providerSh, startTestHost, stopTestHost } from '../../helpers/sandbox-host';

describe('sandbox host (namespaces)', () => {
  let dataDir: string;
  let host: RunningHost;
  let client: HostClient;
  let n = 0;
  const newId = () => `sb-t${process.pid}-${++n}`;

  beforeAll(async () => {
    ({ dataDir, host, client } = await startTestHost());
  });
  // The host as it is at the end (a test may have restarted it).
  afterAll(() => stopTestHost(host && { dataDir, host, client }));

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

  it("records every entrypoint run once, fsync'd once its helper claimed it, in the audit log (not a create that finds the sandbox)", async () => {
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
    expect(lines).toEqual([
      {
        at: expect.any(String),
        event: 'entrypoint_start',
        sandboxId: id,
        orgId: 'org1',
        hostId: 'test-host',
        owner: { kind: 'session', id: sessionId },
        run: expect.stringMatching(/^[0-9a-f]{16}$/),
      },
    ]);
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
    await fsp.writeFile(
      stateFile(never.id),
      JSON.stringify({ ...st, entrypoint: { wrapper: { pid: 0, start: -1 }, startedAt: new Date().toISOString(), starting: true } }),
    );
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
    await expect(client.createSandbox({ id: bad, orgId: 'o', entrypoint: { argv: ['true'] }, awaitExit: { waitMs: -1 } })).rejects.toMatchObject({
      type: 'invalid_request',
      status: 400,
    });
    await expect(
      client.createSandbox({ id: bad, orgId: 'o', entrypoint: { argv: ['true'] }, awaitExit: { waitMs: 10, readFile: { path: '', maxBytes: 0 } } }),
    ).rejects.toMatchObject({ type: 'invalid_request', status: 400 });
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
    expect((await providerSh(host.provider, id, `ln -s /etc/passwd /workspace/pw && ln -s ${dataDir} /workspace/dd`)).code).toBe(0);
    const pw = (await client.readFile(id, '/workspace/pw'))?.toString() ?? '';
    expect(pw).toContain('root:x:0:0');
    expect(pw).not.toContain('daemon:');
    expect(await client.readFile(id, '/workspace/dd/sandboxes/' + id + '/state.json')).toBeNull();
    // The overlays are in the sandbox's own mount namespace, not the host's; files go through its init's root.
    expect(hostMountsOf(id)).toEqual([]);
    const mine = await fsp.readFile(`/proc/${await initPid(dataDir, id)}/mountinfo`, 'utf8');
    // Named after the sandbox, or "sandbox" when a spare made it whole ahead of the create (docs/isolation.md).
    expect(mine).toMatch(new RegExp(` / \\S+ - overlay (${id}|sandbox) `));
    expect(mine).toMatch(new RegExp(` /usr \\S+ - overlay (${id}|sandbox) `));
    // Its layers are named by relative names only: no host path in the sandbox's mount table.
    // (l0 is the base; the agent SDK's layer, when the toolchain installed it, comes after it as l1.)
    expect(mine).toMatch(/lowerdir=l0(:l\d+)*,upperdir=w\/root,workdir=w\/work-root/);
    expect(mine).not.toContain(dataDir);
    // A parent directory that is a symlink to a host path is resolved inside the sandbox, and so is `..`.
    const hostDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-host-only-'));
    await fsp.writeFile(path.join(hostDir, 'secret'), 'HOST');
    expect((await providerSh(host.provider, id, `ln -s ${hostDir} /workspace/hd && ln -s ../../../../etc /workspace/up`)).code).toBe(0);
    expect(await client.readFile(id, '/workspace/hd/secret')).toBeNull();
    await client.writeFile(id, '/workspace/hd/secret', 'sandbox');
    expect(await fsp.readFile(path.join(hostDir, 'secret'), 'utf8')).toBe('HOST');
    expect((await providerSh(host.provider, id, `cat ${hostDir}/secret`)).stdout).toBe('sandbox');
    expect((await client.readFile(id, '/workspace/up/passwd'))?.toString()).toBe(pw);
    // The sandbox's /proc and /dev are other mounts: refused, and nothing is created there.
    await expect(client.readFile(id, '/proc/1/cmdline')).rejects.toMatchObject({ type: 'invalid_request' });
    await expect(client.readFile(id, '/proc/sys/kernel/hostname')).rejects.toMatchObject({ type: 'invalid_request' });
    await expect(client.writeFile(id, '/dev/sap-x/y', 'x')).rejects.toMatchObject({ type: 'invalid_request' });
    expect((await providerSh(host.provider, id, 'ls /dev/sap-x 2>&1 || echo absent')).stdout).toContain('absent');
    // /usr is the sandbox's own overlay, writable through the files API without touching the host's.
    await client.writeFile(id, '/usr/local/sap-files-marker', 'usr');
    expect((await providerSh(host.provider, id, 'cat /usr/local/sap-files-marker')).stdout).toBe('usr');
    expect(existsSync('/usr/local/sap-files-marker')).toBe(false);
    // The sandbox swaps a directory for a symlink to the host directory as fast as it can, while the
    // host reads and writes through it: the host's file is never read or written.
    expect(
      (await providerSh(host.provider, id, `mkdir -p /workspace/race/d && echo sandbox > /workspace/race/d/secret && ln -s ${hostDir} /workspace/race/l`)).code,
    ).toBe(0);
    // Through the real directory, before the race: the read path works.
    expect((await client.readFile(id, '/workspace/race/d/secret'))?.toString()).toBe('sandbox\n');
    const swapper = host.provider.spawn(id, {
      argv: ['/bin/bash', '-c', 'cd /workspace/race; while :; do mv -T d t; mv -T l d; mv -T d l; mv -T t d; done'],
    });
    swapper.stdin?.end();
    try {
      const seen = new Set<string>();
      for (let i = 0; i < 300; i++) {
        const got = await client.readFile(id, '/workspace/race/d/secret').then(
          (b) => b?.toString() ?? 'missing',
          (e: HostError) => `${e.type}: ${e.message}`,
        );
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
    expect((await providerSh(host.provider, id, 'echo from-shell > /workspace/shell.txt && echo tool > /usr/local/bin/sap-tool')).code).toBe(0);
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
});
