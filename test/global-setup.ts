import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { deleteNetTable, freePort, ProcName, startStack, Stack } from '../scripts/launcher';
import { intToIp, parseCidr } from '../contract/network';
import { makeTestCa } from './helpers/test-ca';

/** What global-teardown stops: each stack with its control endpoint and data directory. */
export interface TestStack {
  stack: Stack;
  control: http.Server;
  dataDir: string;
  /** The stack's own network table (removed at the end: no other stack has it). */
  ownTable: string;
}

/** At most this many stacks (jest workers) at once: their networks and id ranges are laid out for two. */
export const MAX_TEST_STACKS = 2;

/**
 * Starts one real stack (Temporal dev server, FerretDB, sandbox host, worker, API) on free ports per
 * jest worker (`--maxWorkers`, at most MAX_TEST_STACKS; `--runInBand`: one) for the whole run, each
 * with a small control endpoint through which tests can kill and restart its processes. Stack k's
 * details are in SAP_TEST_*_k; test/worker-env.js gives each worker its own stack's as SAP_TEST_*, so
 * a test file sees one stack and owns it alone while it runs (it may kill its processes, count its
 * sandboxes). Each gets a network table, link names, address pool and user-namespace ids of its own
 * (see stackNet), so no rule or id of one applies to another stack's sandboxes.
 */
export default async function globalSetup(globalConfig?: { maxWorkers?: number; testPathPattern?: string }): Promise<void> {
  // The production profile's servers (built from Go the first time, about ten minutes on 2 cores; a
  // second on a warm cache), before the stacks start, with no time limit (jest's applies to tests and
  // hooks, not to this); only when its test is among the files run.
  if (runsProductionTest(globalConfig?.testPathPattern)) await productionToolchain();
  const t0 = Date.now();
  const count = Math.max(1, Math.min(MAX_TEST_STACKS, globalConfig?.maxWorkers ?? 1));
  const started = await Promise.allSettled(Array.from({ length: count }, (_, k) => startTestStack(k + 1)));
  const stacks = started.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const failed = started.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) {
    // Jest runs no teardown after a failed setup: the stacks that did start are stopped here.
    await Promise.all(
      stacks.map(async (g) => {
        g.control.close();
        await g.stack.stop({ destroySandboxes: true }).catch(() => undefined);
        await deleteNetTable(g.ownTable);
        fs.rmSync(g.dataDir, { recursive: true, force: true });
      }),
    );
    throw failed.reason;
  }
  (globalThis as { __SAP_STACKS__?: TestStack[] }).__SAP_STACKS__ = stacks;
  process.stderr.write(`[global setup] ${count} test stack${count > 1 ? 's' : ''} started in ${((Date.now() - t0) / 1000).toFixed(1)} s\n`);
}

const PRODUCTION_TEST = path.resolve(__dirname, 'integration', 'ops', 'production.test.ts');

/**
 * Whether this run may include test/integration/ops/production.test.ts: jest selects the files whose path
 * matches its testPathPattern (the command line's file arguments, case-insensitively; none: every file).
 */
export function runsProductionTest(testPathPattern: string | undefined, file = PRODUCTION_TEST): boolean {
  if (!testPathPattern) return true;
  try {
    return new RegExp(testPathPattern, 'i').test(file);
  } catch {
    return true;
  }
}

/** scripts/toolchain-production.sh, its [toolchain] lines on this run's output. */
function productionToolchain(): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', [path.resolve(__dirname, '..', 'scripts', 'toolchain-production.sh')], { stdio: ['ignore', 'inherit', 'inherit'] });
    child.on('error', reject);
    child.on('exit', (code, signal) => (code === 0 ? resolve() : reject(new Error(`scripts/toolchain-production.sh failed (${signal ?? `exit ${code}`})`))));
  });
}

