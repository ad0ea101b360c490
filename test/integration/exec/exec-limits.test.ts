/**
 * Exec's bounds, tried as an attacker would (config/exec-limits.ts): an exec/run that prints far
 * more than its answer may hold, more exec sessions than a sandbox or an organisation may run, more
 * clients on one session than it takes, and clients that attach and never read.
 *
 * The stack runs with EXEC_SESSIONS_PER_ORG=48 and EXEC_WS_STALL_SECONDS=5 (test/global-setup.ts);
 * the rest are defaults: EXEC_RUN_OUTPUT_MAX_BYTES 1 MiB, EXEC_SESSIONS_PER_SANDBOX 32,
 * EXEC_ATTACHES_PER_SESSION 8. Everything runs in an organisation of its own, so that the count per
 * organisation is this file's alone.
 */
import fs, { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { WebSocket } from 'ws';
import { HostClient } from '../../../sandbox/host-contract/client';
import { startHost, type RunningHost } from '../../../sandbox/host/server';
import { otherOrgKey } from '../../helpers/checkpoints';
import { api, eventually, stackPid, T, unique } from '../../helpers/env';
import { attach, type Attached } from '../../helpers/exec';

const MiB = 1024 * 1024;
const PER_SANDBOX = 32;
const PER_ORG = 48;
const ATTACHES = 8;

let key: string;
const sandboxes: string[] = [];

const pidOf = (name: 'api' | 'host'): number => stackPid(name);
/** Resident memory of a process, in bytes. */
const rss = (pid: number): number => {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? 0) * 1024;
};

async function sandbox(): Promise<string> {
  const r = await api('POST', '/api/sandboxes', { key, body: {} });
  if (r.status !== 201) throw new Error(`create sandbox: ${r.status} ${JSON.stringify(r.body)}`);
  sandboxes.push(r.body.sandboxID as string);
  return r.body.sandboxID as string;
}

const start = (sb: string, body: Record<string, unknown>) => api('POST', `/api/sandboxes/${sb}/exec`, { key, body });

/** Opens `n` attachments in this organisation. */
const attachN = (sb: string, sid: string, n: number): Attached[] => Array.from({ length: n }, () => attach(sb, sid, { key }));

const opened: Attached[] = [];
const raws: WebSocket[] = [];

beforeAll(async () => {
  key = await otherOrgKey(unique('exec-limits'));
});

afterEach(() => {
  for (const a of opened.splice(0)) a.ws.terminate();
  for (const ws of raws.splice(0)) ws.terminate();
});

afterAll(async () => {
  await Promise.all(sandboxes.map((sb) => api('DELETE', `/api/sandboxes/${sb}`, { key })));
});

