import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import { parseArgs } from 'node:util';
import { benchPreview } from './bench-preview';
import { benchExec } from './bench-exec';
import { benchSpawn, parseSpawnParts } from './bench-spawn';
import { benchEgress } from './bench-egress';
import { benchSeal } from './bench-seal';
import { benchLayers } from './bench-hosts';
import { benchMetrics } from './bench-metrics';
import { benchConsole } from './bench-console';
import { cpuPerSession, findStackRoot, stackCpuMs } from './bench-cpu';

/** The benches, by the name given as the first argument. */
export const BENCH_PARTS = [
  'sessions',
  'batch',
  'preview',
  'exec',
  'spawn',
  'layers',
  'metrics',
  'console',
  'egress',
  'seal',
  'host-create',
  'conversations',
] as const;
export type BenchPart = (typeof BENCH_PARTS)[number];

/** Every option the benches take (parseArgs' form); `--help` prints USAGE. */
export const BENCH_OPTIONS = {
  n: { type: 'string' },
  c: { type: 'string' },
  mb: { type: 'string' },
  rounds: { type: 'string' },
  runs: { type: 'string' },
  burst: { type: 'string' },
  only: { type: 'string' },
  base: { type: 'string' },
  url: { type: 'string' },
  key: { type: 'string' },
  'stack-pid': { type: 'string' },
  cpu: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const;

export const USAGE = [
  'usage: npm run bench -- <bench> [options]   (against a running stack: npm start; prints one JSON line of measurements)',
  '',
  '  sessions [--n 200] [--c 10] [--cpu [--stack-pid PID]]  N trivial sessions at concurrency C (--cpu: CPU per session of each stack process)',
  '  batch [--n 1000] [--c 50] [--rounds 2]  one batch of N items against the same N sessions one by one (TEMPORAL_ADDRESS)',
  '  spawn [--n 50] [--burst 100] [--only create,node,burst,exec-burst,checkpoint,cpu] [--stack-pid PID]',
  '  layers [--n 10] [--mb 1,100]  (a stack with SANDBOX_HOSTS=2; DATA_DIR names it)',
  '  egress [--mb 1024] [--runs 3]  (as root: a test host in a network namespace of its own)',
  '  seal [--n 2000] [--mb 512] [--runs 3] [--only proxy,create] [--base CHECKOUT]  (as root: the sealed-secrets proxy vs direct',
  '       (and vs another checkout); create with a sealed store)',
  '  exec [--n 100] [--mb 512] [--runs 3]',
  '  console [--runs 5] [--n 10000] [--only list]  (assets, first renders, a list of n sessions: first and middle page, keystroke echo; MONGO_URL)',
  '  metrics [--n 200]  (GET …/metrics and POST …/scale of one sandbox)',
  '  preview [--n 2000] [--c 10]  (SAP_HOST_URL, SAP_HOST_TOKEN: add the forwarder-only leg)',
  '  conversations [--n 10]  message → first event (warm, hibernated), fork → first event, best-of-5, bytes per turn checkpoint',
  '  host-create [--n 15]  sandbox creates straight on the sandbox host, and after its restart (scripts/bench-host-create.ts)',
  '',
  'Every bench:',
  '  --url URL   the API (default: SAP_API_URL, else http://127.0.0.1:8080)',
  '  --key KEY   the API key (default: SAP_API_KEY, else dev-key)',
  '  --help, -h  this text',
  '',
].join('\n');

export type BenchValues = ReturnType<typeof parseArgs<{ options: typeof BENCH_OPTIONS; allowPositionals: true }>>['values'];

/**
 * The command line: the bench to run and its options, or the usage to print (exit status 2) for
 * --help, an unknown option, an option without its value, a missing or unknown bench.
 */
export function parseBenchArgs(argv: string[]): { name: BenchPart; values: BenchValues } | { usage: string } {
  let parsed: { positionals: string[]; values: BenchValues };
  try {
    parsed = parseArgs({ args: argv, allowPositionals: true, strict: true, options: BENCH_OPTIONS });
  } catch (err) {
    return { usage: `bench: ${err instanceof Error ? err.message : String(err)}\n\n${USAGE}` };
  }
  if (parsed.values.help) return { usage: USAGE };
  const name = parsed.positionals[0];
  if (name === undefined) return { usage: `bench: name a bench\n\n${USAGE}` };
  if (!(BENCH_PARTS as readonly string[]).includes(name)) return { usage: `bench: no bench named ${JSON.stringify(name)}\n\n${USAGE}` };
  if (parsed.positionals.length > 1) return { usage: `bench: one bench at a time (got ${parsed.positionals.join(' ')})\n\n${USAGE}` };
  return { name: name as BenchPart, values: parsed.values };
}

let values: BenchValues = {};
let URL_ = 'http://127.0.0.1:8080';
let KEY = 'dev-key';
let agent: http.Agent = new http.Agent({ keepAlive: true });

/**
 * One JSON request over node:http with kept-alive connections. The bench shares the machine's
 * cores with the stack it measures, so its client is the lightest one at hand (fetch costs about
 * twice the CPU per request).
 */
function call<T = any>(method: string, path: string, body?: unknown): Promise<{ status: number; body: T }> {
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  const headers: Record<string, string | number> = { 'x-api-key': KEY };
  if (payload) Object.assign(headers, { 'content-type': 'application/json', 'content-length': payload.length });
  return new Promise((resolve, reject) => {
    const req = (URL_.startsWith('https:') ? https : http).request(`${URL_}${path}`, { method, headers, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => {
        try {
          resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString('utf8')) as T });
        } catch (err) {
          reject(err);
        }
      });
    });
    req.on('error', reject);
    req.end(payload);
  });
}

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return Math.round(sorted[i]! * 10) / 10;
}

