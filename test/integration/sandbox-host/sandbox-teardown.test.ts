/**
 * Destroy's teardown behind its answer (sandbox/namespaces/teardowns.ts): a destroyed sandbox runs
 * nothing any more when destroy answers, and what is left of it is written down in
 * DATA_DIR/teardown; a host killed with -9 while 50 teardowns are pending finishes them at its next
 * start and leaves nothing behind: no cgroups, links, loop devices, disk images, directories or id
 * slots. The first host is a process of its own (node dist/sandbox/host/main.js, so that it can be
 * killed), on a network of its own inside this run's slot (SANDBOX_NET_*: a /23 in its middle and the
 * id slots after the stack host's); its teardowns are held (SANDBOX_TEST_TEARDOWN_PAUSE_FILE) so that
 * all 50 are pending when it dies. Needs root, overlayfs and cgroup v1 (the machine described in TOOLCHAIN.md).
 */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { promises as fsp, existsSync, readdirSync, readFileSync } from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import pino from 'pino';
import { PROJECT_ROOT } from '../../../config';
import { HostClient } from '../../../sandbox/host-contract/client';
import { startHost, type RunningHost } from '../../../sandbox/host/server';
import { createSandboxProvider } from '../../../sandbox/factory';
import { SandboxNetwork, parseCidr } from '../../../sandbox/network';
import { ID_COUNT } from '../../../sandbox/id-slots';
import { eventually } from '../../helpers/env';
import { TOKEN, isRunning, pidsOfCgroup } from '../../helpers/sandbox-host';

jest.setTimeout(300_000);

const COUNT = 50;
const NAME = `${process.env.SANDBOX_NET_NAME ?? 'sap'}k`.slice(0, 8);