describe('exec limits', () => {
  it('exec/run answers a bounded body, marked truncated, when a command prints 16 MiB of control bytes', async () => {
    const sb = await sandbox();
    const [apiPid, hostPid] = [pidOf('api'), pidOf('host')];
    const before = { api: rss(apiPid), host: rss(hostPid) };
    const r = await api('POST', `/api/sandboxes/${sb}/exec/run`, {
      key,
      body: { cmd: 'bash', args: ['-c', 'head -c 16777216 /dev/zero | tr "\\0" "\\1"; head -c 16777216 /dev/zero | tr "\\0" "\\2" >&2'] },
    });
    const after = { api: rss(apiPid), host: rss(hostPid) };
    expect(r.status).toBe(200);
    expect(r.body.exitCode).toBe(0);
    expect(r.body.truncated).toBe(true);
    // The first 1 MiB of each stream, the rest dropped.
    expect(r.body.stdout).toBe('\x01'.repeat(MiB));
    expect(r.body.stderr).toBe('\x02'.repeat(MiB));
    // Unbounded, this raised the host's and the API's RSS by about 330 and 410 MiB.
    expect(after.api - before.api).toBeLessThan(128 * MiB);
    expect(after.host - before.host).toBeLessThan(128 * MiB);
    // Output within the bound is whole and not marked.
    const small = await api('POST', `/api/sandboxes/${sb}/exec/run`, {
      key,
      body: { cmd: 'bash', args: ['-c', 'head -c 1048576 /dev/zero | tr "\\0" "\\1"'] },
    });
    expect(small.body.stdout.length).toBe(MiB);
    expect(small.body.truncated).toBeUndefined();
    // run-async (the published client's exec.run): the result keeps the last 1 MiB and says so.
    const h = await api('POST', `/api/sandboxes/${sb}/exec/run-async`, {
      key,
      body: { cmd: 'bash', args: ['-c', 'head -c 16777216 /dev/zero | tr "\\0" "\\1"'] },
    });
    expect(h.status).toBe(201);
    const res = await eventually(async () => {
      const g = await api('GET', `/api/sandboxes/${sb}/exec/${h.body.execId as string}/result`, { key });
      return g.body.running === false ? g.body : null;
    }, 60_000);
    expect(res).toMatchObject({ exitCode: 0, truncated: true });
    expect(res.stdout).toBe('\x01'.repeat(MiB));
  }, 120_000);

  it('refuses an attach past EXEC_ATTACHES_PER_SESSION with rate_limited', async () => {
    const sb = await sandbox();
    const es = await start(sb, { cmd: 'sleep', args: ['600'] });
    expect(es.status).toBe(201);
    const sid = es.body.sessionID as string;
    const clients = attachN(sb, sid, ATTACHES);
    opened.push(...clients);
    await Promise.all(clients.map((c) => c.until(() => c.scrollbackDone)));
    await eventually(async () => (await api('GET', `/api/sandboxes/${sb}/exec/${sid}`, { key })).body.attachedClients === ATTACHES);
    const extra = attach(sb, sid, { key });
    opened.push(extra);
    const closed = await extra.closed;
    expect(closed.code).toBe(1008);
    expect(extra.texts.map((t) => JSON.parse(t) as { error: { type: string } })).toEqual([
      { error: { type: 'rate_limited', message: expect.stringContaining('EXEC_ATTACHES_PER_SESSION') } },
    ]);
    expect(extra.scrollbackDone).toBe(false);
    // A client that leaves makes room.
    clients[0]!.ws.close();
    await clients[0]!.closed;
    await eventually(async () => (await api('GET', `/api/sandboxes/${sb}/exec/${sid}`, { key })).body.attachedClients === ATTACHES - 1);
    const again = attach(sb, sid, { key });
    opened.push(again);
    await again.until(() => again.scrollbackDone);
    expect((await api('POST', `/api/sandboxes/${sb}/exec/${sid}/kill`, { key, body: {} })).body.running).toBe(false);
  }, 120_000);

  it('closes attached clients that never read, with 1008 and a reason, and frees what they held', async () => {
    const sb = await sandbox();
    // Prints without end; only backpressure holds it.
    const es = await start(sb, { cmd: 'bash', args: ['-c', 'cat /dev/zero | tr "\\0" x'] });
    expect(es.status).toBe(201);
    const sid = es.body.sessionID as string;
    const apiPid = pidOf('api');
    const before = rss(apiPid);
    const base = T.api().replace(/^http/, 'ws');
    const results = await Promise.all(
      Array.from({ length: ATTACHES }, async () => {
        const ws = new WebSocket(`${base}/api/sandboxes/${sb}/exec/${sid}?api_key=${encodeURIComponent(key)}`);
        raws.push(ws);
        const closed = new Promise<{ code: number; reason: string }>((resolve) =>
          ws.on('close', (code, reason) => resolve({ code, reason: reason.toString() })),
        );
        ws.on('error', () => undefined);
        await new Promise<void>((resolve, reject) => {
          ws.once('open', () => resolve());
          ws.once('error', reject);
        });
        // Read nothing from here on.
        (ws as unknown as { _socket: { pause(): void } })._socket.pause();
        return { ws, closed };
      }),
    );
    // The API drops them (the host then counts none), however long they would have waited.
    await eventually(async () => (await api('GET', `/api/sandboxes/${sb}/exec/${sid}`, { key })).body.attachedClients >= 1, 30_000);
    await eventually(async () => (await api('GET', `/api/sandboxes/${sb}/exec/${sid}`, { key })).body.attachedClients === 0, 60_000);
    expect(rss(apiPid) - before).toBeLessThan(128 * MiB);
    // Reading again, each finds the close frame and its reason behind what it had not read.
    for (const r of results) (r.ws as unknown as { _socket: { resume(): void } })._socket.resume();
    const closes = await Promise.all(results.map((r) => r.closed));
    for (const c of closes) {
      expect(c.code).toBe(1008);
      expect(c.reason).toMatch(/^client not reading: /);
    }
    // The command was not held up for good: a reading client gets live output.
    const reader = attach(sb, sid, { key });
    opened.push(reader);
    await reader.until(() => reader.scrollbackDone && reader.text('stdout').length > 2 * MiB, 30_000);
    expect((await api('POST', `/api/sandboxes/${sb}/exec/${sid}/kill`, { key, body: {} })).status).toBe(200);
  }, 180_000);
  // Last: it leaves the organisation at its cap.
  it('refuses the exec session past the per-sandbox and the per-organisation caps with 429', async () => {
    const a = await sandbox();
    const b = await sandbox();
    const sleep = { cmd: 'sleep', args: ['600'] };
    const first = await Promise.all(Array.from({ length: PER_SANDBOX }, () => start(a, sleep)));
    expect(first.map((r) => r.status)).toEqual(Array(PER_SANDBOX).fill(201));
    const over = await start(a, sleep);
    expect(over.status).toBe(429);
    expect(over.body.error).toMatchObject({ type: 'rate_limited', message: expect.stringContaining('EXEC_SESSIONS_PER_SANDBOX') });
    // run-async starts a session too.
    expect((await api('POST', `/api/sandboxes/${a}/exec/run-async`, { key, body: sleep })).status).toBe(429);

    const second = await Promise.all(Array.from({ length: PER_ORG - PER_SANDBOX }, () => start(b, sleep)));
    expect(second.map((r) => r.status)).toEqual(Array(PER_ORG - PER_SANDBOX).fill(201));
    const overOrg = await start(b, sleep);
    expect(overOrg.status).toBe(429);
    expect(overOrg.body.error).toMatchObject({ type: 'rate_limited', message: expect.stringContaining('EXEC_SESSIONS_PER_ORG') });

    // The count is of running sessions: once one exits, another may start.
    const done = first[0]!.body.sessionID as string;
    expect((await api('POST', `/api/sandboxes/${a}/exec/${done}/kill`, { key, body: {} })).body.running).toBe(false);
    expect((await start(b, sleep)).status).toBe(201);
    expect((await start(b, sleep)).status).toBe(429);
  }, 180_000);
});

