import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { isDeepStrictEqual, parseArgs } from 'node:util';
import { batchSessionId } from '../lib/batch-ids';
import { sandboxIdForSession } from '../lib/naming';
import { countRuns, defaultAuditLogPath } from '../sandbox';
import { defaultScratchDir } from '../sandbox';
import type { BaseProcName as ProcName, StackFile } from './launcher';

/**
 * `npm run chaos`: sessions and a batch against a running `npm start` stack while its processes are
 * killed with SIGKILL, then checks that nothing was lost, run twice or left behind. Prints one JSON
 * line; exits 1 when a check fails. Not part of `npm test`.
 *
 *   DATA_DIR=… npm run chaos -- [--sessions 300] [--batch 300] [--c 30] [--kills worker=5,host=2,api=2,mongo=1,temporal=1] [--seed N]
 *
 * It reads `<DATA_DIR>/stack.json` (written by npm start's supervisor) for the processes' pids and
 * addresses, and `<DATA_DIR>/audit/entrypoints.ndjson` (the sandbox host's entrypoint audit log)
 * to count how many times each session's agent was started. `--kills none` runs the workload and
 * the checks without killing anything.
 */
const { values } = parseArgs({
  options: {
    sessions: { type: 'string' },
    batch: { type: 'string' },
    c: { type: 'string' },
    kills: { type: 'string' },
    seed: { type: 'string' },
    'data-dir': { type: 'string' },
    url: { type: 'string' },
    key: { type: 'string' },
    out: { type: 'string' },
  },
});

const DATA_DIR = path.resolve(values['data-dir'] ?? process.env.DATA_DIR ?? '.data');
const STACK_FILE = path.join(DATA_DIR, 'stack.json');
const KEY = values.key ?? process.env.SAP_API_KEY ?? process.env.API_KEY ?? 'dev-key';
const N_SESSIONS = Number(values.sessions ?? 300);
const N_BATCH = Number(values.batch ?? 300);
const CONCURRENCY = Number(values.c ?? 30);
const SEED = Number(values.seed ?? Date.now() % 1_000_000);
const TASK_QUEUE = process.env.TASK_QUEUE ?? 'sandbox-agents';
const OUT_DIR = path.resolve(values.out ?? path.join(DATA_DIR, 'chaos'));

const KILL_PLAN: Record<ProcName, number> = parseKills(values.kills ?? 'worker=5,host=2,api=2,mongo=1,temporal=1');
/** A process is killed again only this long after its last kill: the supervisor gives up on 5 deaths in 60 s. */
const SAME_PROCESS_SPACING_MS = 20_000;
/** How long one session may take, from its creation, before it counts as lost. */
const SESSION_DEADLINE_MS = 8 * 60_000;
/** How long the stack may take to come back after one kill. */
const RECOVERY_LIMIT_MS = 180_000;

function parseKills(spec: string): Record<ProcName, number> {
  const plan: Record<ProcName, number> = { worker: 0, host: 0, api: 0, mongo: 0, temporal: 0 };
  if (spec === 'none') return plan;
  for (const part of spec.split(',')) {
    const [name, n] = part.split('=');
    if (!(name! in plan) || !/^\d+$/.test(n ?? '')) throw new Error(`--kills: bad part ${part} (e.g. worker=5,host=2)`);
    plan[name as ProcName] = Number(n);
  }
  return plan;
}

/** A small seeded generator (mulberry32), so that a run's mix and kill order can be repeated. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = rng(SEED);
const between = (lo: number, hi: number) => lo + Math.floor(rand() * (hi - lo + 1));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function readStack(): StackFile | null {
  try {
    return JSON.parse(fs.readFileSync(STACK_FILE, 'utf8')) as StackFile;
  } catch {
    return null;
  }
}

const initialStack = readStack();
const API = values.url ?? process.env.SAP_API_URL ?? initialStack?.apiUrl ?? 'http://127.0.0.1:8080';
const HOST_URL = initialStack?.hostUrl ?? `http://${process.env.HOST_LISTEN ?? '127.0.0.1:7300'}`;
const TEMPORAL_ADDRESS = initialStack?.temporalAddress ?? process.env.TEMPORAL_ADDRESS ?? '127.0.0.1:7233';

function hostToken(): string {
  if (process.env.HOST_TOKEN) return process.env.HOST_TOKEN;
  return fs.readFileSync(path.join(DATA_DIR, 'host.token'), 'utf8').trim();
}

// ---------------------------------------------------------------------------------------------
// The client: retries on 503 and on a refused or broken connection, with backoff, and counts
// every answer; a 5xx other than 503 is a finding.

const httpStats = {
  requests: 0,
  retries: 0,
  byStatus: {} as Record<string, number>,
  connectionErrors: 0,
  /** 503 answers without the `{ error: { type, message } }` body. */
  bad503Bodies: 0,
  serverErrors: [] as { method: string; path: string; status: number; body: string }[],
};

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  json: any;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 200 });

