import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startProductionStack, type ProductionStack } from '../../../scripts/production';
import { countRuns } from '../../../sandbox/audit-log';
import { connectStore } from '../../../store';
import { SERVER_JS, viaHost } from '../../helpers/previews';
import { newSandbox, sh, type ApiCall } from '../../helpers/sandboxes';
import { ownStackEnv } from '../../helpers/own-stack-env';

/**
 * The production profile (scripts/production.ts), started by this file in a temporary directory: the
 * Temporal server on PostgreSQL, FerretDB on PostgreSQL, two sandbox hosts with their workers and two
 * APIs. Sessions, a batch, exec and a preview go through both APIs; then the faults of
 * docs/operations/production.md: kill -9 of the Temporal server, a restart of PostgreSQL, kill -9 of
 * one API and of one worker. Every create, answered or not (a refused one is sent again with its
 * Idempotency-Key once the stack is back), makes one session that ends completed with its own input;
 * the store holds no other; no entrypoint ran twice (the hosts' entrypoint audit logs); every wait is bounded.
 */
jest.setTimeout(420_000);

const KEY = 'production-test-key';
const TOKEN = 'production-host-token-0123456789';
let prod: ProductionStack;
let dataDir: string;

/** The hosts' networks: SAP_PROD_NET_* when set, else halves of this run's SANDBOX_NET_* (see docs/operations/production.md). */
function testNet(): { name: string; cidr: string; idBase: number } | undefined {
  const name = process.env.SAP_PROD_NET_NAME ?? process.env.SANDBOX_NET_NAME;
  const cidr = process.env.SAP_PROD_NET_CIDR ?? process.env.SANDBOX_NET_CIDR;
  const base = process.env.SAP_PROD_ID_BASE ?? process.env.SANDBOX_ID_BASE;
  return name && cidr && base ? { name, cidr, idBase: Number(base) } : undefined;
}

beforeAll(async () => {
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sap-prod-'));
  prod = await startProductionStack({
    dataDir,
    apiKey: KEY,
    hostToken: TOKEN,
    net: testNet(),
    env: await ownStackEnv({
      // Each API reaches a sandbox's preview through its host's HTTP port, as an API on another machine does.
      PREVIEW_TRANSPORT: 'tcp',
    }),
  });
}, 300_000);

