import { ChildProcess, execFile, spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { PROJECT_ROOT } from '../config';
import { SEARCH_ATTRIBUTE_FLAGS } from '../workflows/search-attributes';
import { ProcSpec, Supervisor } from './supervisor';

/** The processes of a local stack, in start order. */
export type ProcName = 'temporal' | 'mongo' | 'host' | 'worker' | 'api';

export interface StackOptions {
  dataDir: string;
  apiPort: number;
  temporalPort: number;
  /** Temporal Web UI port; omit for a headless server (tests). */
  uiPort?: number;
  mongoPort: number;
  hostPort: number;
  apiKey: string;
  hostToken: string;
  sandboxProvider?: 'bwrap' | 'process';
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

/** A TCP port that was free a moment ago. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs: number, proc?: ChildProcess): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (proc && (proc.exitCode !== null || proc.signalCode !== null)) throw new Error(`${what} exited with ${proc.signalCode ?? `code ${proc.exitCode}`} before it was ready`);
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
    execFile(path.join(TOOLS, 'temporal'), ['operator', 'namespace', 'describe', '-n', 'default', '--address', address], { timeout: 5000 }, (err) => resolve(!err));
  });
};

const httpOk = (url: string, headers: Record<string, string> = {}) => async () => (await fetch(url, { headers })).ok;

/**
 * Starts the whole local stack: the Temporal dev server (persistent SQLite, WAL), FerretDB
 * (persistent SQLite), the sandbox host, one worker and the API. State lives in dataDir.
 */
export async function startStack(o: StackOptions): Promise<Stack> {
  const logDir = path.join(o.dataDir, 'logs');
  fs.mkdirSync(logDir, { recursive: true });
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
    SANDBOX_PROVIDER: o.sandboxProvider ?? 'bwrap',
    ...o.env,
  };
  const hostUrl = `http://127.0.0.1:${o.hostPort}`;
  const apiUrl = `http://127.0.0.1:${o.apiPort}`;
  const supervisorLog = fs.openSync(path.join(logDir, 'supervisor.log'), 'a');
  let stopping = false;
  let stopped: Promise<void> | undefined;
  const sup = new Supervisor({
    restart: o.supervise ?? false,
    log: (line) => {
      fs.writeSync(supervisorLog, `${new Date().toISOString()} ${line}\n`);
      o.log?.(line);
    },
    onChange: () => {
      if (!stopping) writeStackFile(o.dataDir, { pids: sup.pids(), apiUrl, hostUrl, temporalAddress, mongoUrl });
    },
    onGiveUp: (name, message) => o.onGiveUp?.(name as ProcName, message),
  });
  // NODE_PROFILE_DIR=/tmp/prof writes a V8 CPU profile of the host, worker and API (on a clean stop).
  const nodeArgs = process.env.NODE_PROFILE_DIR ? ['--cpu-prof', `--cpu-prof-dir=${process.env.NODE_PROFILE_DIR}`] : [];

  const commands: Record<ProcName, () => { cmd: string; args: string[]; ready: (p: ChildProcess) => Promise<void> }> = {
    temporal: () => ({
      cmd: path.join(TOOLS, 'temporal'),
      args: [
        'server', 'start-dev',
        '--ip', '127.0.0.1',
        '--port', String(o.temporalPort),
        ...(o.uiPort ? ['--ui-port', String(o.uiPort)] : ['--headless']),
        '--db-filename', path.join(o.dataDir, 'temporal.db'),
        '--sqlite-pragma', 'journal_mode=wal',
        '--sqlite-pragma', 'synchronous=normal',
        '--dynamic-config-value', 'history.transferProcessorMaxPollRPS=1000',
        // Idle workers start a new long poll every 5 s instead of every minute, so the poll times
        // Temporal lists tell a live worker from a dead one within seconds (/readyz, api/readiness.ts).
        '--dynamic-config-value', 'matching.longPollExpirationInterval="5s"',
        '--log-level', 'warn',
        ...SEARCH_ATTRIBUTE_FLAGS.flatMap((a) => ['--search-attribute', a]),
      ],
      ready: (p) => waitFor('temporal', namespaceReady(temporalAddress), 60_000, p),
    }),
    mongo: () => ({
      cmd: path.join(TOOLS, 'ferretdb'),
      // FERRETDB_PPROF=127.0.0.1:6060 serves Go's profiler, for finding where the database spends its time.
      args: ['-listen', `127.0.0.1:${o.mongoPort}`, '-dir', path.join(o.dataDir, 'ferretdb'), ...(process.env.FERRETDB_PPROF ? ['-pprof', process.env.FERRETDB_PPROF] : [])],
      ready: (p) => waitFor('ferretdb', tcpOpen(o.mongoPort), 60_000, p),
    }),
    host: () => ({
      cmd: process.execPath,
      args: [...nodeArgs, path.join(DIST, 'sandbox', 'host', 'main.js')],
      ready: (p) => waitFor('sandbox host', httpOk(`http://127.0.0.1:${o.hostPort}/healthz`, { authorization: `Bearer ${o.hostToken}` }), 30_000, p),
    }),
    worker: () => ({
      cmd: process.execPath,
      args: [...nodeArgs, path.join(DIST, 'worker', 'main.js')],
      ready: (p) =>
        waitFor('worker', async () => logSince(path.join(logDir, 'worker.log'), logOffsets.get(p) ?? 0).includes('"worker running"'), 60_000, p),
    }),
    api: () => ({
      cmd: process.execPath,
      args: [...nodeArgs, path.join(DIST, 'api', 'main.js')],
      // Liveness, not /readyz: an API (re)started while the worker or host is down is still up and
      // answers 503s with the reason; waiting for readiness would count it as a failed start.
      ready: (p) => waitFor('api', httpOk(`http://127.0.0.1:${o.apiPort}/healthz`), 60_000, p),
    }),
  };

  const logOffsets = new WeakMap<ChildProcess, number>();
  const spec = (name: ProcName): ProcSpec => {
    const { cmd, args, ready } = commands[name]();
    return { spawn: () => spawnLogged(name, cmd, args), ready };
  };

  function spawnLogged(name: ProcName, cmd: string, args: string[]): ChildProcess {
    const logFile = path.join(logDir, `${name}.log`);
    const out = fs.openSync(logFile, 'a');
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
        await kill('worker');
        if (opts.destroySandboxes) await destroyAllSandboxes(hostUrl, o.hostToken).catch(() => undefined);
        await kill('host');
        await Promise.all([kill('temporal'), kill('mongo')]);
        fs.rmSync(stackFilePath(o.dataDir), { force: true });
        fs.closeSync(supervisorLog);
      })();
      return stopped;
    },
  };
  try {
    await Promise.all([start('temporal'), start('mongo')]);
    await start('host');
    await start('worker');
    await start('api');
  } catch (err) {
    await stack.stop({ destroySandboxes: true });
    throw err;
  }
  return stack;
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
  fs.writeFileSync(tmp, JSON.stringify(content, null, 2) + '\n');
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