function once(method: string, url: string, body: string | undefined, headers: Record<string, string>, timeoutMs: number): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const h: Record<string, string | number> = { 'x-api-key': KEY, ...headers };
    if (body !== undefined) h['content-length'] = Buffer.byteLength(body);
    const req = http.request(url, { method, headers: h, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json: any = null;
        try {
          json = text ? JSON.parse(text) : null;
        } catch {
          /* NDJSON or not JSON */
        }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json });
      });
    });
    req.setTimeout(timeoutMs, () => req.destroy(new Error('request timed out')));
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * One API call. 503s and connection failures (the API or something behind it is restarting) are
 * retried with backoff up to `giveUpMs`; every other answer is returned.
 */
async function call(method: string, p: string, body?: unknown, opts: { headers?: Record<string, string>; giveUpMs?: number; raw?: string } = {}): Promise<Answer> {
  const payload = opts.raw ?? (body === undefined ? undefined : JSON.stringify(body));
  const headers: Record<string, string> = { ...(payload !== undefined && !opts.headers?.['content-type'] ? { 'content-type': 'application/json' } : {}), ...opts.headers };
  const deadline = Date.now() + (opts.giveUpMs ?? 300_000);
  const waitS = Number(/[?&]wait=(\d+)/.exec(p)?.[1] ?? 0);
  let delay = 100;
  for (let attempt = 0; ; attempt++) {
    if (attempt > 0) httpStats.retries++;
    httpStats.requests++;
    let a: Answer | null = null;
    try {
      a = await once(method, `${API}${p}`, payload, headers, (waitS + 30) * 1000);
    } catch {
      httpStats.connectionErrors++;
    }
    if (a) {
      httpStats.byStatus[a.status] = (httpStats.byStatus[a.status] ?? 0) + 1;
      if (a.status === 503) {
        if (typeof a.json?.error?.type !== 'string' || typeof a.json?.error?.message !== 'string') httpStats.bad503Bodies++;
      } else if (a.status >= 500) {
        httpStats.serverErrors.push({ method, path: p, status: a.status, body: a.text.slice(0, 300) });
      } else {
        return a;
      }
    }
    if (Date.now() > deadline) throw new Error(`${method} ${p}: no answer but 5xx or connection errors for ${opts.giveUpMs ?? 300_000} ms`);
    await sleep(delay * (0.5 + rand()));
    delay = Math.min(delay * 2, 3000);
  }
}

// ---------------------------------------------------------------------------------------------
// The workload.

/** What a session's agent is asked to do, and so how it must end. */
type Kind = 'quick' | 'sleep' | 'fail' | 'timeout';
interface Task {
  kind: Kind;
  input: { n: number; mode: Kind; secs: number; code: number; tag: string };
}

/** The agent: sleeps `secs`, writes `{ echo: <input>, session }` as its result, exits `code`. */
const AGENT_SCRIPT = [
  'in=$(<"$AGENT_INPUT_PATH")',
  'secs=0; [[ $in =~ \\"secs\\":([0-9]+) ]] && secs=${BASH_REMATCH[1]}',
  'code=0; [[ $in =~ \\"code\\":([0-9]+) ]] && code=${BASH_REMATCH[1]}',
  'if [ "$secs" -gt 0 ]; then sleep "$secs"; fi',
  'printf \'{"echo":%s,"session":"%s"}\' "$in" "$SESSION_ID" > /tmp/agent_result.json',
  'exit "$code"',
].join('\n');
/** The timeout agent's limit; its sessions sleep far longer. */
const SHORT_TIMEOUT_S = 2;