/**
 * The network and id range of test stack k: a table and link names of its own (`t<k>sap`: a table
 * matches its links by prefix, and no other stack's name starts another's), a /18 of 100.126.0.0/16
 * and user-namespace ids from 2^31 + 2^29 + (k-1)·2^29 (its /18's 8192 links' worth). None of these is a
 * default stack's (`sap`, 100.127.0.0/16, ids 2^30..2^31), a two-host stack's (100.64–125, ids
 * 2^31..2^31 + 2^29, see hostEnvironment) or the other test stack's, so tests never touch a stack
 * running beside them (`npm start`). SANDBOX_NET_NAME, SANDBOX_NET_CIDR and SANDBOX_ID_BASE, when set,
 * are stack 1's (the name prefixed for stack 2: `t2<name>`, its block the one below stack 1's, or above
 * it at the bottom of 100.64.0.0/10).
 */
export function stackNet(k: number): Record<string, string> {
  const e = process.env;
  if (!e.SANDBOX_NET_NAME || !e.SANDBOX_NET_CIDR || !e.SANDBOX_ID_BASE) {
    return {
      SANDBOX_NET_NAME: `t${k}sap`,
      SANDBOX_NET_CIDR: `100.126.${(k - 1) * 64}.0/18`,
      SANDBOX_ID_BASE: String(2 ** 31 + 2 ** 29 + (k - 1) * 2 ** 29),
    };
  }
  if (k === 1) return { SANDBOX_NET_NAME: e.SANDBOX_NET_NAME, SANDBOX_NET_CIDR: e.SANDBOX_NET_CIDR, SANDBOX_ID_BASE: e.SANDBOX_ID_BASE };
  const { base: first, bits } = parseCidr(e.SANDBOX_NET_CIDR, 'SANDBOX_NET_CIDR');
  const size = 2 ** (32 - bits);
  // The block below stack 1's, or above it when that would leave 100.64.0.0/10 (shared address space).
  const start = first - (k - 1) * size >= parseCidr('100.64.0.0/10', 'shared space').base ? first - (k - 1) * size : first + (k - 1) * size;
  // Its ids follow stack 1's: as many slots as its block has links.
  return {
    SANDBOX_NET_NAME: `t${k}${e.SANDBOX_NET_NAME}`,
    SANDBOX_NET_CIDR: `${intToIp(start)}/${bits}`,
    SANDBOX_ID_BASE: String(Number(e.SANDBOX_ID_BASE) + (k - 1) * (size / 2) * 65536),
  };
}