const stats = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return { p50: percentile(s, 50), p95: percentile(s, 95), p99: percentile(s, 99) };
};

/** N trivial sessions (the agent copies its input to its result) at concurrency C. */
async function benchSessions(n: number, c: number): Promise<Record<string, unknown>> {
  const agentId = `bench-copy-${Date.now().toString(36)}`;
  const a = await call('POST', '/v1/agents', { id: agentId, core: 'bash', entrypoint: ['bash', '-c', 'cp "$AGENT_INPUT_PATH" /tmp/agent_result.json'] });
  if (a.status !== 201) throw new Error(`create agent: ${JSON.stringify(a.body)}`);
  const create: number[] = [];
  const e2e: number[] = [];
  let failed = 0;
  let lost = 0;
  let next = 0;
  const t0 = Date.now();
  let lastEnd = t0;
  /** When each session ended (its updated_at), for the throughput of each block of BLOCK sessions. */
  const ends: number[] = [];
  async function one(i: number): Promise<void> {
    const start = performance.now();
    const r = await call('POST', `/v1/agents/${agentId}/sessions`, { input: { i } });
    create.push(performance.now() - start);
    if (r.status !== 201) {
      failed++;
      return;
    }
    const id = r.body.id as string;
    const deadline = Date.now() + 120_000;
    for (;;) {
      // One long poll (?wait) per session instead of repeated polling: what a client that waits should do.
      const s = await call('GET', `/v1/agents/${agentId}/sessions/${id}?wait=30`);
      if (s.body.status === 'completed' || s.body.status === 'failed') {
        const ended = Date.parse(s.body.updated_at);
        e2e.push(ended - Date.parse(s.body.created_at));
        lastEnd = Math.max(lastEnd, ended);
        ends.push(ended);
        if (ends.length % BLOCK === 0) process.stderr.write(`bench: ${ends.length} sessions ended, ${Math.round((Date.now() - t0) / 1000)} s\n`);
        if (s.body.status === 'failed' || s.body.result?.i !== i) failed++;
        return;
      }
      if (Date.now() > deadline) {
        lost++;
        return;
      }
    }
  }
  await Promise.all(
    Array.from({ length: c }, async () => {
      while (next < n) await one(next++);
    }),
  );
  const seconds = (lastEnd - t0) / 1000;
  // Sessions/s of each block of BLOCK endings, in the order they ended: does throughput hold over a long run?
  const sorted = [...ends].sort((x, y) => x - y);
  const blocks: number[] = [];
  for (let k = BLOCK; k <= sorted.length; k += BLOCK) {
    const from = k === BLOCK ? t0 : sorted[k - BLOCK - 1]!;
    blocks.push(Math.round((BLOCK / ((sorted[k - 1]! - from) / 1000)) * 10) / 10);
  }
  return {
    bench: 'sessions',
    n,
    concurrency: c,
    cores: os.cpus().length,
    create_ms: stats(create),
    end_to_end_ms: stats(e2e),
    sessions_per_s: Math.round((n / seconds) * 10) / 10,
    ...(blocks.length > 1 ? { per_block_of_1000_per_s: blocks, last_block_vs_first: Math.round((blocks[blocks.length - 1]! / blocks[0]!) * 100) / 100 } : {}),
    lost,
    failed,
  };
}