/** A /23 in the middle of this run's pool (away from the stack host's first slots and its last address), and id slots past the stack host's. */
function ownNetwork(): { cidr: string; idBase: number } {
  const pool = parseCidr(process.env.SANDBOX_NET_CIDR ?? '100.127.0.0/16', 'SANDBOX_NET_CIDR');
  const size = 2 ** (32 - pool.bits);
  const start = pool.base + size / 2;
  const ip = [24, 16, 8, 0].map((s) => (start >>> s) & 255).join('.');
  const idBase = Number(process.env.SANDBOX_ID_BASE ?? 1 << 30) + (size / 4) * ID_COUNT;
  return { cidr: `${ip}/23`, idBase };
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

/** Our links on the host (`<name>-<slot>`). */
const links = () =>
  execFileSync('ip', ['-o', 'link', 'show'], { encoding: 'utf8' })
    .split('\n')
    .map((l) => /^\d+: ([^@:]+)/.exec(l)?.[1])
    .filter((n): n is string => !!n && n.startsWith(`${NAME}-`));

/** Loop devices whose image lies under `dir`. */
const loopsUnder = (dir: string) =>
  readdirSync('/sys/block')
    .filter((d) => d.startsWith('loop'))
    .map((d) => {
      try {
        return readFileSync(`/sys/block/${d}/loop/backing_file`, 'utf8').trim();
      } catch {
        return '';
      }
    })
    .filter((f) => f.startsWith(dir));

/** Cgroups (any controller) named after one of `ids`, or left by a teardown (`gone-<id>.…`). */
const groupsOf = (ids: string[]) =>
  ['memory', 'pids', 'cpu', 'cpuacct', 'freezer'].flatMap((c) =>
    (existsSync(`/sys/fs/cgroup/${c}/sap`) ? readdirSync(`/sys/fs/cgroup/${c}/sap`) : [])
      .filter((n) => ids.some((id) => n === id || n.startsWith(`gone-${id}.`)))
      .map((n) => `${c}/${n}`),
  );

describe('sandbox host (namespaces): teardown behind destroy', () => {
  let dataDir: string;
  let child: ChildProcess | undefined;
  let host: RunningHost | undefined;
  const { cidr, idBase } = ownNetwork();

  beforeAll(async () => {
    dataDir = await fsp.realpath(await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-teardown-')));
  });

  /** A host on `dataDir` in this process, without spares: its start finishes the teardowns written down there. */
  const restart = async () => {
    const log = pino({ level: 'silent' });
    const network = new SandboxNetwork({ name: NAME, cidr, dnsPort: await freePort(), log });
    const provider = createSandboxProvider({ kind: 'namespaces', dataDir, hostId: 'test-host-teardown', network, idBase, poolSize: 0 });
    host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', provider });
    return provider;
  };

  afterAll(async () => {
    if (child && child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await new Promise((r) => child!.once('exit', r));
    }
    // A test that failed before the restart left its teardowns written down: a start finishes them.
    if (!host && child) await restart();
    if (host) {
      const c = new HostClient({ url: host.url, token: TOKEN });
      for (const sb of await c.listSandboxes()) await c.destroySandbox(sb.id);
      await host.close();
    }
    try {
      execFileSync('nft', ['delete', 'table', 'inet', NAME], { stdio: 'ignore' });
    } catch {
      /* never made */
    }
    await fsp.rm(dataDir, { recursive: true, force: true });
  });

  it('finishes, after a kill -9 of its host, the 50 teardowns it had pending: nothing is left behind', async () => {
    const port = await freePort();
    const pause = path.join(dataDir, 'hold-teardowns');
    await fsp.writeFile(pause, '');
    child = spawn(process.execPath, [path.join(PROJECT_ROOT, 'dist', 'sandbox', 'host', 'main.js')], {
      env: {
        ...process.env,
        DATA_DIR: dataDir,
        HOST_TOKEN: TOKEN,
        HOST_ID: 'test-host-teardown',
        HOST_LISTEN: `127.0.0.1:${port}`,
        HOST_MAX_SANDBOXES: String(COUNT + 10),
        LOG_LEVEL: 'warn',
        SANDBOX_SCRATCH_DIR: 'off',
        SANDBOX_AUDIT_LOG: 'off',
        SANDBOX_POOL_SIZE: '4',
        SANDBOX_NET_NAME: NAME,
        SANDBOX_NET_CIDR: cidr,
        SANDBOX_ID_BASE: String(idBase),
        SANDBOX_DNS_PORT: String(await freePort()),
        SANDBOX_SEAL: 'off',
        SANDBOX_TEST_TEARDOWN_PAUSE_FILE: pause,
      },
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    const exited = new Promise<void>((r) => child!.once('exit', () => r()));
    const client = new HostClient({ url: `http://127.0.0.1:${port}`, token: TOKEN });
    await eventually(async () => (await client.listSandboxes().catch(() => null)) !== null, 60_000, 100);

    const ids = Array.from({ length: COUNT }, (_, i) => `sb-td${process.pid}-${i}`);
    for (let i = 0; i < COUNT; i += 5) {
      await Promise.all(ids.slice(i, i + 5).map((id) => client.createSandbox({ id, orgId: 'o', entrypoint: { argv: ['sleep', '300'] } })));
    }
    const pids = ids.flatMap((id) => pidsOfCgroup(id));
    expect(pids.length).toBeGreaterThanOrEqual(COUNT * 2);
    const sandboxLinks = ids.map((id) => JSON.parse(readFileSync(path.join(dataDir, 'sandboxes', id, 'state.json'), 'utf8')).link.ifname as string);
    for (const l of sandboxLinks) expect(links()).toContain(l);

    // Destroy answers once the sandbox runs nothing: its processes are gone, its names free, the rest written down.
    for (let i = 0; i < COUNT; i += 10) {
      const answers = await Promise.all(ids.slice(i, i + 10).map((id) => client.destroySandbox(id)));
      expect(answers).toEqual(Array(answers.length).fill(true));
    }
    for (const pid of pids) expect(isRunning(Number(pid))).toBe(false);
    for (const id of ids) {
      expect(await client.getSandbox(id)).toBeNull();
      expect(existsSync(path.join(dataDir, 'sandboxes', id))).toBe(false);
      expect(existsSync(`/sys/fs/cgroup/pids/sap/${id}`)).toBe(false);
    }
    const pending = readdirSync(path.join(dataDir, 'teardown')).filter((n) => n.endsWith('.json'));
    expect(pending).toHaveLength(COUNT);
    expect(groupsOf(ids).length).toBeGreaterThanOrEqual(COUNT);

    child.kill('SIGKILL');
    await exited;

    // The next start (this process, without the hold) finishes them before it makes anything.
    const provider = await restart();
    expect(readdirSync(path.join(dataDir, 'teardown'))).toEqual([]);
    expect(groupsOf(ids)).toEqual([]);
    expect(readdirSync(path.join(dataDir, 'spares'))).toEqual([]);
    expect(readdirSync(path.join(dataDir, 'sandboxes'))).toEqual([]);
    expect(readdirSync(path.join(dataDir, 'disks')).filter((f) => !f.startsWith(`pool-${process.pid}-`) && !f.startsWith(`template-${process.pid}-`))).toEqual(
      [],
    );
    expect((provider as unknown as { idSlots: { used: Set<number> } }).idSlots.used.size).toBe(0);
    // Links and loop devices go with their sandbox's last process (the kernel frees them behind it).
    await eventually(async () => links().length === 0 && loopsUnder(dataDir).length === 0, 30_000, 50);
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(dataDir);
  });
});