/** The host's own bounds, with small limits, on a host of the process provider started here. */
describe('exec limits on the sandbox host', () => {
  let dataDir: string;
  let host: RunningHost;
  let client: HostClient;
  const id = `sb-xlim${process.pid}`;
  const sockets: WebSocket[] = [];

  beforeAll(async () => {
    dataDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-xlim-'));
    host = await startHost({
      dataDir,
      token: 't',
      provider: 'process',
      listen: '127.0.0.1:0',
      execLimits: {
        EXEC_RUN_OUTPUT_MAX_BYTES: 64 * 1024,
        EXEC_SESSIONS_PER_SANDBOX: 2,
        EXEC_SESSIONS_PER_ORG: 2,
        EXEC_ATTACHES_PER_SESSION: 1,
        EXEC_WS_BACKLOG_MAX_BYTES: 64 * 1024,
        EXEC_WS_STALL_SECONDS: 1,
      },
    });
    client = new HostClient({ url: host.url, token: 't' });
    await client.createSandbox({ id, orgId: 'o' });
  });

  afterEach(() => {
    for (const ws of sockets.splice(0)) ws.terminate();
  });

  afterAll(async () => {
    await client.destroySandbox(id).catch(() => undefined);
    await host.close();
    await fsp.rm(dataDir, { recursive: true, force: true });
  });

  it('drops a client with more than EXEC_WS_BACKLOG_MAX_BYTES unsent, and refuses a second attach and a third session with 429', async () => {
    const run = await client.execRun(id, { cmd: 'bash', args: ['-c', 'head -c 1000000 /dev/zero'] });
    expect(run).toMatchObject({ truncated: true, exitCode: 0 });
    expect(run.stdout.length).toBe(64 * 1024);

    const es = await client.createExec(id, { cmd: 'bash', args: ['-c', 'cat /dev/zero'] });
    const other = await client.createExec(id, { cmd: 'sleep', args: ['600'] });
    await expect(client.createExec(id, { cmd: 'sleep', args: ['600'] })).rejects.toMatchObject({ status: 429, type: 'rate_limited' });

    const ws = client.openExecSocket(id, es.sessionID);
    sockets.push(ws);
    ws.on('error', () => undefined);
    const closed = new Promise<void>((resolve) => ws.on('close', () => resolve()));
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('error', reject);
    });
    (ws as unknown as { _socket: { pause(): void; resume(): void } })._socket.pause();
    // While it is attached, a second client is refused.
    const second = client.openExecSocket(id, es.sessionID);
    sockets.push(second);
    const refused = await new Promise<number | undefined>((resolve) => {
      second.once('unexpected-response', (_req, res) => resolve(res.statusCode));
      second.once('open', () => resolve(undefined));
      second.once('error', () => resolve(undefined));
    });
    expect(refused).toBe(429);
    // The paused client is dropped once its backlog passes 64 KiB.
    await eventually(async () => (await client.getExec(id, es.sessionID)).attachedClients === 0, 30_000);
    (ws as unknown as { _socket: { resume(): void } })._socket.resume();
    await closed;
    await client.killExec(id, es.sessionID);
    await client.killExec(id, other.sessionID);
  }, 60_000);
});
