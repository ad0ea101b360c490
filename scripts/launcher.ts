import { ChildProcess, execFile, spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { createHash } from 'node:crypto';
import os from 'node:os';
import { PROJECT_ROOT, resolveSecretBox } from '../config';
import { SEARCH_ATTRIBUTE_FLAGS } from '../workflows/search-attributes';
import { ProcSpec, Supervisor } from './supervisor';

/** The processes of a one-host stack, in start order. */
export type BaseProcName = 'temporal' | 'mongo' | 'host' | 'worker' | 'api';
/** Every process of a stack: with several hosts, host i > 1 and its worker are `host<i>` and `worker<i>`. */
export type ProcName = BaseProcName | `host${number}` | `worker${number}`;

/** Most sandbox hosts one stack runs (SANDBOX_HOSTS): each gets a /20 of addresses and 2048 id slots. */
export const MAX_STACK_HOSTS = 16;

export interface StackOptions {
  dataDir: string;
  apiPort: number;
  temporalPort: number;
  /** Temporal Web UI port; omit for a headless server (tests). */
  uiPort?: number;
  mongoPort: number;
  hostPort: number;
  /**
   * How many sandbox hosts (each with its worker) to run; default 1. With more than one, host i
   * listens on hostPorts[i-1] (default hostPort + i - 1) and keeps its state in
   * <dataDir>/hosts/<hostId>; see hostEnvironment for what else each gets of its own.
   */
  hosts?: number;
  hostPorts?: number[];
  apiKey: string;
  hostToken: string;
  sandboxProvider?: 'namespaces' | 'process';
  /** Temporal and the MongoDB-wire server are the caller's (scripts/production.ts): neither started nor stopped here. */
  external?: boolean;
  /** What host i of several gets beside hostEnvironment's (e.g. its network and id range); mode of dataDir (default 0700). */
  hostEnv?: (i: number) => Record<string, string>;
  dataDirMode?: number;
  /** Extra environment for the platform's own processes. */
  env?: Record<string, string>;
  /** Lines of our processes' output go here as well as to their log files. */
  echo?: (proc: ProcName, line: string) => void;
  /**
   * Restart a process that exits unexpectedly, with backoff (scripts/supervisor.ts). stop()/kill()
   * are deliberate and never followed by a restart.
   */
  supervise?: boolean;
  /** The supervisor's lines (deaths, restarts, give-ups); they also go to <logDir>/supervisor.log. */
  log?: (line: string) => void;
  /** A process died too often in a row and is no longer restarted (the caller should stop the stack). */
  onGiveUp?: (proc: ProcName, message: string) => void;
}

/** What <dataDir>/stack.json holds while a stack runs: the pids of its running processes and where they listen. */
export interface StackFile {
  pids: Partial<Record<ProcName, number>>;
  apiUrl: string;
  hostUrl: string;
  /** Every host's URL (the first is hostUrl). */
  hostUrls: string[];
  temporalAddress: string;
  mongoUrl: string;
}

/** The path of the stack file of a stack whose state lives in dataDir. */
export const stackFilePath = (dataDir: string): string => path.join(dataDir, 'stack.json');

export interface Stack {
  apiUrl: string;
  uiUrl: string | null;
  temporalAddress: string;
  mongoUrl: string;
  hostUrl: string;
  /** Every host's URL, first host first. */
  hostUrls: string[];
  /** Each host's id and state directory, first host first. */
  hostList: { hostId: string; url: string; dataDir: string; proc: ProcName; worker: ProcName }[];
  /** Environment that our processes (api, worker, host) run with. */
  env: Record<string, string>;
  logDir: string;
  /** Starts (or restarts) one process and waits until it is ready. */
  start(name: ProcName): Promise<void>;
  /** Sends `signal` to one process and waits for it to exit. */
  kill(name: ProcName, signal?: NodeJS.Signals): Promise<void>;
  pid(name: ProcName): number | undefined;
  /** How many times the supervisor restarted `name` after an unexpected exit. */
  restarts(name: ProcName): number;
  /** Stops everything, newest first. With destroySandboxes, the host's sandboxes go too. */
  stop(opts?: { destroySandboxes?: boolean }): Promise<void>;
}

const TOOLS = path.join(PROJECT_ROOT, '.tools', 'bin');
const DIST = path.join(PROJECT_ROOT, 'dist');

export { freePort } from './ports';

async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs: number, proc?: ChildProcess): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (proc && (proc.exitCode !== null || proc.signalCode !== null))
      throw new Error(`${what} exited with ${proc.signalCode ?? `code ${proc.exitCode}`} before it was ready`);
    if (await check().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`${what} not ready after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const tcpOpen = (port: number) => () =>
  new Promise<boolean>((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });

/** True once the dev server answers for the `default` namespace (an open port is not enough). */
const namespaceReady = (address: string) => async () => {
  if (!(await tcpOpen(Number(address.split(':')[1]))())) return false;
  return new Promise<boolean>((resolve) => {
    execFile(path.join(TOOLS, 'temporal'), ['operator', 'namespace', 'describe', '-n', 'default', '--address', address], { timeout: 5000 }, (err) =>
      resolve(!err),
    );
  });
};

const httpOk =
  (url: string, headers: Record<string, string> = {}) =>
  async () =>
    (await fetch(url, { headers })).ok;

/**
 * Starts the whole local stack: the Temporal dev server (persistent SQLite, WAL), FerretDB
 * (persistent SQLite), the sandbox host, one worker and the API. State lives in dataDir.
 */
export async function startStack(o: StackOptions): Promise<Stack> {
  const logDir = path.join(o.dataDir, 'logs');
  // The stack's state and logs are root's alone (0700 directories, 0600 files): closed to other host
  // users. Directories of an older stack are closed too.
  for (const dir of [o.dataDir, logDir]) {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    fs.chmodSync(dir, dir === o.dataDir ? (o.dataDirMode ?? 0o700) : 0o700);
  }
  const temporalAddress = `127.0.0.1:${o.temporalPort}`;
  const mongoUrl = `mongodb://127.0.0.1:${o.mongoPort}/sap`;
  const env: Record<string, string> = {
    ...(process.env as Record<string, string>),
    PORT: String(o.apiPort),
    API_KEY: o.apiKey,
    MONGO_URL: mongoUrl,
    TEMPORAL_ADDRESS: temporalAddress,
    DATA_DIR: o.dataDir,
    HOST_LISTEN: `127.0.0.1:${o.hostPort}`,
    HOST_TOKEN: o.hostToken,
    SANDBOX_PROVIDER: o.sandboxProvider ?? 'namespaces',
    // The console links a session to its workflow in the Temporal UI the stack serves.
    ...(o.uiPort && !process.env.TEMPORAL_UI_URL ? { TEMPORAL_UI_URL: `http://127.0.0.1:${o.uiPort}` } : {}),
    ...o.env,
  };
  const hostCount = o.hosts ?? 1;
  if (!Number.isInteger(hostCount) || hostCount < 1 || hostCount > MAX_STACK_HOSTS)
    throw new Error(`SANDBOX_HOSTS must be an integer from 1 to ${MAX_STACK_HOSTS}: ${o.hosts}`);
  // Several hosts' workers must open the same secrets: they get the key the API uses.
  if (hostCount > 1 && !env.SECRETS_KEY) env.SECRETS_KEY = secretsKeyText(o.dataDir);
  const hostList = Array.from({ length: hostCount }, (_, k) => {
    const i = k + 1;
    const port = o.hostPorts?.[k] ?? o.hostPort + k;
    const own = hostCount === 1 ? {} : { ...hostEnvironment(o.dataDir, env, i, port), ...o.hostEnv?.(i) };
    return {
      i,
      hostId: own.HOST_ID ?? env.HOST_ID ?? os.hostname().replace(/[^\w.-]/g, '-'),
      url: `http://127.0.0.1:${port}`,
      port,
      dataDir: own.DATA_DIR ?? o.dataDir,
      proc: (i === 1 ? 'host' : `host${i}`) as ProcName,
      worker: (i === 1 ? 'worker' : `worker${i}`) as ProcName,
      env: { ...env, ...own },
    };
  });
  for (const h of hostList) fs.mkdirSync(h.dataDir, { recursive: true, mode: 0o700 });
  const hostUrl = hostList[0]!.url;
  const hostUrls = hostList.map((h) => h.url);
  const apiUrl = `http://127.0.0.1:${o.apiPort}`;
  const supervisorLog = openLog(path.join(logDir, 'supervisor.log'));
  let stopping = false;
  let stopped: Promise<void> | undefined;
  const sup = new Supervisor({
    restart: o.supervise ?? false,
    log: (line) => {
      fs.writeSync(supervisorLog, `${new Date().toISOString()} ${line}\n`);
      o.log?.(line);
    },
    onChange: () => {
      if (!stopping) writeStackFile(o.dataDir, { pids: sup.pids(), apiUrl, hostUrl, hostUrls, temporalAddress, mongoUrl });
    },
    onGiveUp: (name, message) => o.onGiveUp?.(name as ProcName, message),
  });
  // NODE_PROFILE_DIR=/tmp/prof writes a V8 CPU profile of the host, worker and API (on a clean stop).
  const nodeArgs = process.env.NODE_PROFILE_DIR ? ['--cpu-prof', `--cpu-prof-dir=${process.env.NODE_PROFILE_DIR}`] : [];

  type Command = { cmd: string; args: string[]; ready: (p: ChildProcess) => Promise<void>; env?: Record<string, string> };
  const commands: Partial<Record<ProcName, () => Command>> = {
    temporal: () => ({
      ...privately(path.join(TOOLS, 'temporal'), [
        'server',
        'start-dev',
        '--ip',
        '127.0.0.1',
        '--port',
        String(o.temporalPort),
        ...(o.uiPort ? ['--ui-port', String(o.uiPort)] : ['--headless']),
        '--db-filename',
        path.join(o.dataDir, 'temporal.db'),
        '--sqlite-pragma',
        'journal_mode=wal',
        '--sqlite-pragma',
        'synchronous=normal',
        // The file grows by about 25 KB per finished workflow (kept for the namespace's retention);
        // SQLite's default page cache (2 MB) soon holds a small part of its indexes, and every
        // lookup becomes a read through the kernel. A 256 MB cache and memory-mapped reads keep
        // the per-session cost flat over tens of thousands of sessions (README, Performance).
        '--sqlite-pragma',
        'cache_size=-262144',
        '--sqlite-pragma',
        'mmap_size=1073741824',
        '--sqlite-pragma',
        'temp_store=memory',
        '--dynamic-config-value',
        'history.transferProcessorMaxPollRPS=1000',
        // Idle workers start a new long poll every 5 s instead of every minute, so the poll times
        // Temporal lists tell a live worker from a dead one within seconds (/readyz, services/readiness.ts).
        '--dynamic-config-value',
        'matching.longPollExpirationInterval="5s"',
        '--log-level',
        'warn',
        ...SEARCH_ATTRIBUTE_FLAGS.flatMap((a) => ['--search-attribute', a]),
      ]),
      ready: async (p) => {
        await waitFor('temporal', namespaceReady(temporalAddress), 60_000, p);
        // How long closed workflows stay for the Web UI (the dev server's own default is 24h).
        if (env.TEMPORAL_RETENTION) await setRetention(temporalAddress, env.TEMPORAL_RETENTION);
      },
    }),
    mongo: () => ({
      // FERRETDB_PPROF=127.0.0.1:6060 serves Go's profiler, for finding where the database spends its time.
      ...privately(path.join(TOOLS, 'ferretdb'), [
        '-listen',
        `127.0.0.1:${o.mongoPort}`,
        '-dir',
        path.join(o.dataDir, 'ferretdb'),
        ...(process.env.FERRETDB_PPROF ? ['-pprof', process.env.FERRETDB_PPROF] : []),
      ]),
      ready: (p) => waitFor('ferretdb', tcpOpen(o.mongoPort), 60_000, p),
    }),
    api: () => ({
      cmd: process.execPath,
      args: [...nodeArgs, path.join(DIST, 'api', 'main.js')],
      // Liveness, not /readyz: an API (re)started while the worker or host is down is still up and
      // answers 503s with the reason; waiting for readiness would count it as a failed start.
      ready: (p) => waitFor('api', httpOk(`http://127.0.0.1:${o.apiPort}/healthz`), 60_000, p),
    }),
  };

  for (const h of hostList) {
    commands[h.proc] = () => ({
      cmd: process.execPath,
      args: [...nodeArgs, path.join(DIST, 'sandbox', 'host', 'main.js')],
      env: h.env,
      ready: (p) => waitFor(`sandbox host ${h.hostId}`, httpOk(`${h.url}/healthz`, { authorization: `Bearer ${o.hostToken}` }), 30_000, p),
    });
    commands[h.worker] = () => ({
      cmd: process.execPath,
      args: [...nodeArgs, path.join(DIST, 'worker', 'main.js')],
      env: h.env,
      ready: (p) =>
        waitFor(
          `worker of ${h.hostId}`,
          async () => logSince(path.join(logDir, `${h.worker}.log`), logOffsets.get(p) ?? 0).includes('"worker running"'),
          60_000,
          p,
        ),
    });
  }

  const logOffsets = new WeakMap<ChildProcess, number>();
  const spec = (name: ProcName): ProcSpec => {
    const command = commands[name];
    if (!command) throw new Error(`no process ${name} in this stack`);
    const { cmd, args, ready, env: own } = command();
    return { spawn: () => spawnLogged(name, cmd, args, own ?? env), ready };
  };

  function spawnLogged(name: ProcName, cmd: string, args: string[], env: Record<string, string>): ChildProcess {
    const logFile = path.join(logDir, `${name}.log`);
    const out = openLog(logFile);
    // Where this child's output starts: the worker's readiness is read from its own lines only (a
    // restart keeps the dead one's lines, which tell why it died).
    const offset = fs.fstatSync(out).size;
    // The servers' own output stays in their log files; our processes' lines are also echoed.
    const echo = name === 'temporal' || name === 'mongo' ? undefined : o.echo;
    const child = spawn(cmd, args, { env, stdio: ['ignore', echo ? 'pipe' : out, echo ? 'pipe' : out], cwd: PROJECT_ROOT });
    if (echo) {
      for (const stream of [child.stdout!, child.stderr!]) {
        let buf = '';
        stream.on('data', (chunk: Buffer) => {
          fs.writeSync(out, chunk);
          buf += chunk.toString('utf8');
          let nl: number;
          while ((nl = buf.indexOf('\n')) >= 0) {
            echo(name, buf.slice(0, nl));
            buf = buf.slice(nl + 1);
          }
        });
      }
    }
    child.once('exit', () => fs.closeSync(out));
    logOffsets.set(child, offset);
    return child;
  }

  const start = (name: ProcName) => sup.start(name, spec(name));
  const kill = (name: ProcName, signal: NodeJS.Signals = 'SIGTERM') => sup.stop(name, signal);

  const stack: Stack = {
    apiUrl,
    uiUrl: o.uiPort ? `http://127.0.0.1:${o.uiPort}` : null,
    temporalAddress,
    mongoUrl,
    hostUrl,
    hostUrls,
    hostList: hostList.map((h) => ({ hostId: h.hostId, url: h.url, dataDir: h.dataDir, proc: h.proc, worker: h.worker })),
    env,
    logDir,
    start,
    kill,
    pid: (name) => sup.pid(name),
    restarts: (name) => sup.restarts(name),
    stop(opts = {}) {
      // A second call (Ctrl-C during a give-up, say) waits for the first.
      stopped ??= (async () => {
        stopping = true;
        sup.close();
        await kill('api');
        await Promise.all(hostList.map((h) => kill(h.worker)));
        if (opts.destroySandboxes) await Promise.all(hostList.map((h) => destroyAllSandboxes(h.url, o.hostToken).catch(() => undefined)));
        await Promise.all(hostList.map((h) => kill(h.proc)));
        // Several hosts' network tables are this stack's own (named after its DATA_DIR): they go with
        // its sandboxes. (A single host's table, `inet sap` by default, stays as it always has.)
        if (opts.destroySandboxes && hostCount > 1) await Promise.all(hostList.map((h) => deleteNetTable(h.env.SANDBOX_NET_NAME)));
        await Promise.all([kill('temporal'), kill('mongo')]);
        fs.rmSync(stackFilePath(o.dataDir), { force: true });
        fs.closeSync(supervisorLog);
      })();
      return stopped;
    },
  };
  try {
    // The hosts need neither server: they start beside them. The workers and the API need both; the
    // API does not need a worker (it answers 503s on /readyz until one polls), so they start together.
    await Promise.all([...(o.external ? [] : [start('temporal'), start('mongo')]), ...hostList.map((h) => start(h.proc))]);
    await Promise.all([...hostList.map((h) => start(h.worker)), start('api')]);
  } catch (err) {
    await stack.stop({ destroySandboxes: true });
    throw err;
  }
  return stack;
}

