/**
 * Helpers of the sandbox host's tests (test/integration/sandbox-host/*.test.ts): run a program inside a
 * sandbox straight through the provider, and look at the host's cgroups, mounts and processes.
 */
import { promises as fsp, existsSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { HostClient } from '../../sandbox/host-contract/client';
import { startHost, type RunningHost } from '../../sandbox/host/server';
import type { SandboxProvider } from '../../sandbox/driver';

/** CapEff of sandbox root: Docker's default set (CHOWN … SETFCAP), inside the sandbox's user namespace. */
export const DEFAULT_CAPS = '00000000a80425fb';
export const TOKEN = 'test-token-' + Math.random().toString(36).slice(2);

/** Runs a bash script inside a live sandbox through the provider. */
export function providerSh(provider: SandboxProvider, id: string, script: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
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

/** The pids in the sandbox's cgroup of `controller` (none when it has no such cgroup). */
export function pidsOfCgroup(id: string, controller = 'pids'): string[] {
  const f = `/sys/fs/cgroup/${controller}/sap/${id}/cgroup.procs`;
  return existsSync(f) ? require('node:fs').readFileSync(f, 'utf8').split('\n').filter(Boolean) : [];
}

/** The host's mount table lines that mention `id` (a sandbox of the init helper has none, ever). */
export function hostMountsOf(id: string): string[] {
  return require('node:fs')
    .readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l: string) => l.includes(id));
}

/** The sandbox's init (pid 1 of its namespaces) from its state.json. */
export async function initPid(dataDir: string, id: string): Promise<number> {
  const state = JSON.parse(await fsp.readFile(path.join(dataDir, 'sandboxes', id, 'state.json'), 'utf8'));
  return state.init.ns.pid as number;
}

/**
 * Cgroups (pids controller) of this process's spares made whole: the helper (first) and the sandbox's
 * idle pid 1, the helper connected to the host (its descriptor 3 a socket, see sap-sandbox-init -w).
 */
export function readySpares(): string[] {
  const fs = require('node:fs');
  const names: string[] = fs.readdirSync('/sys/fs/cgroup/pids/sap');
  const connected = (pid: string | undefined) => {
    try {
      return pid !== undefined && String(fs.readlinkSync(`/proc/${pid}/fd/3`)).startsWith('socket:');
    } catch {
      return false;
    }
  };
  return names.filter((n) => n.startsWith(`spare-${process.pid}-`) && pidsOfCgroup(n).length === 2 && connected(pidsOfCgroup(n)[0]));
}

/** True while the process exists and is not a zombie (it may vanish between two looks). */
export function isRunning(pid: number): boolean {
  try {
    return !/\) [ZX] /.test(require('node:fs').readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

/** SIGKILLs each process; one already gone (the init's death takes its namespace along) is fine. */
export function killAllOf(pids: (number | string)[]): void {
  for (const pid of pids) {
    try {
      process.kill(Number(pid), 'SIGKILL');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
    }
  }
}

/** Runs argv inside a live sandbox through the provider; answers how the host saw it end. */
export function providerRun(
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

/** The helper every process entering a sandbox goes through. */
export const ENTER_HELPER = path.join(__dirname, '..', '..', '.tools', 'bin', 'sap-sandbox-enter');

/** A sandbox host of a test file's own (network off) on a temporary data directory, and its client. */
export interface TestHost {
  dataDir: string;
  host: RunningHost;
  client: HostClient;
}

export async function startTestHost(): Promise<TestHost> {
  const dataDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-host-'));
  const host = await startHost({ dataDir, token: TOKEN, listen: '127.0.0.1:0', network: null, hostId: 'test-host' });
  return { dataDir, host, client: new HostClient({ url: host.url, token: TOKEN }) };
}

/** Destroys the host's sandboxes, closes it, and removes its data directory and scratch. */
export async function stopTestHost(t: TestHost | undefined): Promise<void> {
  if (!t) return;
  for (const sb of await t.client.listSandboxes()) await t.client.destroySandbox(sb.id);
  const scratch = (t.host.provider as unknown as { scratchDir: string | null }).scratchDir;
  await t.host.close();
  await fsp.rm(t.dataDir, { recursive: true, force: true });
  if (scratch) await fsp.rm(scratch, { recursive: true, force: true });
}