/** Block size of the per-block throughput of the sessions bench. */
const BLOCK = 1000;

/**
 * N trivial items as one batch at concurrency C, against the same N sessions started one by one
 * at concurrency C (benchSessions). Item latency is each child session workflow's start → close
 * (from Temporal visibility: TEMPORAL_ADDRESS), comparable to a plain session's create → end.
 */
async function benchBatch(n: number, c: number): Promise<Record<string, unknown> & { items_per_s: number }> {
  const { Client, Connection } = await import('@temporalio/client');
  const agentId = `bench-batch-${Date.now().toString(36)}`;
  const a = await call('POST', '/v1/agents', { id: agentId, core: 'bash', entrypoint: ['bash', '-c', 'cp "$AGENT_INPUT_PATH" /tmp/agent_result.json'] });
  if (a.status !== 201) throw new Error(`create agent: ${JSON.stringify(a.body)}`);
  const ndjson = Array.from({ length: n }, (_, i) => JSON.stringify({ input: { i } })).join('\n');
  const t0 = Date.now();
  const res = await fetch(`${URL_}/v1/agents/${agentId}/batches?concurrency=${c}`, {
    method: 'POST',
    headers: { 'x-api-key': KEY, 'content-type': 'application/x-ndjson' },
    body: ndjson,
  });
  const created = (await res.json()) as { id: string };
  if (res.status !== 201) throw new Error(`create batch: ${JSON.stringify(created)}`);
  const createMs = Date.now() - t0;
  let b: any;
  for (;;) {
    await new Promise((r) => setTimeout(r, 250));
    b = (await call('GET', `/v1/agents/${agentId}/batches/${created.id}`)).body;
    if (b.status !== 'running') break;
  }
  const seconds = (Date.parse(b.completed_at) - t0) / 1000;
  let wrong = 0;
  let after = -1;
  for (;;) {
    const r = await fetch(`${URL_}/v1/agents/${agentId}/batches/${created.id}/results?after=${after}&limit=10000`, { headers: { 'x-api-key': KEY } });
    const lines = (await r.text())
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as { index: number; status: string; data: { i?: number } | null });
    if (lines.length === 0) break;
    for (const l of lines) if (l.status !== 'completed' || l.data?.i !== l.index) wrong++;
    after = Number(r.headers.get('x-next-after'));
  }
  const connection = await Connection.connect({ address: process.env.TEMPORAL_ADDRESS ?? '127.0.0.1:7233' });
  const item: number[] = [];
  try {
    const client = new Client({ connection, namespace: process.env.TEMPORAL_NAMESPACE ?? 'default' });
    for await (const wf of client.workflow.list({ query: `BatchId = "${created.id}" AND WorkflowType = "sessionWorkflow"` })) {
      if (wf.closeTime) item.push(wf.closeTime.getTime() - wf.startTime.getTime());
    }
  } finally {
    await connection.close();
  }
  return {
    n,
    concurrency: c,
    create_ms: createMs,
    items_per_s: Math.round((n / seconds) * 10) / 10,
    item_ms: stats(item),
    counts: b.counts,
    wrong_results: wrong,
  };
}

/**
 * The batch against the same sessions started one by one, `rounds` times, alternating which goes
 * first (a shared machine's load drifts): the ratio of each pair's throughputs, and their median.
 */