/**
 * What host i (of several) gets of its own beside its port: an id (<HOST_ID or hostname>-<i>), a
 * state directory under <dataDir>/hosts, a network table, link names and address pool (a /20 of a
 * /16 in 100.64.0.0/10 picked by dataDir, so two stacks on one machine rarely meet), a range of
 * user-namespace ids (2048 slots from 2^31), a resolver port and a worker metrics port pair.
 * SAP_STACK_SLOT s (1 or 2; the test suite sets its jest worker's) makes the pool and the ids
 * depend on s alone, so the stacks of two slots never meet: pools in 100.(63+s).0.0/16, ids from
 * 2^31 + (s-1)·2^28 (two hosts' 2048 slots each).
 */
export function hostEnvironment(dataDir: string, env: Record<string, string>, i: number, port: number): Record<string, string> {
  const baseId = env.HOST_ID ?? os.hostname().replace(/[^\w.-]/g, '-');
  const hostId = `${baseId}-${i}`;
  const hash = createHash('sha256').update(path.resolve(dataDir)).digest();
  const slot = ['1', '2'].includes(env.SAP_STACK_SLOT ?? '') ? Number(env.SAP_STACK_SLOT) : null;
  const out: Record<string, string> = {
    HOST_ID: hostId,
    HOST_LISTEN: `127.0.0.1:${port}`,
    DATA_DIR: path.join(dataDir, 'hosts', hostId),
    SANDBOX_NET_NAME: `x${hash.toString('hex').slice(0, 4)}${i}`,
    SANDBOX_NET_CIDR: `100.${slot ? 63 + slot : 64 + (hash[2]! % 62)}.${(i - 1) * 16}.0/20`,
    SANDBOX_ID_BASE: String(2 ** 31 + (slot ? (slot - 1) * 2 ** 28 : 0) + (i - 1) * 2048 * 65536),
    SANDBOX_DNS_PORT: String(Number(env.SANDBOX_DNS_PORT || 10053) + i - 1),
    SANDBOX_SEAL_PORT: String(Number(env.SANDBOX_SEAL_PORT || 10080) + i - 1),
  };
  const metrics = Number(env.WORKER_METRICS_PORT ?? 9464);
  if (metrics) out.WORKER_METRICS_PORT = String(metrics + 2 * (i - 1));
  return out;
}

