/**
 * The pool of spare init helpers (SANDBOX_POOL_SIZE, sandbox/namespaces/init-helpers.ts): filled to
 * its size with bounded idle cgroups, claimed by creates (a burst past it starts helpers of its own),
 * refilled once creates have ended, never shared between sandboxes, off at 0, and gone with its host.
 * Needs root, overlayfs and cgroup v1 (the machine described in TOOLCHAIN.md).
 */
import { promises as fsp, existsSync, readFileSync, readdirSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { HostClient } from '../../../sandbox/host-contract/client';
import { startHost, type RunningHost } from '../../../sandbox/host/server';
import { createSandboxProvider } from '../../../sandbox/factory';
import { poolSizeFromEnv, DEFAULT_POOL_SIZE } from '../../../sandbox/namespaces/init-helpers';
import type { NamespaceProvider } from '../../../sandbox/namespaces/provider';
import { eventually } from '../../helpers/env';
import { TOKEN, isRunning, pidsOfCgroup, providerSh, readySpares } from '../../helpers/sandbox-host';

/** Every cgroup (any controller) of this process's spares, ready or not. */
const spareGroups = () =>
  ['memory', 'pids', 'cpu', 'freezer'].flatMap((c) =>
    readdirSync(`/sys/fs/cgroup/${c}/sap`)
      .filter((n) => n.startsWith(`spare-${process.pid}-`))
      .map((n) => `${c}/${n}`),
  );

describe('sandbox host (namespaces): the pool of spare init helpers', () => {
  let dataDir: string;
  let host: RunningHost | undefined;
  let client: HostClient;
  let n = 0;
  const newId = () => `sb-pool${process.pid}-${++n}`;
  const start = async (poolSize: number) => {
    const provider = createSandboxProvider({ kind: 'namespaces', dataDir, hostId: 'test-host-pool', network: null, poolSize });
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', provider });
    client = new HostClient({ url: host.url, token: TOKEN });
  };
  const stop = async () => {
    if (!host) return;
    for (const sb of await client.listSandboxes()) await client.destroySandbox(sb.id);
    await host.close();
    host = undefined;
  };

  beforeAll(async () => {
    dataDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-host-pool-'));
  });

  afterEach(stop);

  afterAll(async () => {
    await stop();
    await fsp.rm(dataDir, { recursive: true, force: true });
  });

  it('reads SANDBOX_POOL_SIZE: default, 0, and refuses what is not an integer in range', () => {
    expect(poolSizeFromEnv({})).toBe(DEFAULT_POOL_SIZE);
    expect(poolSizeFromEnv({ SANDBOX_POOL_SIZE: '0' })).toBe(0);
    expect(poolSizeFromEnv({ SANDBOX_POOL_SIZE: ' 12 ' })).toBe(12);
    for (const bad of ['-1', '1.5', 'many', '257', '1e3']) expect(() => poolSizeFromEnv({ SANDBOX_POOL_SIZE: bad })).toThrow(/SANDBOX_POOL_SIZE/);
  });

  it('fills to its size, each spare a whole idle sandbox in small cgroups of its own; a burst past it works and each sandbox is fresh', async () => {
    await start(3);
    const spares = await eventually(async () => (readySpares().length === 3 ? readySpares() : null), 15_000, 20);
    for (const spare of spares) {
      // Made whole ahead: its helper and the sandbox's idle pid 1.
      expect(pidsOfCgroup(spare)).toHaveLength(2);
      expect(readFileSync(`/sys/fs/cgroup/memory/sap/${spare}/memory.limit_in_bytes`, 'utf8').trim()).toBe(String(16 * 1024 * 1024));
      expect(readFileSync(`/sys/fs/cgroup/pids/sap/${spare}/pids.max`, 'utf8').trim()).toBe('8');
    }
    const helpers = spares.map((s) => pidsOfCgroup(s)[0]!);
    // A burst of 5: 3 from the pool, 2 start helpers of their own.
    const ids = Array.from({ length: 5 }, () => newId());
    await Promise.all(ids.map((id) => client.createSandbox({ id, orgId: `org-${id}`, memoryMB: 64, maxProcesses: 40 })));
    const owners = new Map<string, string>();
    for (const id of ids) {
      // Every helper serves one sandbox only; a pooled one carries the sandbox's own limits, not the spare's.
      const [helper] = pidsOfCgroup(id).filter((p) => helpers.includes(p));
      if (helper) {
        expect(owners.has(helper)).toBe(false);
        owners.set(helper, id);
      }
      expect(readFileSync(`/sys/fs/cgroup/memory/sap/${id}/memory.limit_in_bytes`, 'utf8').trim()).toBe(String(64 * 1024 * 1024));
      expect(readFileSync(`/sys/fs/cgroup/pids/sap/${id}/pids.max`, 'utf8').trim()).toBe('40');
      const r = await providerSh(host!.provider, id, 'hostname; ls -A /workspace /tmp; echo mine > /workspace/owner; cat /workspace/owner');
      expect(r.stdout).toBe(`${id}\n/tmp:\n\n/workspace:\nmine\n`);
    }
    expect(owners.size).toBe(3);
    // Refilled once the creates have ended, with new helpers.
    const next = await eventually(
      async () => (readySpares().length === 3 && !readySpares().some((s) => spares.includes(s)) ? readySpares() : null),
      15_000,
      20,
    );
    for (const id of ids) expect(await client.destroySandbox(id)).toBe(true);
    // A sandbox from the refilled pool sees nothing of the ones before it.
    const id = newId();
    await client.createSandbox({ id, orgId: 'another-org' });
    expect(next.some((s) => !existsSync(`/sys/fs/cgroup/pids/sap/${s}`))).toBe(true);
    expect((await providerSh(host!.provider, id, 'ls -A /workspace /tmp; hostname')).stdout).toBe(`/tmp:\n\n/workspace:\n${id}\n`);
  });

  it('keeps no spare at SANDBOX_POOL_SIZE=0, and creates still work', async () => {
    await start(0);
    const id = newId();
    await client.createSandbox({ id, orgId: 'o' });
    expect((await providerSh(host!.provider, id, 'hostname')).stdout).toBe(`${id}\n`);
    // Refills start synchronously when a create ends (init-helpers.ts refill): none was started.
    expect((host!.provider as NamespaceProvider).poolState()).toEqual({ ready: 0, starting: 0, size: 0 });
    expect(spareGroups()).toEqual([]);
  });

  it('leaves no spare process or cgroup behind when the host stops, even with spares still starting', async () => {
    await start(6);
    await eventually(async () => readySpares().length >= 2, 15_000, 20);
    const pids = readySpares().flatMap((s) => pidsOfCgroup(s));
    expect(pids.length).toBeGreaterThanOrEqual(2);
    await stop();
    expect(spareGroups()).toEqual([]);
    expect(pids.filter((p) => isRunning(Number(p)))).toEqual([]);
  });
});
