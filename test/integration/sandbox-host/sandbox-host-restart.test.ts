/**
 * The sandbox host against real sandboxes: its scratch directory, restarts and reboots (sandboxes and
 * entrypoints kept, half-made ones removed), and a data directory too long for the helpers' socket
 * (create latency: `npm run bench -- host-create`, scripts/bench-host-create.ts). Needs root, overlayfs and cgroup v1 (the machine described in TOOLCHAIN.md).
 */
import { promises as fsp, existsSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { HostClient } from '../../../sandbox/host-contract/client';
import { startHost, type RunningHost } from '../../../sandbox/host/server';
import { eventually } from '../../helpers/env';
import { TOKEN, hostMountsOf, isRunning, killAllOf, pidsOfCgroup, providerSh, readySpares, startTestHost, stopTestHost } from '../../helpers/sandbox-host';

describe('sandbox host (namespaces): scratch, restarts, reboots', () => {
  let dataDir: string;
  let host: RunningHost;
  let client: HostClient;
  let n = 0;
  const newId = () => `sb-tr${process.pid}-${++n}`;

  beforeAll(async () => {
    ({ dataDir, host, client } = await startTestHost());
  });
  // The host as it is at the end (a test may have restarted it).
  afterAll(() => stopTestHost(host && { dataDir, host, client }));

  it("keeps a session's sandbox files on the scratch tmpfs, linked from DATA_DIR, and removes both; cleans up after a reboot", async () => {
    const scratch = (host.provider as unknown as { scratchDir: string | null }).scratchDir;
    expect(scratch).toMatch(/^\/dev\/shm\/sap-sandboxes-[0-9a-f]{12}$/);
    const id = newId();
    await client.createSandbox({
      id,
      orgId: 'o',
      owner: { kind: 'session', id: 'sess_x' },
      files: { '/tmp/in.json': '{"a":1}' },
      entrypoint: { argv: ['bash', '-c', 'cp /tmp/in.json /tmp/out.json'] },
      awaitExit: { waitMs: 10_000, readFile: { path: '/tmp/out.json', maxBytes: 100 } },
    });
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
    // Killed and out of the cgroup: wait until they have finished exiting.
    const alive = () => pids.filter((pid) => isRunning(Number(pid)));
    await eventually(async () => alive().length === 0, 10_000, 20);
    expect(existsSync(path.join(dataDir, 'sandboxes', id))).toBe(false);
    expect(await fsp.readFile('/proc/mounts', 'utf8')).not.toContain(id);
    expect(existsSync(`/sys/fs/cgroup/pids/sap/${id}`)).toBe(false);
    for (const c of ['memory', 'pids', 'cpu', 'freezer']) expect(existsSync(`/sys/fs/cgroup/${c}/sap/${stale}`)).toBe(false);
  });

  it('keeps sandboxes and entrypoints across a host restart', async () => {
    const id = newId();
    // The entrypoint runs until the test lets it go (a file it waits for), however long the restart takes.
    await client.createSandbox({
      id,
      orgId: 'o',
      entrypoint: { argv: ['bash', '-c', 'until [ -e /tmp/go ]; do sleep 0.05; done; echo survived; exit 5'] },
    });
    await host.close();
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', network: null, hostId: 'test-host' });
    client = new HostClient({ url: host.url, token: TOKEN });
    expect(await client.getSandbox(id)).toMatchObject({ status: 'running' });
    expect(await client.entrypointStatus(id)).toMatchObject({ state: 'running' });
    await client.writeFile(id, '/tmp/go', '');
    expect(await client.entrypointStatus(id, { waitMs: 10000 })).toMatchObject({ state: 'exited', exitCode: 5 });
    expect((await client.entrypointOutput(id)).toString()).toBe('survived\n');
    expect((await providerSh(host.provider, id, 'echo still-alive')).stdout).toBe('still-alive\n');
    // The adopted sandbox's files, through its init's root.
    await client.writeFile(id, '/workspace/after-restart', 'adopted');
    expect((await providerSh(host.provider, id, 'cat /workspace/after-restart')).stdout).toBe('adopted');
  });

  it('after a reboot (every sandbox process gone), marks the sandbox stopped and destroys it cleanly', async () => {
    const id = newId();
    await client.createSandbox({ id, orgId: 'o', entrypoint: { argv: ['sleep', '300'] } });
    await host.close();
    const pids = pidsOfCgroup(id);
    killAllOf(pids);
    const alive = () => pids.filter((pid) => isRunning(Number(pid)));
    await eventually(async () => alive().length === 0, 10_000, 20);
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', network: null, hostId: 'test-host' });
    client = new HostClient({ url: host.url, token: TOKEN });
    expect(await client.getSandbox(id)).toMatchObject({ status: 'stopped' });
    await expect(client.readFile(id, '/workspace/x')).rejects.toMatchObject({ type: 'conflict' });
    expect(await client.destroySandbox(id)).toBe(true);
    expect(existsSync(path.join(dataDir, 'sandboxes', id))).toBe(false);
    expect(hostMountsOf(id)).toEqual([]);
    expect(existsSync(`/sys/fs/cgroup/pids/sap/${id}`)).toBe(false);
  });
});

describe("sandbox host (namespaces), data directory too long for the helpers' socket there", () => {
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

  it("listens for its init helpers in a private directory of the system's temporary directory instead, and starts sandboxes the same way", async () => {
    expect(existsSync(path.join(dataDir, 'init.sock'))).toBe(false);
    const [spare] = await eventually(async () => (readySpares().length >= 1 ? readySpares() : null), 10_000, 20);
    const [helper] = pidsOfCgroup(spare!);
    // Started by the spawner, not forked by the host.
    expect(Number(/^PPid:\s+(\d+)/m.exec(require('node:fs').readFileSync(`/proc/${helper}/status`, 'utf8'))![1])).not.toBe(process.pid);
    // From the pool's spares (a burst past a pool starts its own: sandbox-pool.test.ts).
    const ids = [1, 2, 3].map((i) => `sb-long${process.pid}-${i}`);
    await Promise.all(ids.map((id) => client.createSandbox({ id, orgId: 'o', files: { '/workspace/f': id } })));
    for (const id of ids) {
      expect((await client.readFile(id, '/workspace/f'))?.toString()).toBe(id);
      expect((await providerSh(host.provider, id, 'hostname')).stdout).toBe(`${id}\n`);
      expect(hostMountsOf(id)).toEqual([]);
    }
    for (const id of ids) expect(await client.destroySandbox(id)).toBe(true);
    for (const id of ids) expect(existsSync(`/sys/fs/cgroup/pids/sap/${id}`)).toBe(false);
  });
});