function makeTask(n: number, tag: string, kinds: [Kind, number][]): Task {
  let r = rand();
  let kind: Kind = kinds[0]![0];
  for (const [k, w] of kinds) {
    if (r < w) {
      kind = k;
      break;
    }
    r -= w;
  }
  const secs = kind === 'sleep' ? between(1, 5) : kind === 'timeout' ? 60 : 0;
  const code = kind === 'fail' ? between(1, 9) : 0;
  return { kind, input: { n, mode: kind, secs, code, tag } };
}

/** Why an ending is not the one the task deserves, or null when it is. */
function judge(task: Task, r: { status: string; data: any; reason: string | null; exit_code: number | null }): string | null {
  const echoed = isDeepStrictEqual(r.data?.echo, task.input);
  switch (task.kind) {
    case 'quick':
    case 'sleep':
      if (r.status !== 'completed') return `expected completed, got ${r.status} (${r.reason}: exit ${r.exit_code})`;
      return echoed ? null : `wrong result ${JSON.stringify(r.data).slice(0, 200)}`;
    case 'fail':
      if (r.status !== 'failed' || r.reason !== 'exit_code' || r.exit_code !== task.input.code) return `expected failed/exit_code ${task.input.code}, got ${r.status}/${r.reason} ${r.exit_code}`;
      return echoed ? null : `wrong result ${JSON.stringify(r.data).slice(0, 200)}`;
    case 'timeout':
      return r.status === 'failed' && r.reason === 'timeout' ? null : `expected failed/timeout, got ${r.status}/${r.reason} ${r.exit_code}`;
  }
}

interface SessionRecord {
  n: number;
  task: Task;
  agentId: string;
  id?: string;
  wrong?: string;
  lost?: string;
}

async function runSession(rec: SessionRecord, runId: string): Promise<void> {
  const created = await call('POST', `/v1/agents/${rec.agentId}/sessions`, { input: rec.task.input }, { headers: { 'idempotency-key': `chaos-${runId}-${rec.n}` } });
  if (created.status !== 201 && created.status !== 200) {
    rec.lost = `create answered ${created.status}: ${created.text.slice(0, 200)}`;
    return;
  }
  rec.id = created.json.id as string;
  const deadline = Date.now() + SESSION_DEADLINE_MS;
  for (;;) {
    const r = await call('GET', `/v1/agents/${rec.agentId}/sessions/${rec.id}/result?wait=30`);
    if (r.status === 200) {
      rec.wrong = judge(rec.task, r.json) ?? undefined;
      return;
    }
    if (r.status !== 409) {
      rec.lost = `result answered ${r.status}: ${r.text.slice(0, 200)}`;
      return;
    }
    if (Date.now() > deadline) {
      rec.lost = `not ended after ${SESSION_DEADLINE_MS / 1000} s`;
      return;
    }
  }
}

interface BatchOutcome {
  id: string;
  tasks: Task[];
  status?: string;
  counts: unknown;
  linesFile: string;
  lines: number;
  missing: number[];
  duplicateLines: number[];
  wrong: { index: number; why: string }[];
  /** Attempts each item should have had: 1 for items that complete, maxAttempts for those that fail. */
  expectedAttempts: number[];
}

/**
 * A batch of N_BATCH items (maxAttempts 2) whose results are followed while it runs, as a client
 * writing a results file would: each page is appended to the file, resuming after the last index.
 */