/** The secrets key of the stack (SECRETS_KEY, else the one kept in <dataDir>/secrets.key, made once). */
function secretsKeyText(dataDir: string): string {
  resolveSecretBox({ DATA_DIR: dataDir, SECRETS_KEY: undefined });
  return fs.readFileSync(path.join(dataDir, 'secrets.key'), 'utf8').trim();
}

/** Removes a host's nftables table (`inet <name>`); nothing when it is absent or nft is missing. */
/** Removes the nftables table `inet <name>` (nothing when it is missing). */
export function deleteNetTable(name: string | undefined): Promise<void> {
  if (!name) return Promise.resolve();
  return new Promise((resolve) => execFile('nft', ['delete', 'table', 'inet', name], { timeout: 10_000 }, () => resolve()));
}

/** Sets the `default` namespace's retention of closed workflows (e.g. `72h`). */
function setRetention(address: string, retention: string): Promise<void> {
  if (!/^\d+[hd]$/.test(retention)) return Promise.reject(new Error(`TEMPORAL_RETENTION must be hours or days, like 24h or 3d: ${retention}`));
  const value = retention.endsWith('d') ? `${Number(retention.slice(0, -1)) * 24}h` : retention;
  return new Promise((resolve, reject) => {
    execFile(
      path.join(TOOLS, 'temporal'),
      ['operator', 'namespace', 'update', '-n', 'default', '--retention', value, '--address', address],
      { timeout: 10_000 },
      (err, _out, stderr) => (err ? reject(new Error(`setting TEMPORAL_RETENTION=${retention}: ${stderr.trim() || err.message}`)) : resolve()),
    );
  });
}