async function startTestStack(k: number): Promise<TestStack> {
  const net = stackNet(k);
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sap-test-'));
  const apiKey = 'test-key-default-org';
  const hostToken = 'test-host-token-0123456789';
  const workerMetricsPort = await freePort();
  // The sandboxes' resolver listens on a port of its own, and forwards to an upstream that tests
  // serve themselves (test/helpers/fake-dns.ts) on SAP_TEST_DNS_UPSTREAM: nothing asks a real resolver.
  const dnsPort = await freePort();
  const dnsUpstreamPort = await freePort();
  // Sealed secrets: a test CA the sandbox host trusts for upstream TLS (its test hosts' certificates).
  const testCa = path.join(dataDir, 'test-ca');
  makeTestCa(testCa);
  const stack: Stack = await startStack({
    dataDir,
    apiPort: await freePort(),
    temporalPort: await freePort(),
    mongoPort: await freePort(),
    hostPort: await freePort(),
    apiKey,
    hostToken,
    env: {
      LOG_LEVEL: 'info',
      NODE_ENV: 'test',
      WORKER_METRICS_PORT: String(workerMetricsPort),
      SANDBOX_DNS_PORT: String(dnsPort),
      SANDBOX_DNS: `127.0.0.1:${dnsUpstreamPort}`,
      SANDBOX_SEAL_PORT: String(await freePort()),
      SANDBOX_SEAL_TRUST_FILE: path.join(testCa, 'ca.pem'),
      ...net,
      // Webhook retries a test can wait for (the defaults start at 10 s and grow to an hour).
      WEBHOOK_RETRY_INITIAL_MS: '200',
      WEBHOOK_RETRY_MAX_INTERVAL_MS: '1000',
      // A delivery's time limit a test can wait out (webhooks.test.ts: an answer that trickles past it; default 10 s).
      WEBHOOK_TIMEOUT_MS: '4000',
      // A revocation a test can wait out (revoked-key-socket.test.ts; default 30 s).
      API_KEY_CACHE_MS: '3000',
      // Webhook receivers of the tests listen on 127.0.0.2: only that address is opened, so the tests
      // can show that the rest of loopback (127.0.0.1, localhost, ::1, …) stays refused.
      WEBHOOK_ALLOWED_CIDRS: '127.0.0.2/32',
      // Exec limits a test can reach (test/integration/exec/exec-limits.test.ts; defaults 256 and 30 s).
      EXEC_SESSIONS_PER_ORG: '48',
      EXEC_WS_STALL_SECONDS: '5',
      // The console's link to a session's workflow (test/integration/console/console.test.ts checks its href; no UI runs here).
      TEMPORAL_UI_URL: 'http://temporal-ui.test.invalid:8233',
      // Lets test/integration/hosts/entrypoint-once.test.ts stop the host at a point of an entrypoint's start (off without the file).
      SANDBOX_TEST_PAUSE_FILE: path.join(dataDir, 'test-pause-entrypoint'),
    },
    // As under npm start: a process that dies unexpectedly comes back (test/integration/ops/supervision.test.ts).
    supervise: true,
    log: (line) => process.stderr.write(`[stack ${k} supervisor] ${line}\n`),
  });
  const control = http.createServer((req, res) => {
    const m = /^\/(start|kill)\/(\w+)(?:\?signal=(\w+))?$/.exec(req.url ?? '');
    if (req.method !== 'POST' || !m) {
      res.writeHead(404).end();
      return;
    }
    const [, action, name, signal] = m;
    const op = action === 'start' ? stack.start(name as ProcName) : stack.kill(name as ProcName, (signal ?? 'SIGTERM') as NodeJS.Signals);
    op.then(
      () => res.end(JSON.stringify({ ok: true, pid: stack.pid(name as ProcName) })),
      (err: Error) => res.writeHead(500).end(JSON.stringify({ error: err.message })),
    );
  });
  await new Promise<void>((r) => control.listen(0, '127.0.0.1', r));
  const controlUrl = `http://127.0.0.1:${(control.address() as { port: number }).port}`;
  const vars: Record<string, string> = {
    SAP_TEST_API_URL: stack.apiUrl,
    SAP_TEST_API_KEY: apiKey,
    SAP_TEST_MONGO_URL: stack.mongoUrl,
    SAP_TEST_TEMPORAL_ADDRESS: stack.temporalAddress,
    SAP_TEST_HOST_URL: stack.hostUrl,
    SAP_TEST_HOST_TOKEN: hostToken,
    SAP_TEST_DATA_DIR: dataDir,
    SAP_TEST_CONTROL_URL: controlUrl,
    SAP_TEST_LOG_DIR: stack.logDir,
    SAP_TEST_DNS_UPSTREAM: `127.0.0.1:${dnsUpstreamPort}`,
    SAP_TEST_CA_DIR: testCa,
    SAP_TEST_WORKER_METRICS_URL: `http://127.0.0.1:${workerMetricsPort}/metrics`,
  };
  // Stack k's as SAP_TEST_*_k (test/worker-env.js picks a worker's); stack 1's also as SAP_TEST_*.
  for (const [name, value] of Object.entries(vars)) {
    process.env[`${name}_${k}`] = value;
    if (k === 1) process.env[name] = value;
  }
  return { stack, control, dataDir, ownTable: net.SANDBOX_NET_NAME! };
}