async function runBatch(agentId: string, runId: string): Promise<BatchOutcome> {
  const tasks = Array.from({ length: N_BATCH }, (_, i) => makeTask(i, `b-${runId}`, [['quick', 0.5], ['sleep', 0.3], ['fail', 0.2]]));
  const created = await call('POST', `/v1/agents/${agentId}/batches`, { items: tasks.map((t) => ({ input: t.input })), concurrency: CONCURRENCY, maxAttempts: 2 }, { headers: { 'idempotency-key': `chaos-${runId}-batch` } });
  if (created.status !== 201 && created.status !== 200) throw new Error(`create batch: ${created.status} ${created.text}`);
  const id = created.json.id as string;
  fs.mkdirSync(OUT_DIR, { recursive: true });
  const linesFile = path.join(OUT_DIR, `${id}.results.ndjson`);
  fs.writeFileSync(linesFile, '');
  let after = -1;
  let status = 'running';
  const deadline = Date.now() + SESSION_DEADLINE_MS * 2;
  for (;;) {
    const page = await call('GET', `/v1/agents/${agentId}/batches/${id}/results?after=${after}&limit=1000`);
    if (page.status !== 200) throw new Error(`batch results: ${page.status} ${page.text.slice(0, 200)}`);
    if (page.text) fs.appendFileSync(linesFile, page.text);
    after = Number(page.headers['x-next-after'] ?? after);
    status = String(page.headers['x-batch-status'] ?? status);
    if (after >= N_BATCH - 1 || status === 'cancelled') break;
    if (Date.now() > deadline) break;
    await sleep(1000);
  }
  // The last lines can be readable a moment before the batch records its own end.
  let counts: unknown = null;
  while (Date.now() < deadline) {
    const g = await call('GET', `/v1/agents/${agentId}/batches/${id}`);
    if (g.status !== 200) throw new Error(`get batch: ${g.status} ${g.text.slice(0, 200)}`);
    ({ status, counts } = g.json as { status: string; counts: unknown });
    if (status !== 'running') break;
    await sleep(1000);
  }
  const seen = new Map<number, number>();
  const wrong: BatchOutcome['wrong'] = [];
  const text = fs.readFileSync(linesFile, 'utf8');
  const lines = text.split('\n').filter(Boolean);
  for (const l of lines) {
    const line = JSON.parse(l) as { index: number; status: string; data: any; error?: { reason: string | null; exit_code: number | null }; attempts: number };
    seen.set(line.index, (seen.get(line.index) ?? 0) + 1);
    const task = tasks[line.index];
    if (!task) {
      wrong.push({ index: line.index, why: 'no such item' });
      continue;
    }
    const why = judge(task, { status: line.status, data: line.data, reason: line.error?.reason ?? null, exit_code: line.error?.exit_code ?? (line.status === 'completed' ? 0 : null) });
    const attempts = task.kind === 'fail' ? 2 : 1;
    if (why) wrong.push({ index: line.index, why });
    else if (line.attempts !== attempts) wrong.push({ index: line.index, why: `attempts ${line.attempts}, expected ${attempts}` });
  }
  return {
    id,
    tasks,
    status,
    counts,
    linesFile,
    lines: lines.length,
    missing: tasks.map((_, i) => i).filter((i) => !seen.has(i)),
    duplicateLines: [...seen].filter(([, n]) => n > 1).map(([i]) => i),
    wrong,
    expectedAttempts: tasks.map((t) => (t.kind === 'fail' ? 2 : 1)),
  };
}

// ---------------------------------------------------------------------------------------------
// The kills.

