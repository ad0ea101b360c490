import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { freePort, ProcName, startStack, Stack } from '../scripts/launcher';
import { makeTestCa } from './helpers/test-ca';

/**
 * Starts one real stack (Temporal dev server, FerretDB, sandbox host, worker, API) on free ports
 * for the whole run, plus a small control endpoint through which tests can kill and restart
 * its processes. Tests find it through SAP_TEST_* environment variables.
 */
export default async function globalSetup(): Promise<void> {
  const t0 = Date.now();
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
      // Exec limits a test can reach (test/integration/exec-limits.test.ts; defaults 256 and 30 s).
      EXEC_SESSIONS_PER_ORG: '48',
      EXEC_WS_STALL_SECONDS: '5',
      // The console's link to a session's workflow (test/integration/console.test.ts checks its href; no UI runs here).
      TEMPORAL_UI_URL: 'http://temporal-ui.test.invalid:8233',
      // Lets test/integration/entrypoint-once.test.ts stop the host at a point of an entrypoint's start (off without the file).
      SANDBOX_TEST_PAUSE_FILE: path.join(dataDir, 'test-pause-entrypoint'),
    },
    // As under npm start: a process that dies unexpectedly comes back (test/integration/supervision.test.ts).
    supervise: true,
    log: (line) => process.stderr.write(`[stack supervisor] ${line}\n`),
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
  Object.assign(process.env, {
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
  });
  (globalThis as { __SAP_STACK__?: unknown }).__SAP_STACK__ = { stack, control, dataDir };
  process.stderr.write(`[global setup] the test stack started in ${((Date.now() - t0) / 1000).toFixed(1)} s\n`);
}
