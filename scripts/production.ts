import { ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { PROJECT_ROOT } from '../config';
import { SEARCH_ATTRIBUTE_FLAGS } from '../workflows/search-attributes';
import { freePort, startStack, type Stack } from './launcher';
import { Supervisor } from './supervisor';

/**
 * The production layout on one machine (`npm run start:production`, docs/operations/production.md):
 * PostgreSQL (Debian's), the real Temporal server on it (persistence and visibility, schemas applied
 * with temporal-sql-tool), Temporal's UI server in front of it, FerretDB on PostgreSQL, two sandbox
 * hosts each with its worker (startStack with hosts: 2) and two API processes on two ports. The
 * servers of this file run under a supervisor of their own; the platform's processes under
 * startStack's.
 */

/** The processes of this profile beside startStack's (host, worker, host2, worker2, api). */
export type ServerName = 'postgres' | 'temporal' | 'mongo' | 'ui' | 'api2';
const SERVERS: ServerName[] = ['postgres', 'temporal', 'mongo', 'ui', 'api2'];

export interface ProductionOptions {
  dataDir: string;
  apiKey: string;
  hostToken: string;
  /** The two APIs' ports; free ones when omitted. */
  apiPorts?: [number, number];
  temporalPort?: number;
  /** The Web UI's port; 0 or omitted: no UI (tests). */
  uiPort?: number;
  mongoPort?: number;
  /** The hosts' own networks and id ranges: each gets half of SANDBOX_NET_CIDR (a /20 → two /21s), `<name>a`/`<name>b`. */
  net?: { name: string; cidr: string; idBase: number };
  env?: Record<string, string>;
  supervise?: boolean;
  log?: (line: string) => void;
  echo?: (proc: string, line: string) => void;
}

export interface ProductionStack {
  stack: Stack;
  apiUrls: [string, string];
  uiUrl: string | null;
  temporalAddress: string;
  mongoUrl: string;
  postgres: { port: number; user: string; dataDir: string };
  /** Every process of the profile: this file's servers and startStack's. */
  start(name: string): Promise<void>;
  kill(name: string, signal?: NodeJS.Signals): Promise<void>;
  pid(name: string): number | undefined;
  stop(opts?: { destroySandboxes?: boolean }): Promise<void>;
}

const TOOLS = path.join(PROJECT_ROOT, '.tools');
const PG_USER = 'sap';
/** PostgreSQL runs as Debian's `postgres` user (it refuses root); its cluster is under <dataDir>/postgres. */
const PG_OS_USER = 'postgres';
const HOST_ID_SPAN = 67_108_864; // 1024 slots of 65536 ids: as many as a /21 has /31s

/**
 * The Temporal UI server's config (ui.yaml). The UI is the operator's tool and has no login of its
 * own: it listens on 127.0.0.1 unless OIDC is configured (TEMPORAL_UI_OIDC_ISSUER, _CLIENT_ID,
 * _CLIENT_SECRET, _CALLBACK_URL), and only then on TEMPORAL_UI_HOST. A non-loopback host without
 * OIDC is refused. docs/operations/production.md, "The Temporal UI".
 */
export function uiServerConfig(o: { temporalAddress: string; port: number; env: Record<string, string | undefined> }): string {
  const issuer = o.env.TEMPORAL_UI_OIDC_ISSUER;
  const host = o.env.TEMPORAL_UI_HOST ?? '127.0.0.1';
  const loopback = host === '127.0.0.1' || host === '::1' || host === 'localhost';
  const lines = [
    `temporalGrpcAddress: ${o.temporalAddress}`,
    `host: ${host}`,
    `port: ${o.port}`,
    'enableUi: true',
    'disableNewsFetch: true',
    'defaultNamespace: default',
  ];
  if (issuer) {
    const need = ['TEMPORAL_UI_OIDC_CLIENT_ID', 'TEMPORAL_UI_OIDC_CLIENT_SECRET', 'TEMPORAL_UI_OIDC_CALLBACK_URL'].filter((k) => !o.env[k]);
    if (need.length) throw new Error(`TEMPORAL_UI_OIDC_ISSUER is set: also set ${need.join(', ')}`);
    const q = (v: string | undefined) => JSON.stringify(v ?? '');
    lines.push(
      'auth:',
      '  enabled: true',
      '  providers:',
      '    - label: sso',
      '      type: oidc',
      `      providerUrl: ${q(issuer)}`,
      `      clientId: ${q(o.env.TEMPORAL_UI_OIDC_CLIENT_ID)}`,
      `      clientSecret: ${q(o.env.TEMPORAL_UI_OIDC_CLIENT_SECRET)}`,
      `      callbackUrl: ${q(o.env.TEMPORAL_UI_OIDC_CALLBACK_URL)}`,
      '      scopes: [openid, profile, email]',
    );
  } else if (!loopback) {
    throw new Error(
      `TEMPORAL_UI_HOST=${host} exposes the Temporal UI, which has no login: configure OIDC (TEMPORAL_UI_OIDC_ISSUER, …) or keep it on 127.0.0.1`,
    );
  }
  return `${lines.join('\n')}\n`;
}

/** The directory of Debian's newest PostgreSQL server binaries. */
export function postgresBin(): string {
  const base = '/usr/lib/postgresql';
  const versions = fs.existsSync(base) ? fs.readdirSync(base).filter((v) => fs.existsSync(path.join(base, v, 'bin', 'initdb'))) : [];
  if (!versions.length) throw new Error('PostgreSQL is not installed (npm run toolchain installs Debian\'s "postgresql")');
  return path.join(base, versions.sort((a, b) => Number(b) - Number(a))[0]!, 'bin');
}

function run(cmd: string, args: string[], env: Record<string, string> = {}, timeout = 120_000): Promise<string> {
  return new Promise((resolve, reject) =>
    execFile(cmd, args, { env: { ...(process.env as Record<string, string>), ...env }, timeout, maxBuffer: 16 << 20 }, (err, out, errOut) =>
      err ? reject(new Error(`${path.basename(cmd)} ${args.slice(0, 3).join(' ')}: ${errOut.trim() || err.message}`)) : resolve(out),
    ),
  );
}

const tcpOpen = (port: number) =>
  new Promise<boolean>((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.once('connect', () => (s.destroy(), resolve(true)));
    s.once('error', () => resolve(false));
  });

async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs: number, proc?: ChildProcess): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (proc && (proc.exitCode !== null || proc.signalCode !== null)) throw new Error(`${what} exited before it was ready`);
    if (await check().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`${what} not ready after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/**
 * A free port below 32768 (and not in `taken`): Temporal keeps its services' membership ports in a
 * PostgreSQL smallint, so the kernel's ephemeral ports (32768 and up) make the server exit at start.
 */
async function freeLowPort(taken: number[]): Promise<number> {
  for (;;) {
    const port = 20_000 + Math.floor(Math.random() * 12_000);
    if (taken.includes(port)) continue;
    const free = await new Promise<boolean>((resolve) => {
      const srv = net.createServer();
      srv.once('error', () => resolve(false));
      srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
    });
    if (free) return port;
  }
}

/** The user id of Debian's postgres user. */
function osUser(name: string): { uid: number; gid: number } {
  const line = fs
    .readFileSync('/etc/passwd', 'utf8')
    .split('\n')
    .find((l) => l.startsWith(`${name}:`));
  if (!line) throw new Error(`no user ${name} (Debian's postgresql package makes it)`);
  const [, , uid, gid] = line.split(':');
  return { uid: Number(uid), gid: Number(gid) };
}

/** The password of the profile's PostgreSQL superuser, made once into <dataDir>/postgres.password (0600). */
function pgPassword(dataDir: string): string {
  const file = path.join(dataDir, 'postgres.password');
  if (!fs.existsSync(file)) fs.writeFileSync(file, randomBytes(24).toString('hex') + '\n', { mode: 0o600 });
  return fs.readFileSync(file, 'utf8').trim();
}

/** Halves a /20 (or any /n ≤ /30) into two: `100.113.0.0/20` → `100.113.0.0/21`, `100.113.8.0/21`. */
export function splitCidr(cidr: string): [string, string] {
  const m = /^(\d+)\.(\d+)\.(\d+)\.(\d+)\/(\d+)$/.exec(cidr);
  if (!m || Number(m[5]) > 29) throw new Error(`SANDBOX_NET_CIDR must be an IPv4 network of /29 or wider: ${cidr}`);
  const bits = Number(m[5]);
  const base = m.slice(1, 5).reduce((a, o) => a * 256 + Number(o), 0);
  const half = 2 ** (32 - bits - 1);
  const ip = (n: number) => [24, 16, 8, 0].map((s) => Math.floor(n / 2 ** s) % 256).join('.');
  return [`${ip(base)}/${bits + 1}`, `${ip(base + half)}/${bits + 1}`];
}

/** Temporal's server configuration: PostgreSQL (postgres12 plugin) for persistence and visibility, 4 history shards, loopback only. */
function temporalConfig(o: { pgPort: number; password: string; ports: number[]; dynamicConfig: string }): string {
  const [frontend, frontendHttp, history, matching, worker, fm, hm, mm, wm] = o.ports;
  const store = (db: string, conns: number) => `      sql:
        pluginName: postgres12
        databaseName: ${db}
        connectAddr: "127.0.0.1:${o.pgPort}"
        connectProtocol: tcp
        user: ${PG_USER}
        password: "${o.password}"
        maxConns: ${conns}
        maxIdleConns: ${conns}
        maxConnLifetime: 1h`;
  const svc = (name: string, grpc: number, membership: number, extra = '') =>
    `  ${name}:\n    rpc:\n      grpcPort: ${grpc}\n      membershipPort: ${membership}\n      bindOnIP: 127.0.0.1\n${extra}`;
  return `# Written by scripts/production.ts at every start: edit that file, not this one.
log:
  stdout: true
  level: warn
persistence:
  defaultStore: default
  visibilityStore: visibility
  numHistoryShards: 4
  datastores:
    default:
${store('temporal', 20)}
    visibility:
${store('temporal_visibility', 10)}
global:
  membership:
    maxJoinDuration: 30s
    broadcastAddress: 127.0.0.1
services:
${svc('frontend', frontend!, fm!, `      httpPort: ${frontendHttp}\n`)}${svc('history', history!, hm!)}${svc('matching', matching!, mm!)}${svc('worker', worker!, wm!)}
clusterMetadata:
  enableGlobalNamespace: false
  failoverVersionIncrement: 10
  masterClusterName: active
  currentClusterName: active
  clusterInformation:
    active:
      enabled: true
      initialFailoverVersion: 1
      rpcName: frontend
      rpcAddress: "127.0.0.1:${frontend}"
dcRedirectionPolicy:
  policy: noop
dynamicConfigClient:
  filepath: "${o.dynamicConfig}"
  pollInterval: 10s
`;
}

/** Temporal's dynamic configuration, shared with docker-compose.yml's temporal-server (see the file). */
const DYNAMIC_CONFIG = path.join(PROJECT_ROOT, 'deploy', 'temporal', 'dynamicconfig.yaml');

/** Starts the production profile in dataDir (state kept across starts) and resolves when every process is ready. */
export async function startProductionStack(o: ProductionOptions): Promise<ProductionStack> {
  const dataDir = path.resolve(o.dataDir);
  const logDir = path.join(dataDir, 'logs');
  // PostgreSQL's own user must reach its cluster under dataDir: dataDir is 0711 (nobody else can list it).
  fs.mkdirSync(logDir, { recursive: true, mode: 0o700 });
  fs.chmodSync(dataDir, 0o711);
  const pgBin = postgresBin();
  const pgUser = osUser(PG_OS_USER);
  const pgHome = path.join(dataDir, 'postgres');
  const pgData = path.join(pgHome, 'data');
  const password = pgPassword(dataDir);
  const pgPort = await freePort();
  const temporalPort = o.temporalPort ?? (await freePort());
  const mongoPort = o.mongoPort ?? (await freePort());
  const apiPorts = o.apiPorts ?? [await freePort(), await freePort()];
  const internalPorts = [temporalPort];
  for (let i = 0; i < 8; i++) internalPorts.push(await freeLowPort(internalPorts));
  const temporalAddress = `127.0.0.1:${temporalPort}`;
  const tctl = (args: string[]) => run(path.join(TOOLS, 'bin', 'temporal'), [...args, '--address', temporalAddress], {}, 30_000);
  const pgEnv = { PGPASSWORD: password, PGHOST: '127.0.0.1', PGPORT: String(pgPort), PGUSER: PG_USER, PGCONNECT_TIMEOUT: '5' };
  const psql = (db: string, sql: string) => run('/usr/bin/psql', ['-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', db, '-c', sql], pgEnv, 30_000);

  // A new cluster: initdb as the postgres user, the superuser `sap` with a password (scram-sha-256 on every connection).
  if (!fs.existsSync(path.join(pgData, 'PG_VERSION'))) {
    fs.rmSync(pgHome, { recursive: true, force: true });
    fs.mkdirSync(pgHome, { mode: 0o700 });
    fs.chownSync(pgHome, pgUser.uid, pgUser.gid);
    const pwfile = path.join(pgHome, 'pwfile');
    fs.writeFileSync(pwfile, password + '\n', { mode: 0o600 });
    fs.chownSync(pwfile, pgUser.uid, pgUser.gid);
    await run(
      '/usr/bin/setpriv',
      [
        `--reuid=${pgUser.uid}`,
        `--regid=${pgUser.gid}`,
        '--clear-groups',
        path.join(pgBin, 'initdb'),
        '-D',
        pgData,
        '-U',
        PG_USER,
        '--auth=scram-sha-256',
        `--pwfile=${pwfile}`,
        '-E',
        'UTF8',
        '--locale=C.UTF-8',
      ],
      {},
      180_000,
    );
    fs.rmSync(pwfile);
  }
  const tDir = path.join(dataDir, 'temporal');
  fs.mkdirSync(tDir, { recursive: true, mode: 0o700 });
  const dynamicConfig = path.join(tDir, 'dynamicconfig.yaml');
  fs.copyFileSync(DYNAMIC_CONFIG, dynamicConfig);
  const temporalYaml = path.join(tDir, 'production.yaml');
  fs.writeFileSync(temporalYaml, temporalConfig({ pgPort, password, ports: internalPorts, dynamicConfig }), { mode: 0o600 });
  const uiYaml = path.join(tDir, 'ui.yaml');
  if (o.uiPort) fs.writeFileSync(uiYaml, uiServerConfig({ temporalAddress, port: o.uiPort, env: { ...process.env, ...o.env } }), { mode: 0o600 });

  const openLog = (name: string) => {
    const fd = fs.openSync(path.join(logDir, `${name}.log`), 'a', 0o600);
    fs.fchmodSync(fd, 0o600);
    return fd;
  };
  const spawnLogged = (name: string, cmd: string, args: string[], env: Record<string, string> = process.env as Record<string, string>) => {
    const out = openLog(name);
    const child = spawn(cmd, args, { env, stdio: ['ignore', out, out], cwd: PROJECT_ROOT });
    child.once('exit', () => fs.closeSync(out));
    return child;
  };
  let stopped: Promise<void> | undefined;
  const sup = new Supervisor({
    restart: o.supervise ?? false,
    log: (line) => o.log?.(line),
    // <dataDir>/production.json: this file's servers' pids, beside startStack's stack.json (npm run chaos -- --profile production).
    onChange: () => {
      if (!stopped) fs.writeFileSync(path.join(dataDir, 'production.json'), JSON.stringify({ pids: sup.pids() }) + '\n', { mode: 0o600 });
    },
    onGiveUp: (name, message) => o.log?.(`gave up on ${name}: ${message}`),
  });
  let stack: Stack | undefined;
  const specs: Record<ServerName, () => { spawn: () => ChildProcess; ready: (p: ChildProcess) => Promise<void> }> = {
    postgres: () => ({
      // setpriv execs PostgreSQL as the postgres user (the same pid: a kill reaches the postmaster). fsync
      // stays on; no Unix socket (TCP on loopback only, with passwords).
      spawn: () =>
        spawnLogged('postgres', '/usr/bin/setpriv', [
          `--reuid=${pgUser.uid}`,
          `--regid=${pgUser.gid}`,
          '--clear-groups',
          path.join(pgBin, 'postgres'),
          '-D',
          pgData,
          '-p',
          String(pgPort),
          '-c',
          'listen_addresses=127.0.0.1',
          '-c',
          'unix_socket_directories=',
          '-c',
          'max_connections=200',
        ]),
      ready: (p) => waitFor('postgres', async () => (await psql('postgres', 'SELECT 1')).trim() === '1', 60_000, p),
    }),
    temporal: () => ({
      spawn: () => spawnLogged('temporal', path.join(TOOLS, 'bin', 'temporal-server'), ['--config-file', temporalYaml, '--allow-no-auth', 'start']),
      ready: (p) => waitFor('temporal server', async () => (await tcpOpen(temporalPort)) && !!(await tctl(['operator', 'cluster', 'health'])), 90_000, p),
    }),
    mongo: () => ({
      spawn: () =>
        spawnLogged(
          'mongo',
          path.join(TOOLS, 'bin', 'ferretdb-postgresql'),
          ['-listen', `127.0.0.1:${mongoPort}`, '-postgresql-url', `postgres://${PG_USER}@127.0.0.1:${pgPort}/ferretdb`],
          {
            ...(process.env as Record<string, string>),
            FERRETDB_POSTGRESQL_PASSWORD: password,
          },
        ),
      ready: (p) => waitFor('ferretdb', () => tcpOpen(mongoPort), 60_000, p),
    }),
    ui: () => ({
      spawn: () => spawnLogged('ui', path.join(TOOLS, 'bin', 'temporal-ui-server'), ['--root', tDir, '--config', '.', '--env', 'ui', 'start']),
      ready: (p) => waitFor('temporal ui', async () => (await fetch(`http://127.0.0.1:${o.uiPort}/`)).ok, 60_000, p),
    }),
    api2: () => ({
      spawn: () => spawnLogged('api2', process.execPath, [path.join(PROJECT_ROOT, 'dist', 'api', 'main.js')], { ...stack!.env, PORT: String(apiPorts[1]) }),
      ready: (p) => waitFor('api2', async () => (await fetch(`http://127.0.0.1:${apiPorts[1]}/healthz`)).ok, 60_000, p),
    }),
  };
  const startServer = (name: ServerName) => sup.start(name, specs[name]());
  const isServer = (name: string): name is ServerName => (SERVERS as string[]).includes(name);
  const prod: ProductionStack = {
    get stack() {
      return stack!;
    },
    apiUrls: [`http://127.0.0.1:${apiPorts[0]}`, `http://127.0.0.1:${apiPorts[1]}`],
    uiUrl: o.uiPort ? `http://127.0.0.1:${o.uiPort}` : null,
    temporalAddress,
    mongoUrl: `mongodb://127.0.0.1:${mongoPort}/sap`,
    postgres: { port: pgPort, user: PG_USER, dataDir: pgData },
    start: (name) => (isServer(name) ? startServer(name) : stack!.start(name as never)),
    kill: (name, signal = 'SIGTERM') => (isServer(name) ? sup.stop(name, signal) : stack!.kill(name as never, signal)),
    pid: (name) => (isServer(name) ? sup.pid(name) : stack?.pid(name as never)),
    stop(opts = {}) {
      stopped ??= (async () => {
        sup.close();
        await sup.stop('api2');
        await stack?.stop(opts);
        await Promise.all([sup.stop('ui'), sup.stop('temporal'), sup.stop('mongo')]);
        await sup.stop('postgres', 'SIGINT'); // PostgreSQL's "fast" shutdown
      })();
      return stopped;
    },
  };
  try {
    await startServer('postgres');
    for (const db of ['temporal', 'temporal_visibility', 'ferretdb'])
      if (!(await psql('postgres', `SELECT 1 FROM pg_database WHERE datname = '${db}'`)).trim()) await psql('postgres', `CREATE DATABASE ${db}`);
    await applyTemporalSchemas({
      ...pgEnv,
      SQL_PLUGIN: 'postgres12',
      SQL_HOST: '127.0.0.1',
      SQL_PORT: String(pgPort),
      SQL_USER: PG_USER,
      SQL_PASSWORD: password,
    });
    await Promise.all([startServer('temporal'), startServer('mongo')]);
    await registerNamespace(tctl);
    if (o.uiPort) await startServer('ui');
    const [cidrA, cidrB] = o.net ? splitCidr(o.net.cidr) : [undefined, undefined];
    stack = await startStack({
      dataDir,
      dataDirMode: 0o711,
      external: true,
      apiPort: apiPorts[0],
      temporalPort,
      mongoPort,
      hostPort: 0,
      hostPorts: [await freePort(), await freePort()],
      hosts: 2,
      apiKey: o.apiKey,
      hostToken: o.hostToken,
      supervise: o.supervise,
      log: o.log,
      echo: o.echo,
      hostEnv: (i): Record<string, string> =>
        o.net
          ? {
              SANDBOX_NET_NAME: `${o.net.name}${i === 1 ? 'a' : 'b'}`,
              SANDBOX_NET_CIDR: (i === 1 ? cidrA : cidrB)!,
              SANDBOX_ID_BASE: String(o.net.idBase + (i - 1) * HOST_ID_SPAN),
            }
          : {},
      // Temporal payloads encrypted per organisation: on in this profile unless the caller says otherwise
      // (docs/threat-model.md, "Payloads per organisation"); npm start's dev stack leaves it off.
      env: { PAYLOAD_ENCRYPTION: process.env.PAYLOAD_ENCRYPTION ?? 'on', ...o.env },
    });
    await startServer('api2');
  } catch (err) {
    await prod.stop({ destroySandboxes: true });
    throw err;
  }
  return prod;
}

/** Temporal's schemas, from the module's own files (.tools/temporal-schema): set up once, then brought to the newest version. */
async function applyTemporalSchemas(env: Record<string, string>): Promise<void> {
  const tool = path.join(TOOLS, 'bin', 'temporal-sql-tool');
  for (const [db, dir] of [
    ['temporal', 'temporal'],
    ['temporal_visibility', 'visibility'],
  ] as const) {
    const e = { ...env, SQL_DATABASE: db };
    await run(tool, ['setup-schema', '-v', '0.0'], e).catch((err: Error) => {
      if (!/already exists/i.test(err.message)) throw err;
    });
    await run(tool, ['update-schema', '-d', path.join(TOOLS, 'temporal-schema', 'postgresql', 'v12', dir, 'versioned')], e);
  }
}

/** The `default` namespace (3 days' retention) and our search attributes, once; then waits until workflows can be listed in it. */
async function registerNamespace(tctl: (args: string[]) => Promise<string>): Promise<void> {
  await tctl(['operator', 'namespace', 'create', '-n', 'default', '--retention', '72h']).catch((err: Error) => {
    if (!/already (exists|registered)/i.test(err.message)) throw err;
  });
  await waitFor('the default namespace', async () => !!(await tctl(['workflow', 'count', '-n', 'default'])), 60_000);
  const have = await tctl(['operator', 'search-attribute', 'list', '-n', 'default']);
  for (const flag of SEARCH_ATTRIBUTE_FLAGS) {
    const [name, type] = flag.split('=');
    if (!new RegExp(`\\b${name}\\b`).test(have)) await tctl(['operator', 'search-attribute', 'create', '-n', 'default', '--name', name!, '--type', type!]);
  }
}
