/** `npm run chaos`'s workload: the tasks its sessions and batch run, and how each must end. */
import fs from 'node:fs';
import path from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { N_BATCH, CONCURRENCY, OUT_DIR, SESSION_DEADLINE_MS, rand, between, sleep } from './config';
import { call } from './client';

// ---------------------------------------------------------------------------------------------
// The workload.

/** What a session's agent is asked to do, and so how it must end. */
export type Kind = 'quick' | 'sleep' | 'fail' | 'timeout';
export interface Task {
  kind: Kind;
  input: { n: number; mode: Kind; secs: number; code: number; tag: string };
}

/** The agent: sleeps `secs`, writes `{ echo: <input>, session }` as its result, exits `code`. */
export const AGENT_SCRIPT = [
  'in=$(<"$AGENT_INPUT_PATH")',
  'secs=0; [[ $in =~ \\"secs\\":([0-9]+) ]] && secs=${BASH_REMATCH[1]}',
  'code=0; [[ $in =~ \\"code\\":([0-9]+) ]] && code=${BASH_REMATCH[1]}',
  'if [ "$secs" -gt 0 ]; then sleep "$secs"; fi',
  'printf \'{"echo":%s,"session":"%s"}\' "$in" "$SESSION_ID" > /tmp/agent_result.json',
  'exit "$code"',
].join('\n');
/** The timeout agent's limit; its sessions sleep far longer. */
export const SHORT_TIMEOUT_S = 2;

export function makeTask(n: number, tag: string, kinds: [Kind, number][]): Task {
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
export function judge(task: Task, r: { status: string; data: any; reason: string | null; exit_code: number | null }): string | null {
  const echoed = isDeepStrictEqual(r.data?.echo, task.input);
  switch (task.kind) {
    case 'quick':
    case 'sleep':
      if (r.status !== 'completed') return `expected completed, got ${r.status} (${r.reason}: exit ${r.exit_code})`;
      return echoed ? null : `wrong result ${JSON.stringify(r.data).slice(0, 200)}`;
    case 'fail':
      if (r.status !== 'failed' || r.reason !== 'exit_code' || r.exit_code !== task.input.code)
        return `expected failed/exit_code ${task.input.code}, got ${r.status}/${r.reason} ${r.exit_code}`;
      return echoed ? null : `wrong result ${JSON.stringify(r.data).slice(0, 200)}`;
    case 'timeout':
      return r.status === 'failed' && r.reason === 'timeout' ? null : `expected failed/timeout, got ${r.status}/${r.reason} ${r.exit_code}`;
  }
}

export interface SessionRecord {
  n: number;
  task: Task;
  agentId: string;
  id?: string;
  wrong?: string;
  lost?: string;
}

export async function runSession(rec: SessionRecord, runId: string): Promise<void> {
  const created = await call(
    'POST',
    `/v1/agents/${rec.agentId}/sessions`,
    { input: rec.task.input },
    { headers: { 'idempotency-key': `chaos-${runId}-${rec.n}` } },
  );
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

export interface BatchOutcome {
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
export async function runBatch(agentId: string, runId: string): Promise<BatchOutcome> {
  const tasks = Array.from({ length: N_BATCH }, (_, i) =>
    makeTask(i, `b-${runId}`, [
      ['quick', 0.5],
      ['sleep', 0.3],
      ['fail', 0.2],
    ]),
  );
  const created = await call(
    'POST',
    `/v1/agents/${agentId}/batches`,
    { items: tasks.map((t) => ({ input: t.input })), concurrency: CONCURRENCY, maxAttempts: 2 },
    { headers: { 'idempotency-key': `chaos-${runId}-batch` } },
  );
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
    const why = judge(task, {
      status: line.status,
      data: line.data,
      reason: line.error?.reason ?? null,
      exit_code: line.error?.exit_code ?? (line.status === 'completed' ? 0 : null),
    });
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