afterAll(async () => {
  await prod?.stop({ destroySandboxes: true });
  const keep = path.join(os.tmpdir(), 'sap-production-last-logs');
  fs.rmSync(keep, { recursive: true, force: true });
  if (dataDir && fs.existsSync(path.join(dataDir, 'logs'))) fs.cpSync(path.join(dataDir, 'logs'), keep, { recursive: true });
  if (dataDir) fs.rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

async function call<T = any>(
  i: number,
  method: string,
  p: string,
  body?: unknown,
  key = KEY,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: T }> {
  const res = await fetch(`${prod.apiUrls[i % 2]}${p}`, {
    method,
    headers: { 'x-api-key': key, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(30_000),
  });
  const text = await res.text();
  return { status: res.status, body: (text ? JSON.parse(text) : null) as T };
}

/** A call that a fault may refuse (connection refused, 5xx): null then. */
const tryCall = (i: number, method: string, p: string, body?: unknown, headers?: Record<string, string>) =>
  call(i, method, p, body, KEY, headers).catch(() => null);

/** Waits (bounded) until the session ends, asking the APIs in turn; an API that is down is skipped. */
async function waitSession(agent: string, id: string, timeoutMs = 120_000): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  for (let n = 0; ; n++) {
    const r = await tryCall(n, 'GET', `/v1/agents/${agent}/sessions/${id}?wait=5`);
    if (r?.status === 200 && (r.body.status === 'completed' || r.body.status === 'failed')) return r.body;
    if (Date.now() > deadline) throw new Error(`session ${id} still ${r ? `${r.status} ${r.body?.status}` : 'unreachable'} after ${timeoutMs} ms`);
    if (!r || r.status !== 200) await new Promise((res) => setTimeout(res, 500));
  }
}

/** Entrypoint runs per session over both hosts' audit logs (a restarted worker's retry that adopts a run counts once). */
function runsPerSession(): Map<string, number> {
  return countRuns(
    prod.stack.hostList
      .map((h) => path.join(h.dataDir, 'audit', 'entrypoints.ndjson'))
      .filter((f) => fs.existsSync(f))
      .map((f) => fs.readFileSync(f, 'utf8'))
      .join('\n'),
  );
}

const viaApi = (i: number, hostname: string, p: string) => viaHost(hostname, p, { api: prod.apiUrls[i] });

describe('the production profile', () => {
  it('runs the real Temporal server and FerretDB on PostgreSQL, two hosts and two APIs that refuse a wrong key', async () => {
    expect(prod.stack.hostList).toHaveLength(2);
    for (const url of prod.apiUrls) expect((await fetch(`${url}/healthz`)).status).toBe(200);
    for (const i of [0, 1]) expect((await call(i, 'GET', '/v1/agents', undefined, 'not-a-key')).status).toBe(401);
    // The stores are PostgreSQL's: Temporal's tables and FerretDB's schema are in its databases.
    expect(fs.existsSync(path.join(prod.postgres.dataDir, 'PG_VERSION'))).toBe(true);
    expect(fs.readFileSync(path.join(dataDir, 'temporal', 'production.yaml'), 'utf8')).toMatch(/pluginName: postgres12/);
    expect(fs.statSync(path.join(dataDir, 'postgres.password')).mode & 0o077).toBe(0);
  });

  it('keeps the store working with the driver options a MongoDB replica set takes (docs/operations/production.md)', async () => {
    // What can be checked here: the store connects, writes and reads with these options in MONGO_URL,
    // and makes its indexes. FerretDB accepts and ignores write and read concerns (it has no replicas).
    const store = await connectStore(`${prod.mongoUrl}?w=majority&journal=true&readConcernLevel=majority&retryWrites=true&wtimeoutMS=5000`);
    try {
      const c = store.db.collection<{ _id: string; n: number }>('replica_options_check');
      await c.insertOne({ _id: 'a', n: 1 });
      await c.updateOne({ _id: 'a' }, { $inc: { n: 1 } });
      expect(await c.findOne({ _id: 'a' })).toEqual({ _id: 'a', n: 2 });
      await expect(c.insertOne({ _id: 'a', n: 3 })).rejects.toMatchObject({ code: 11000 });
      expect((await store.sessions.indexes()).map((i) => i.name)).toEqual(expect.arrayContaining(['orgId_1_agent_id_1_created_at_-1']));
    } finally {
      await store.close();
    }
  });

  it('serves sessions, a batch, exec and a preview through both APIs', async () => {
    expect(
      (await call(0, 'POST', '/v1/agents', { id: 'copy', core: 'bash', entrypoint: ['bash', '-c', 'cp "$AGENT_INPUT_PATH" /tmp/agent_result.json'] })).status,
    ).toBe(201);
    // Created through one API, read through the other.
    const ids: string[] = [];
    for (let i = 0; i < 8; i++) {
      const r = await call(i, 'POST', '/v1/agents/copy/sessions', { input: { i } });
      expect(r.status).toBe(201);
      ids.push(r.body.id);
    }
    const ended = await Promise.all(ids.map((id, i) => call(i + 1, 'GET', `/v1/agents/copy/sessions/${id}?wait=30`).then(() => waitSession('copy', id))));
    expect(ended.map((s) => [s.status, s.result?.i])).toEqual(ids.map((_, i) => ['completed', i]));

    const batch = await call(1, 'POST', '/v1/agents/copy/batches', { items: [0, 1, 2, 3, 4].map((n) => ({ input: { n } })), concurrency: 3 });
    expect(batch.status).toBe(201);
    let b: any;
    for (const deadline = Date.now() + 120_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 500))) {
      b = (await call(0, 'GET', `/v1/agents/copy/batches/${batch.body.id}`)).body;
      if (b.status === 'completed') break;
    }
    expect(b).toMatchObject({ status: 'completed', total: 5 });
    const lines = (await (await fetch(`${prod.apiUrls[0]}/v1/agents/copy/batches/${batch.body.id}/results`, { headers: { 'x-api-key': KEY } })).text())
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.status, l.data?.n]).sort()).toEqual([0, 1, 2, 3, 4].map((n) => ['completed', n]));

    // The agent's session list, paged 3 at a time through both APIs: every session once, newest first.
    const listed: { id: string; created_at: string }[] = [];
    let cursor: string | null = null;
    for (let p = 0; p < 20; p++) {
      const r: { status: number; body: any } = await call(p, 'GET', `/v1/agents/copy/sessions?limit=3${cursor ? `&cursor=${cursor}` : ''}`);
      expect(r.status).toBe(200);
      listed.push(...r.body.sessions);
      cursor = r.body.next_cursor;
      if (!cursor) break;
    }
    expect(cursor).toBeNull();
    expect(new Set(listed.map((s) => s.id)).size).toBe(13);
    expect(listed).toHaveLength(13);
    expect(listed.map((s) => s.id)).toEqual(expect.arrayContaining(ids));
    const times = listed.map((s) => Date.parse(s.created_at));
    expect(times).toEqual([...times].sort((x, y) => y - x));

    // A sandbox made through one API, used through the other (exec and a preview).
    const via =
      (i: number): ApiCall =>
      (method, p, opts) =>
        call(i, method, p, opts.body);
    const sb = await newSandbox({}, { via: via(0) });
    expect(await sh(sb, 'echo hello from $((6 * 7))', { via: via(1) })).toBe('hello from 42\n');
    expect((await call(1, 'POST', `/api/sandboxes/${sb}/exec`, { cmd: 'node', args: ['-e', SERVER_JS, '8000'] })).status).toBe(201);
    const preview = await call(0, 'POST', `/api/sandboxes/${sb}/preview`, { port: 8000 });
    expect(preview.status).toBe(201);
    for (const i of [1, 0]) {
      let res = { status: 0, text: '' };
      for (let n = 0; n < 100 && res.status !== 200; n++) {
        res = await viaApi(i, String(preview.body.hostname), '/hi?x=1');
        if (res.status !== 200) await new Promise((r) => setTimeout(r, 100));
      }
      expect(res.status).toBe(200);
      expect(JSON.parse(res.text)).toMatchObject({ port: 8000, url: '/hi?x=1' });
    }
    expect((await call(1, 'DELETE', `/api/sandboxes/${sb}`)).status).toBeLessThan(300);
  });

  it('loses nothing and runs nothing twice through kill -9 of Temporal, a PostgreSQL restart, and kill -9 of an API and a worker', async () => {
    expect(
      (
        await call(0, 'POST', '/v1/agents', {
          id: 'slow',
          core: 'bash',
          entrypoint: ['bash', '-c', 'sleep 2; cp "$AGENT_INPUT_PATH" /tmp/agent_result.json'],
        })
      ).status,
    ).toBe(201);
    const accepted = new Map<string, number>();
    const refused: string[] = [];
    /** Creates that were refused or got no answer (each may have reached a server and run all the same). */
    const unanswered: number[] = [];
    /** Each create carries an Idempotency-Key: sent again, it finds the session its first try made, if any. */
    const keyOf = (i: number) => ({ 'idempotency-key': `prod-fault-${i}` });
    let n = 0;
    let phase = 'start';
    /**
     * Starts a few sessions through both APIs, all at once (a refusal during an outage can take the API
     * its whole wait for Temporal, ~20 s: one after another they would add up); those a fault refuses
     * are not counted (nothing was promised), but noted.
     */
    const burst = async (count: number) => {
      const label = phase;
      await Promise.all(
        Array.from({ length: count }, async () => {
          const i = n++;
          const r = await tryCall(i, 'POST', '/v1/agents/slow/sessions', { input: { n: i } }, keyOf(i));
          if (r?.status === 201) accepted.set(r.body.id, i);
          else {
            unanswered.push(i);
            refused.push(`${label}: api${(i % 2) + 1} ${r ? `${r.status} ${r.body?.error?.type}` : 'no answer'}`);
          }
        }),
      );
    };
    await burst(6);
    expect(accepted.size).toBe(6);
    // kill -9 of the Temporal server, while sessions run; it comes back on the same database.
    phase = 'temporal killed';
    await prod.kill('temporal', 'SIGKILL');
    await burst(2);
    await prod.start('temporal');
    phase = 'temporal back';
    await burst(4);
    // PostgreSQL restarts (fast shutdown: connections cut) under Temporal and FerretDB.
    phase = 'postgres down';
    await prod.kill('postgres', 'SIGINT');
    await burst(2);
    await prod.start('postgres');
    phase = 'postgres back';
    await burst(4);
    // kill -9 of the first API (the second serves meanwhile), then of the first host's worker mid-session.
    phase = 'api killed';
    await prod.kill('api', 'SIGKILL');
    await burst(3);
    await prod.start('api');
    phase = 'api back';
    await burst(4);
    phase = 'worker killed';
    await prod.kill('worker', 'SIGKILL');
    await burst(3);
    await prod.start('worker');
    phase = 'worker back';
    await burst(2);

    // After the faults the stack takes sessions again through both APIs (within a bounded wait).
    phase = 'after';
    for (const deadline = Date.now() + 90_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 1000))) {
      const r = await Promise.all([0, 1].map((i) => tryCall(i, 'GET', '/readyz')));
      if (r.every((x) => x?.status === 200)) break;
    }
    const before = accepted.size;
    await burst(4);
    expect(accepted.size - before).toBe(4);
    process.stderr.write(`production faults: ${accepted.size} sessions accepted, ${refused.length} refused: ${JSON.stringify(refused)}\n`);
    // A refusal is an outage the client can wait out (503 unavailable), or no answer from the killed API: never a 500.
    expect(refused.filter((r) => !/ (503 unavailable|no answer)$/.test(r))).toEqual([]);
    // A refused or unanswered create may still have reached a server (stored, even started): the
    // client sends it again with its key, now that the stack is back. 200: its first try had made
    // the session (and it is started now if it was not); 201: it had not. Either way, one session.
    const retried = new Map<string, number>();
    await Promise.all(
      unanswered.map(async (i) => {
        const r = await call(i, 'POST', '/v1/agents/slow/sessions', { input: { n: i } }, KEY, keyOf(i));
        expect([200, 201]).toContain(r.status);
        retried.set(r.body.id, i);
      }),
    );
    const all = new Map([...accepted, ...retried]);
    expect(all.size).toBe(n);
    const ended = await Promise.all([...all.keys()].map((id) => waitSession('slow', id, 180_000)));
    expect(ended.map((s) => [s.status, s.result?.n])).toEqual([...all.values()].map((v) => ['completed', v]));
    // Every session the store has of the agent is one of these: no create made a session the client never heard of.
    const listed: string[] = [];
    for (let cursor: string | null = null, page = 0; page === 0 || cursor; page++) {
      const r: { status: number; body: any } = await call(page, 'GET', `/v1/agents/slow/sessions?limit=100${cursor ? `&cursor=${cursor}` : ''}`);
      expect(r.status).toBe(200);
      listed.push(...r.body.sessions.map((x: { id: string }) => x.id));
      cursor = r.body.next_cursor;
    }
    expect(listed.sort()).toEqual([...all.keys()].sort());
    // Each of them, answered or not, started its entrypoint exactly once, on one host; and no
    // entrypoint of the whole file (other agents, the batch) started twice.
    const perSession = runsPerSession();
    expect([...all.keys()].map((id) => [id, perSession.get(id) ?? 0])).toEqual([...all.keys()].map((id) => [id, 1]));
    expect([...perSession].filter(([, runs]) => runs !== 1)).toEqual([]);
  });
});