/** Opens a log file for appending, 0600 (also when an older stack made it). */
function openLog(file: string): number {
  const fd = fs.openSync(file, 'a', 0o600);
  fs.fchmodSync(fd, 0o600);
  return fd;
}

/**
 * The command line that runs `cmd` with umask 077 (through /bin/sh, which execs it: the same pid):
 * for the servers that make their own files in DATA_DIR (Temporal's database, FerretDB's), which
 * are then 0600 and 0700. The stack's node processes keep the usual umask: a sandbox's processes
 * inherit the host's, and set their own files' modes.
 */
function privately(cmd: string, args: string[]): { cmd: string; args: string[] } {
  return { cmd: '/bin/sh', args: ['-c', 'umask 077 && exec "$0" "$@"', cmd, ...args] };
}

/** What was appended to `file` after `offset`. */
function logSince(file: string, offset: number): string {
  const fd = fs.openSync(file, 'r');
  try {
    const size = fs.fstatSync(fd).size;
    const buf = Buffer.alloc(Math.max(0, size - offset));
    fs.readSync(fd, buf, 0, buf.length, offset);
    return buf.toString('utf8');
  } finally {
    fs.closeSync(fd);
  }
}

/** Replaces <dataDir>/stack.json atomically (a reader never sees half a file). */
function writeStackFile(dataDir: string, content: StackFile): void {
  const file = stackFilePath(dataDir);
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, JSON.stringify(content, null, 2) + '\n', { mode: 0o600 });
  fs.renameSync(tmp, file);
}

/** Asks the sandbox host to destroy every sandbox it owns. */
export async function destroyAllSandboxes(hostUrl: string, token: string): Promise<void> {
  const headers = { authorization: `Bearer ${token}` };
  const res = await fetch(`${hostUrl}/sandboxes`, { headers });
  if (!res.ok) return;
  const list = (await res.json()) as { id: string }[];
  await Promise.all(list.map((sb) => fetch(`${hostUrl}/sandboxes/${sb.id}`, { method: 'DELETE', headers })));
}