async function benchBatchVsSessions(n: number, c: number, rounds: number): Promise<Record<string, unknown>> {
  const pairs: { batch: Record<string, unknown>; sessions: Record<string, unknown>; ratio: number }[] = [];
  for (let r = 0; r < rounds; r++) {
    let batch: Record<string, unknown>;
    let plain: Record<string, unknown>;
    if (r % 2 === 0) {
      batch = await benchBatch(n, c);
      plain = await benchSessions(n, c);
    } else {
      plain = await benchSessions(n, c);
      batch = await benchBatch(n, c);
    }
    pairs.push({ batch, sessions: plain, ratio: Math.round(((batch.items_per_s as number) / (plain.sessions_per_s as number)) * 100) / 100 });
  }
  const ratios = pairs.map((p) => p.ratio).sort((a, b) => a - b);
  return {
    bench: 'batch',
    cores: os.cpus().length,
    rounds: pairs,
    throughput_vs_sessions: ratios[Math.floor((ratios.length - 1) / 2)],
  };
}

async function main(): Promise<void> {
  const cli = parseBenchArgs(process.argv.slice(2));
  if ('usage' in cli) {
    process.stderr.write(cli.usage);
    process.exit(2);
  }
  const name = cli.name;
  values = cli.values;
  URL_ = values.url ?? process.env.SAP_API_URL ?? URL_;
  KEY = values.key ?? process.env.SAP_API_KEY ?? KEY;
  agent = new (URL_.startsWith('https:') ? https : http).Agent({ keepAlive: true });
  const n = Number(values.n ?? 200);
  const c = Number(values.c ?? 10);
  let out: Record<string, unknown>;
  switch (name) {
    case 'sessions':
      {
        // --cpu: CPU per session of each process of the stack (by name, from /proc; see bench-cpu.ts).
        const root = values.cpu ? findStackRoot(URL_, values['stack-pid'] ? Number(values['stack-pid']) : undefined) : 0;
        const before = root ? stackCpuMs(root) : null;
        out = await benchSessions(n, c);
        if (before) out.cpu_ms_per_session = cpuPerSession(before, stackCpuMs(root), n);
      }
      break;
    case 'batch':
      out = await benchBatchVsSessions(Number(values.n ?? 1000), Number(values.c ?? 50), Number(values.rounds ?? 2));
      break;
    case 'preview':
      out = await benchPreview(URL_, KEY, Number(values.n ?? 2000), c);
      break;
    case 'exec':
      out = await benchExec({ url: URL_, key: KEY, n: Number(values.n ?? 100), mb: Number(values.mb ?? 512), runs: Number(values.runs ?? 3) });
      break;
    case 'spawn':
      out = await benchSpawn({
        n: Number(values.n ?? 50),
        burst: Number(values.burst ?? 100),
        parts: parseSpawnParts(values.only),
        call,
        apiUrl: URL_,
        ...(values['stack-pid'] ? { stackPid: Number(values['stack-pid']) } : {}),
      });
      break;
    case 'layers':
      out = await benchLayers({ n: Number(values.n ?? 10), sizesMB: (values.mb ?? '1,100').split(',').map(Number) });
      break;
    case 'metrics':
      out = await benchMetrics({ n: Number(values.n ?? 200), call });
      break;
    case 'console':
      out = await benchConsole({ url: URL_, key: KEY, runs: Number(values.runs ?? 5), n: Number(values.n ?? 10_000), call, only: values.only });
      break;
    case 'egress':
      out = await benchEgress({ mb: Number(values.mb ?? 1024), runs: Number(values.runs ?? 3), call });
      break;
    case 'seal':
      out = await benchSeal({
        n: Number(values.n ?? 2000),
        mb: Number(values.mb ?? 512),
        runs: Number(values.runs ?? 3),
        call,
        only: values.only,
        base: values.base,
      });
      break;
    case 'host-create': // scripts/bench-host-create.ts
      out = await (await import('./bench-host-create')).benchHostCreate({ n: Number(values.n ?? 15) });
      break;
    case 'conversations': // scripts/bench-conversations.ts
      out = await (await import('./bench-conversations')).benchConversations({ n: Number(values.n ?? 10), call });
      break;
    default: {
      const unknown: never = name;
      throw new Error(`no bench named ${String(unknown)}`);
    }
  }
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

if (require.main === module) {
  main().catch((err) => {
    process.stderr.write(`bench: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  });
}