function alive(pid: number | undefined): boolean {
  if (!pid) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function httpOk(url: string, headers: Record<string, string> = {}): Promise<boolean> {
  try {
    const a = await once('GET', url, undefined, headers, 3000);
    return a.status === 200;
  } catch {
    return false;
  }
}

let temporalConnection: import('@temporalio/client').Connection | null = null;

/** True when a worker with this pid has polled the shared task queue since `sinceMs` (Temporal's DescribeTaskQueue). */
async function workerPolls(pid: number, sinceMs: number): Promise<boolean> {
  const { Connection } = await import('@temporalio/client');
  try {
    temporalConnection ??= await Connection.connect({ address: TEMPORAL_ADDRESS, connectTimeout: 2000 });
    const r = await temporalConnection.withDeadline(Date.now() + 3000, () =>
      temporalConnection!.workflowService.describeTaskQueue({ namespace: process.env.TEMPORAL_NAMESPACE ?? 'default', taskQueue: { name: TASK_QUEUE, kind: 1 }, taskQueueType: 1 }),
    );
    return (r.pollers ?? []).some((p) => {
      const seen = p.lastAccessTime?.seconds ? Number(p.lastAccessTime.seconds) * 1000 + Math.floor((p.lastAccessTime.nanos ?? 0) / 1e6) : 0;
      return p.identity?.startsWith(`${pid}@`) && seen >= sinceMs;
    });
  } catch {
    await temporalConnection?.close().catch(() => undefined);
    temporalConnection = null;
    return false;
  }
}

const tcpOpen = (url: string) =>
  new Promise<boolean>((resolve) => {
    const u = new URL(url);
    const s = net.connect(Number(u.port), u.hostname);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });

/**
 * True once the killed process has been replaced (a new pid in stack.json, alive) and the stack
 * answers again: the API's /readyz, plus the replaced process's own readiness (the host's
 * /healthz; a worker with the new pid polling the task queue; FerretDB's port).
 */
async function recovered(name: ProcName, oldPid: number, killedAt: number): Promise<boolean> {
  const st = readStack();
  const pid = st?.pids[name];
  if (!st || !pid || pid === oldPid || !alive(pid)) return false;
  if (!(await httpOk(`${API}/readyz`))) return false;
  switch (name) {
    case 'api':
      return true;
    case 'host':
      return httpOk(`${st.hostUrl}/healthz`);
    case 'mongo':
      return tcpOpen(st.mongoUrl.replace(/^mongodb/, 'http'));
    case 'worker':
      return workerPolls(pid, killedAt);
    case 'temporal':
      return workerPolls(st.pids.worker ?? 0, killedAt);
  }
}

interface KillRecord {
  name: ProcName;
  pid: number;
  at: string;
  recoveryMs: number | null;
}

/** The whole stack is up: every pid alive and the API ready. */
async function stackReady(): Promise<boolean> {
  const st = readStack();
  if (!st) return false;
  for (const n of ['temporal', 'mongo', 'host', 'worker', 'api'] as ProcName[]) if (!alive(st.pids[n])) return false;
  return httpOk(`${API}/readyz`);
}

/** Kills each process as often as KILL_PLAN says, in a random order at random moments, one at a time. */
async function killLoop(kills: KillRecord[], deadHostPids: number[]): Promise<void> {
  const order: ProcName[] = [];
  for (const [name, n] of Object.entries(KILL_PLAN) as [ProcName, number][]) for (let i = 0; i < n; i++) order.push(name);
  for (let i = order.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  const lastKill: Partial<Record<ProcName, number>> = {};
  await sleep(3000);
  while (order.length > 0) {
    // The next process that may be killed now; if none may yet, wait for the earliest.
    const now = Date.now();
    let pick = order.findIndex((n) => now - (lastKill[n] ?? 0) >= SAME_PROCESS_SPACING_MS);
    if (pick < 0) {
      await sleep(Math.min(...order.map((n) => SAME_PROCESS_SPACING_MS - (now - (lastKill[n] ?? 0)))));
      continue;
    }
    const name = order.splice(pick, 1)[0]!;
    await sleep(between(1000, 6000));
    const readyBy = Date.now() + RECOVERY_LIMIT_MS;
    while (!(await stackReady()) && Date.now() < readyBy) await sleep(200);
    const pid = readStack()?.pids[name];
    if (!pid || !alive(pid)) throw new Error(`no live ${name} process in ${STACK_FILE}`);
    const killedAt = Date.now();
    process.kill(pid, 'SIGKILL');
    if (name === 'host') deadHostPids.push(pid);
    lastKill[name] = killedAt;
    const rec: KillRecord = { name, pid, at: new Date(killedAt).toISOString(), recoveryMs: null };
    kills.push(rec);
    while (Date.now() - killedAt < RECOVERY_LIMIT_MS) {
      if (await recovered(name, pid, killedAt)) {
        rec.recoveryMs = Date.now() - killedAt;
        break;
      }
      await sleep(100);
    }
    process.stderr.write(`chaos: killed ${name} (pid ${pid}); ${rec.recoveryMs === null ? 'NOT recovered' : `back in ${rec.recoveryMs} ms`}\n`);
  }
}

// ---------------------------------------------------------------------------------------------
// The checks after the run.

/** Entrypoint runs per session id, from the sandbox host's audit log: distinct runs its helpers claimed (see countRuns). */
function runsPerSession(): Map<string, number> {
  const file = process.env.SANDBOX_AUDIT_LOG ?? defaultAuditLogPath(DATA_DIR);
  return countRuns(fs.readFileSync(file, 'utf8'));
}

interface Leftovers {
  hostList: string[];
  cgroups: string[];
  mounts: string[];
  dirs: string[];
  scratch: string[];
}

/** What is left of the given sandboxes (and of killed hosts' spare inits) on this machine. */
async function leftovers(sandboxIds: Set<string>, deadHostPids: number[]): Promise<Leftovers> {
  const out: Leftovers = { hostList: [], cgroups: [], mounts: [], dirs: [], scratch: [] };
  const a = await once('GET', `${HOST_URL}/sandboxes`, undefined, { authorization: `Bearer ${hostToken()}` }, 10_000).catch(() => null);
  if (a?.status === 200) out.hostList = (a.json as { id: string }[]).map((s) => s.id).filter((id) => sandboxIds.has(id));
  else out.hostList = [`(host list unavailable: ${a?.status ?? 'no answer'})`];
  for (const c of ['memory', 'pids', 'cpu', 'freezer']) {
    const dir = path.join('/sys/fs/cgroup', c, 'sap');
    for (const name of fs.existsSync(dir) ? fs.readdirSync(dir) : []) {
      if (sandboxIds.has(name) || deadHostPids.some((p) => name.startsWith(`spare-${p}-`))) out.cgroups.push(`${c}/sap/${name}`);
    }
  }
  const scratch = process.env.SANDBOX_SCRATCH_DIR && process.env.SANDBOX_SCRATCH_DIR !== 'off' ? path.resolve(process.env.SANDBOX_SCRATCH_DIR) : defaultScratchDir(DATA_DIR);
  for (const l of fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    if (l.includes(path.join(DATA_DIR, 'sandboxes')) || l.includes(scratch)) out.mounts.push(l);
  }
  const sbDir = path.join(DATA_DIR, 'sandboxes');
  for (const name of fs.existsSync(sbDir) ? fs.readdirSync(sbDir) : []) if (sandboxIds.has(name)) out.dirs.push(name);
  for (const name of fs.existsSync(scratch) ? fs.readdirSync(scratch) : []) if (sandboxIds.has(name)) out.scratch.push(name);
  return out;
}

const leftoverCount = (l: Leftovers) => l.hostList.length + l.cgroups.length + l.mounts.length + l.dirs.length + l.scratch.length;

function summary(xs: number[]): { n: number; median_ms: number | null; max_ms: number | null; all_ms: number[] } {
  const s = [...xs].sort((a, b) => a - b);
  return { n: s.length, median_ms: s.length ? s[Math.floor((s.length - 1) / 2)]! : null, max_ms: s.length ? s[s.length - 1]! : null, all_ms: xs };
}

async function main(): Promise<void> {
  const killing = Object.values(KILL_PLAN).some((n) => n > 0);
  if (killing && !initialStack) throw new Error(`${STACK_FILE} not found: run against npm start (with its supervisor), or pass --kills none`);
  const t0 = Date.now();
  const runId = `${Date.now().toString(36)}${SEED.toString(36)}`;
  const work = `chaos-${runId}`;
  const slow = `chaos-${runId}-slow`;
  for (const [id, timeoutSeconds] of [[work, 60], [slow, SHORT_TIMEOUT_S]] as const) {
    const a = await call('POST', '/v1/agents', { id, core: 'bash', entrypoint: ['bash', '-c', AGENT_SCRIPT], timeoutSeconds });
    if (a.status !== 201 && a.status !== 409) throw new Error(`create agent ${id}: ${a.status} ${a.text}`);
  }

  const kills: KillRecord[] = [];
  const deadHostPids: number[] = [];
  let killsDone = !killing;
  const killer = killing
    ? killLoop(kills, deadHostPids).finally(() => {
        killsDone = true;
      })
    : Promise.resolve();

  // At least N_SESSIONS sessions, and more while kills remain, CONCURRENCY at a time; the batch beside them.
  const sessions: SessionRecord[] = [];
  const batch = runBatch(work, runId);
  const mix: [Kind, number][] = [['quick', 0.4], ['sleep', 0.3], ['fail', 0.2], ['timeout', 0.1]];
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (sessions.length < N_SESSIONS || !killsDone) {
        const n = sessions.length;
        const task = makeTask(n, `s-${runId}`, mix);
        const rec: SessionRecord = { n, task, agentId: task.kind === 'timeout' ? slow : work };
        sessions.push(rec);
        await runSession(rec, runId).catch((err) => {
          rec.lost = `client gave up: ${(err as Error).message}`;
        });
      }
    }),
  );
  const [b] = await Promise.all([batch, killer]);
  const workloadS = (Date.now() - t0) / 1000;

  // Runs per session from the audit log: each session once; each batch item once per attempt it deserved.
  const runs = runsPerSession();
  const duplicates: { session: string; runs: number }[] = [];
  const neverRan: string[] = [];
  const expectRuns = (id: string, want: number) => {
    const got = runs.get(id) ?? 0;
    if (got > want) duplicates.push({ session: id, runs: got });
    if (got < want) neverRan.push(id);
  };
  for (const s of sessions) if (s.id) expectRuns(s.id, 1);
  const sandboxIds = new Set<string>(sessions.filter((s) => s.id).map((s) => sandboxIdForSession(s.id!)));
  for (let i = 0; i < N_BATCH; i++) {
    for (let a = 1; a <= 3; a++) {
      const id = batchSessionId(b.id, i, a);
      expectRuns(id, a <= b.expectedAttempts[i]! ? 1 : 0);
      sandboxIds.add(sandboxIdForSession(id));
    }
  }

  // Sandboxes are destroyed just after a session's ending is recorded, and the worker's reaper
  // sweeps what a crash left: wait (bounded) for the count to reach zero.
  let left = await leftovers(sandboxIds, deadHostPids);
  const leftDeadline = Date.now() + 120_000;
  while (leftoverCount(left) > 0 && Date.now() < leftDeadline) {
    await sleep(2000);
    left = await leftovers(sandboxIds, deadHostPids);
  }
  await temporalConnection?.close().catch(() => undefined);

  const byKind: Record<string, number> = {};
  for (const s of sessions) byKind[s.task.kind] = (byKind[s.task.kind] ?? 0) + 1;
  const lost = sessions.filter((s) => s.lost);
  const wrong = sessions.filter((s) => s.wrong);
  const recovery: Record<string, ReturnType<typeof summary>> = {};
  for (const name of Object.keys(KILL_PLAN) as ProcName[]) {
    const ks = kills.filter((k) => k.name === name);
    if (ks.length) recovery[name] = summary(ks.filter((k) => k.recoveryMs !== null).map((k) => k.recoveryMs!));
  }
  const notRecovered = kills.filter((k) => k.recoveryMs === null).length;
  const http500 = httpStats.serverErrors.filter((e) => e.status === 500).length;
  const batchLost = b.missing.length;
  const ok =
    lost.length === 0 &&
    wrong.length === 0 &&
    duplicates.length === 0 &&
    neverRan.length === 0 &&
    leftoverCount(left) === 0 &&
    httpStats.serverErrors.length === 0 &&
    httpStats.bad503Bodies === 0 &&
    b.lines === N_BATCH &&
    b.status === 'completed' &&
    batchLost === 0 &&
    b.duplicateLines.length === 0 &&
    b.wrong.length === 0 &&
    notRecovered === 0 &&
    kills.length === Object.values(KILL_PLAN).reduce((x, y) => x + y, 0);

  const out = {
    chaos: ok ? 'pass' : 'FAIL',
    cores: os.cpus().length,
    seed: SEED,
    seconds: Math.round(workloadS),
    concurrency: CONCURRENCY,
    sessions: { total: sessions.length, by_kind: byKind, lost: lost.length, wrong: wrong.length, samples: [...lost, ...wrong].slice(0, 10).map((s) => ({ n: s.n, kind: s.task.kind, id: s.id, lost: s.lost, wrong: s.wrong })) },
    batch: { id: b.id, items: N_BATCH, status: b.status, counts: b.counts, results_file: b.linesFile, lines: b.lines, missing: batchLost, duplicate_lines: b.duplicateLines.length, wrong: b.wrong.length, samples: b.wrong.slice(0, 10) },
    runs: { recorded: [...runs.values()].reduce((x, y) => x + y, 0), duplicates: duplicates.length, never_ran: neverRan.length, samples: [...duplicates.slice(0, 10), ...neverRan.slice(0, 10)] },
    kills: Object.fromEntries(Object.keys(KILL_PLAN).map((n) => [n, kills.filter((k) => k.name === n).length])),
    not_recovered: notRecovered,
    recovery,
    leftovers: { total: leftoverCount(left), host_list: left.hostList.length, cgroups: left.cgroups.length, mounts: left.mounts.length, dirs: left.dirs.length, scratch: left.scratch.length, samples: [...left.hostList, ...left.cgroups, ...left.dirs, ...left.scratch, ...left.mounts].slice(0, 10) },
    http: {
      requests: httpStats.requests,
      retries: httpStats.retries,
      connection_errors: httpStats.connectionErrors,
      by_status: httpStats.byStatus,
      http_500: http500,
      other_5xx: httpStats.serverErrors.length - http500,
      bad_503_bodies: httpStats.bad503Bodies,
      samples_5xx: httpStats.serverErrors.slice(0, 10),
    },
  };
  process.stdout.write(`${JSON.stringify(out)}\n`);
  agent.destroy();
  process.exit(ok ? 0 : 1);
}

main().catch((err) => {
  process.stderr.write(`chaos: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  process.exit(2);
});
