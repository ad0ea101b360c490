import fs from 'node:fs';
import path from 'node:path';
import { api, T, unique } from './env';

/**
 * The escape probes of the isolation suite: one Python script (test/helpers/isolation-probes.py)
 * that runs every probe and prints one JSON object {probeName: {ok, detail}}. It runs in any
 * sandbox (python3 is on the host's /usr, which every sandbox sees). See the script for what each
 * probe does and why it is harmless when it succeeds.
 */
export const PROBE_SCRIPT = fs.readFileSync(path.join(__dirname, 'isolation-probes.py'), 'utf8');

export interface ProbeResult {
  ok: boolean;
  detail: string;
}
export type ProbeResults = Record<string, ProbeResult>;

/** Calls that must fail with EPERM (the seccomp filter, modelled on Docker's default profile). */
export const REFUSED_SYSCALLS = [
  'keyctl',
  'add_key',
  'request_key',
  'bpf',
  'perf_event_open',
  'userfaultfd',
  'init_module',
  'finit_module',
  'delete_module',
  'kexec_load',
  'kexec_file_load',
  'reboot',
  'swapon',
  'swapoff',
  'clock_settime',
  'settimeofday',
  'acct',
  'quotactl',
  'open_by_handle_at',
  'mount',
  'umount2',
  'pivot_root',
  'open_tree',
  'move_mount',
  'fsopen',
  'fsconfig',
  'fsmount',
  'fspick',
  'mount_setattr',
];

/** Host-global sysctls a sandbox must not write (each probe writes back the value it just read). */
export const HOST_SYSCTLS = ['kernel.core_pattern', 'kernel.pid_max', 'fs.file-max', 'vm.overcommit_memory', 'kernel.panic'];

/** Every probe the script reports, by the name it reports it under: the table of the suite. */
export const PROBES: string[] = [
  // identity, user namespace, privileges
  'id -u is 0',
  'uid_map maps 0 to a non-zero host uid, 65536 long',
  'gid_map maps 0 to a non-zero host gid, 65536 long',
  "capabilities within Docker's default set, with CHOWN/DAC_OVERRIDE/FOWNER/SETUID/SETGID",
  'NoNewPrivs: 1',
  'root can chown a file to 1000:1000',
  'root can setgid/setuid to 1000',
  // host-global sysctls
  ...HOST_SYSCTLS.map((s) => `sysctl ${s} is not writable`),
  'sysctl vm.drop_caches cannot be opened for writing',
  // seccomp
  'Seccomp: 2',
  ...REFUSED_SYSCALLS.map((s) => `syscall ${s} -> EPERM`),
  'syscall unshare(CLONE_NEWUSER) -> EPERM',
  'syscall clone(CLONE_NEWUSER|SIGCHLD) -> EPERM',
  'syscall clone3 -> ENOSYS',
  // nested namespaces through the usual commands
  'command `unshare -U true` fails',
  'command `unshare -m true` fails',
  // /proc
  ...['/proc/kcore', '/proc/keys', '/proc/timer_list', '/proc/sched_debug'].map((p) => `${p} reads empty or fails`),
  ...['/proc/acpi', '/proc/scsi'].map((p) => `${p} is empty or unreadable`),
  ...['/proc/sys', '/proc/sysrq-trigger', '/proc/irq', '/proc/bus', '/proc/fs'].map((p) => `${p} is read-only`),
  // host layout
  ...['/proc/self/mountinfo', '/proc/1/mountinfo', '/proc/self/mounts'].map((p) => `${p} names no host path (DATA_DIR, /dev/shm/sap-, upperdir=/)`),
  'environment names no host path',
];

/** The script's argument: the host paths it must not find, and where to write the result. */
export const probeConfig = (out?: string): string => JSON.stringify({ dataDir: T.dataDir(), ...(out ? { out } : {}) });

/** Parses the script's output (its last line), or throws with what it printed. */
export function parseProbeOutput(stdout: string, stderr = ''): ProbeResults {
  const last = stdout.trim().split('\n').pop() ?? '';
  try {
    return JSON.parse(last) as ProbeResults;
  } catch {
    throw new Error(`probe script printed no JSON: stdout ${stdout.slice(-500)} stderr ${stderr.slice(-1000)}`);
  }
}

/** Runs the probe script in an /api sandbox through POST /api/sandboxes/{id}/exec/run (`sudo`: through `sudo -n`, from the sandbox user). */
export async function probeApiSandbox(sandboxId: string, opts: { sudo?: boolean } = {}): Promise<ProbeResults> {
  const argv = ['python3', '-c', PROBE_SCRIPT, probeConfig()];
  const [cmd, ...args] = opts.sudo ? ['sudo', '-n', ...argv] : argv;
  const r = await api('POST', `/api/sandboxes/${sandboxId}/exec/run`, { body: { cmd, args, timeout: 60 } });
  if (r.status !== 200) throw new Error(`exec/run of the probe script: ${r.status} ${JSON.stringify(r.body)}`);
  if (r.body.exitCode !== 0) throw new Error(`probe script exited ${r.body.exitCode}: ${String(r.body.stderr).slice(-1000)}`);
  return parseProbeOutput(r.body.stdout, r.body.stderr);
}

export const PROBE_PATH = '/tmp/sap-isolation-probes.py';

/** An agent whose entrypoint runs the probe script and writes its results to /tmp/agent_result.json. */
export async function createProbeAgent(): Promise<string> {
  const id = unique('isoprobe');
  const r = await api('POST', '/v1/agents', {
    body: {
      id,
      core: 'python',
      entrypoint: ['python3', PROBE_PATH, probeConfig('/tmp/agent_result.json')],
      files: { [PROBE_PATH]: PROBE_SCRIPT },
      timeoutSeconds: 120,
    },
  });
  if (r.status !== 201) throw new Error(`create probe agent: ${r.status} ${JSON.stringify(r.body)}`);
  return id;
}

/** Waits (long polls of GET …/result?wait=30) for a session's result; throws after `timeoutMs`. */
export async function sessionResult(agentId: string, sessionId: string, timeoutMs = 90_000): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await api('GET', `/v1/agents/${agentId}/sessions/${sessionId}/result?wait=30`);
    if (r.status === 200) return r.body;
    if (r.status !== 409 || Date.now() > deadline) throw new Error(`session ${sessionId} result: ${r.status} ${JSON.stringify(r.body)}`);
  }
}

/** Host free bytes of the filesystem holding `p` (what a sandbox's writes must not eat into). */
export function freeBytes(p: string): number {
  const s = fs.statfsSync(p);
  return s.bavail * s.bsize;
}
