import { connectStore, SessionDoc } from '../../../store';
import { readSession } from '../../../store/sessions';
import { Client, Connection } from '@temporalio/client';
import { api, control, eventually, T, withMongo } from '../../helpers/env';
import { bashAgent, hostHasSandbox, sandboxOf } from '../../helpers/sessions';
import { hostClient } from '../../helpers/sandboxes';

const COPY = 'cat "$AGENT_INPUT_PATH" > /tmp/agent_result.json';

interface Line {
  index: number;
  session_id: string | null;
  status: string;
  data: Record<string, unknown> | null;
  error?: { reason: string | null; exit_code: number | null; message: string | null };
  attempts: number;
}

async function createBatch(agent: string, body: Record<string, unknown>, headers: Record<string, string> = {}) {
  const r = await api('POST', `/v1/agents/${agent}/batches`, { body, headers });
  if (r.status !== 201) throw new Error(`create batch: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body as { id: string; total: number; [k: string]: unknown };
}

async function waitForBatch(agent: string, id: string, statuses = ['completed', 'cancelled'], timeoutMs = 180_000) {
  return eventually(
    async () => {
      const r = await api('GET', `/v1/agents/${agent}/batches/${id}`);
      return statuses.includes(r.body.status) ? r.body : undefined;
    },
    timeoutMs,
    250,
  );
}

/** Reads one page of results: its lines and the headers. */
async function resultsPage(agent: string, id: string, after = -1, limit?: number) {
  const res = await fetch(`${T.api()}/v1/agents/${agent}/batches/${id}/results?after=${after}${limit ? `&limit=${limit}` : ''}`, {
    headers: { 'x-api-key': T.key() },
  });
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/application\/x-ndjson/);
  const text = await res.text();
  const lines = text
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Line);
  return { lines, nextAfter: Number(res.headers.get('x-next-after')), status: res.headers.get('x-batch-status') };
}

async function allResults(agent: string, id: string): Promise<Line[]> {
  const out: Line[] = [];
  let after = -1;
  for (;;) {
    const page = await resultsPage(agent, id, after);
    out.push(...page.lines);
    if (page.lines.length === 0) return out;
    after = page.nextAfter;
  }
}

/** The sessions' current state, read the way the API reads it (creation, progress and result records). */
async function sessionDocs(ids: string[]): Promise<SessionDoc[]> {
  const store = await connectStore(T.mongo(), { ensureIndexes: false });
  try {
    return (await Promise.all(ids.map((id) => readSession(store, id)))).filter((d): d is SessionDoc => d !== null);
  } finally {
    await store.close();
  }
}

/** The largest number of [started_at, completed_at] intervals that overlap at one instant. */
function maxOverlap(spans: { start: number; end: number }[]): number {
  const events = spans.flatMap((s) => [
    { t: s.start, d: 1 },
    { t: s.end, d: -1 },
  ]);
  events.sort((a, b) => a.t - b.t || a.d - b.d);
  let cur = 0;
  let max = 0;
  for (const e of events) {
    cur += e.d;
    max = Math.max(max, cur);
  }
  return max;
}

describe('batches: validation', () => {
  let agent: string;
  beforeAll(async () => {
    agent = await bashAgent(COPY);
  });

  it.each([
    ['empty items', { items: [] }, 'body.items'],
    ['no items', {}, 'body.items'],
    ['an item that is not an object', { items: [{ input: {} }, 5] }, 'body.items.1'],
    ['an input that is not an object', { items: [{ input: [1, 2] }] }, 'body.items.0.input'],
    ['concurrency 0', { items: [{}], concurrency: 0 }, 'body.concurrency'],
    ['huge concurrency', { items: [{}], concurrency: 100_000 }, 'body.concurrency'],
    ['maxAttempts 0', { items: [{}], maxAttempts: 0 }, 'body.maxAttempts'],
    ['an unknown field', { items: [{}], speed: 3 }, 'body'],
  ])('rejects %s with 400 naming the field', async (_what, body, field) => {
    const r = await api('POST', `/v1/agents/${agent}/batches`, { body });
    expect(r.status).toBe(400);
    expect(r.body.error.type).toBe('invalid_request');
    expect(r.body.error.message).toContain(field);
  });

  it('rejects an unknown agent (404), another org cannot see a batch, bad ids are 400', async () => {
    const r = await api('POST', '/v1/agents/no-such-agent-xyz/batches', { body: { items: [{}] } });
    expect(r.status).toBe(404);
    expect(r.body.error.type).toBe('not_found');
    expect((await api('GET', `/v1/agents/${agent}/batches/batch_doesnotexist`)).status).toBe(404);
    expect((await api('GET', `/v1/agents/${agent}/batches/NOT-A-BATCH`)).status).toBe(400);
    expect((await api('GET', `/v1/agents/${agent}/batches/batch_x`, { key: 'wrong-key' })).status).toBe(401);
  });

  it('rejects an NDJSON body with a line that is not JSON, naming the line', async () => {
    const r = await api('POST', `/v1/agents/${agent}/batches`, { raw: '{"input":{}}\nnot json\n', headers: { 'content-type': 'application/x-ndjson' } });
    expect(r.status).toBe(400);
    expect(r.body.error.message).toContain('line 2');
  });
});

describe('batches: running', () => {
  let copy: string;
  beforeAll(async () => {
    copy = await bashAgent(COPY);
  });

  it('runs a 200-item batch at concurrency 20: 200 results, never more than 20 sessions at once', async () => {
    const items = Array.from({ length: 200 }, (_, i) => ({ input: { i }, metadata: { n: String(i) } }));
    const t0 = Date.now();
    const b = await createBatch(copy, { items, concurrency: 20 });
    expect(b).toMatchObject({ agent_id: copy, status: 'running', total: 200, concurrency: 20, counts: { pending: 200, running: 0, completed: 0, failed: 0 } });
    expect(b.id).toMatch(/^batch_[a-z0-9]+$/);
    const done = await waitForBatch(copy, b.id);
    const seconds = (Date.now() - t0) / 1000;
    process.stdout.write(`200-item batch at concurrency 20: ${seconds.toFixed(1)} s (${(200 / seconds).toFixed(1)} items/s)\n`);
    expect(done).toMatchObject({ status: 'completed', counts: { pending: 0, running: 0, completed: 200, failed: 0 } });

    const lines = await allResults(copy, b.id);
    expect(lines.map((l) => l.index)).toEqual(items.map((_, i) => i));
    for (const l of lines) {
      expect(l).toMatchObject({ status: 'completed', attempts: 1, data: { i: l.index } });
      expect(l.session_id).toMatch(/^sess_[a-z0-9]+$/);
    }
    const docs = await sessionDocs(lines.map((l) => l.session_id!));
    expect(docs).toHaveLength(200);
    const spans = docs.map((d) => ({ start: d.started_at!.getTime(), end: d.completed_at!.getTime() }));
    const overlap = maxOverlap(spans);
    expect(overlap).toBeLessThanOrEqual(20);
    expect(overlap).toBeGreaterThan(1);

    // Each session is a session of the agent too, readable on its own.
    const one = await api('GET', `/v1/agents/${copy}/sessions/${lines[7]!.session_id}`);
    expect(one.body).toMatchObject({ status: 'completed', input: { i: 7 }, metadata: { n: '7' }, result: { i: 7 } });

    // Resuming by cursor: pages of 64 give exactly the full stream.
    const paged: Line[] = [];
    let after = -1;
    for (;;) {
      const page = await resultsPage(copy, b.id, after, 64);
      if (page.lines.length === 0) break;
      expect(page.lines.length).toBeLessThanOrEqual(64);
      expect(page.lines[0]!.index).toBe(after + 1);
      paged.push(...page.lines);
      after = page.nextAfter;
    }
    expect(paged).toEqual(lines);
    expect((await resultsPage(copy, b.id, 150)).lines.map((l) => l.index)).toEqual(Array.from({ length: 49 }, (_, k) => 151 + k));

    const list = await api('GET', `/v1/agents/${copy}/batches`);
    expect(list.status).toBe(200);
    expect(list.body.batches.map((x: { id: string }) => x.id)).toContain(b.id);
  }, 240_000);

  it('streams results in index order as items finish, stopping at the first unfinished item', async () => {
    // Item 0 waits until the test lets it go (a file in its sandbox); the others are quick: nothing
    // can be streamed until item 0 is done.
    const agent = await bashAgent(`if grep -q slow "$AGENT_INPUT_PATH"; then until [ -e /tmp/go ]; do sleep 0.1; done; fi; ${COPY}`);
    const b = await createBatch(agent, { items: [{ input: { slow: 1 } }, { input: { q: 1 } }, { input: { q: 2 } }], concurrency: 3 });
    await eventually(async () => (await api('GET', `/v1/agents/${agent}/batches/${b.id}`)).body.counts.completed >= 2, 60_000, 200);
    const early = await resultsPage(agent, b.id);
    expect(early.lines).toEqual([]);
    expect(early.nextAfter).toBe(-1);
    expect(early.status).toBe('running');
    // Item 0's session (its first attempt) runs in its sandbox: let it go.
    const slowSandbox = sandboxOf(`sess_${b.id.slice(6)}x0a1`);
    await eventually(() => hostHasSandbox(slowSandbox), 60_000, 100);
    await hostClient().writeFile(slowSandbox, '/tmp/go', '');
    await waitForBatch(agent, b.id);
    expect((await allResults(agent, b.id)).map((l) => l.index)).toEqual([0, 1, 2]);
  }, 120_000);

  it('re-runs a failing item up to maxAttempts, each attempt a new session; the outcome is the last attempt', async () => {
    // `flaky` fails on its first attempt only; `bad` always fails.
    const agent = await bashAgent(
      `if grep -q bad "$AGENT_INPUT_PATH"; then exit 3; fi; if grep -q flaky "$AGENT_INPUT_PATH"; then case "$SESSION_ID" in *a1) exit 4;; esac; fi; ${COPY}`,
    );
    const b = await createBatch(agent, { items: [{ input: { ok: 1 } }, { input: { flaky: 1 } }, { input: { bad: 1 } }], maxAttempts: 3, concurrency: 3 });
    const done = await waitForBatch(agent, b.id);
    expect(done).toMatchObject({ status: 'completed', max_attempts: 3, counts: { pending: 0, running: 0, completed: 2, failed: 1 } });
    const lines = await allResults(agent, b.id);
    expect(lines).toHaveLength(3);
    expect(lines[0]).toMatchObject({ index: 0, status: 'completed', attempts: 1, data: { ok: 1 } });
    expect(lines[1]).toMatchObject({ index: 1, status: 'completed', attempts: 2, data: { flaky: 1 } });
    expect(lines[1]!.session_id).toMatch(/a2$/);
    expect(lines[2]).toMatchObject({ index: 2, status: 'failed', attempts: 3, error: { reason: 'exit_code', exit_code: 3 } });
    expect(lines[2]!.session_id).toMatch(/a3$/);
    // Each attempt was its own session.
    const firstOfFlaky = await api('GET', `/v1/agents/${agent}/sessions/${lines[1]!.session_id!.replace(/a2$/, 'a1')}`);
    expect(firstOfFlaky.body).toMatchObject({ status: 'failed', outcome: { reason: 'exit_code', exit_code: 4 } });
  }, 120_000);

  it('accepts NDJSON items (concurrency in the query) and honours Idempotency-Key', async () => {
    const ndjson = '{"input":{"a":1}}\n\n{"input":{"a":2},"metadata":{"m":"x"}}\n';
    const key = `ndjson-${Date.now()}`;
    const headers = { 'content-type': 'application/x-ndjson', 'idempotency-key': key };
    const r1 = await api('POST', `/v1/agents/${copy}/batches?concurrency=2`, { raw: ndjson, headers });
    expect(r1.status).toBe(201);
    expect(r1.body).toMatchObject({ total: 2, concurrency: 2, max_attempts: 1 });
    const r2 = await api('POST', `/v1/agents/${copy}/batches?concurrency=2`, { raw: ndjson, headers });
    expect(r2.status).toBe(200);
    expect(r2.body.id).toBe(r1.body.id);
    const other = await api('POST', `/v1/agents/${copy}/batches`, { raw: '{"input":{"a":3}}\n', headers });
    expect(other.status).toBe(409);
    await waitForBatch(copy, r1.body.id);
    expect((await allResults(copy, r1.body.id)).map((l) => l.data)).toEqual([{ a: 1 }, { a: 2 }]);
  }, 120_000);

  it('cancels mid-batch: nothing new starts, running sessions end, no sandbox is left, status cancelled', async () => {
    const agent = await bashAgent(`sleep 3; ${COPY}`);
    const b = await createBatch(agent, { items: Array.from({ length: 30 }, (_, i) => ({ input: { i } })), concurrency: 3 });
    await eventually(async () => (await api('GET', `/v1/agents/${agent}/batches/${b.id}`)).body.counts.running >= 1, 60_000, 200);
    const del = await api('DELETE', `/v1/agents/${agent}/batches/${b.id}`);
    expect(del.status).toBe(200);
    expect(del.body.status).toBe('cancelled');
    const cancelledAt = Date.now();
    const done = await waitForBatch(agent, b.id, ['cancelled']);
    await eventually(async () => {
      const r = await api('GET', `/v1/agents/${agent}/batches/${b.id}`);
      return r.body.counts.running === 0 ? r.body : undefined;
    }, 30_000);
    const lines = await allResults(agent, b.id);
    expect(lines.map((l) => l.index)).toEqual(Array.from({ length: 30 }, (_, i) => i));
    const ran = lines.filter((l) => l.session_id !== null);
    expect(ran.length).toBeGreaterThan(0);
    expect(ran.length).toBeLessThan(30);
    expect(lines.filter((l) => l.session_id === null).every((l) => l.status === 'cancelled')).toBe(true);
    expect(lines.some((l) => l.status === 'failed' && l.error?.reason === 'cancelled')).toBe(true);
    const docs = await sessionDocs(ran.map((l) => l.session_id!));
    expect(docs.every((d) => d.status === 'completed' || d.status === 'failed')).toBe(true);
    // No session started after the cancel answered, and none was left prepared but never run.
    expect(docs.every((d) => d.started_at === null || d.started_at.getTime() <= cancelledAt)).toBe(true);
    const prepared = await withMongo((c) =>
      c
        .db()
        .collection('sessions')
        .countDocuments({ _id: { $regex: `^sess_${b.id.slice(6)}x` } } as never),
    );
    expect(prepared).toBe(ran.length);
    for (const l of ran) expect(await hostHasSandbox(sandboxOf(l.session_id!))).toBe(false);
    expect(done.status).toBe('cancelled');
  }, 120_000);
});

describe('batches: durability', () => {
  it('survives its worker being killed with SIGKILL: every item finishes once, none twice, no orphan sandbox', async () => {
    const agent = await bashAgent(`sleep 3; ${COPY}`);
    const n = 16;
    const b = await createBatch(agent, { items: Array.from({ length: n }, (_, i) => ({ input: { i } })), concurrency: 4 });
    await eventually(async () => (await api('GET', `/v1/agents/${agent}/batches/${b.id}`)).body.counts.completed >= 3, 60_000, 200);
    // Kill in the middle of the agents' sleep: a kill during provisioning would cost the
    // provisioning activity's 2-minute start-to-close timeout before its retry. So: once every
    // session the batch has started runs its entrypoint (none is still provisioning).
    await eventually(
      async () => {
        const running = (await api('GET', `/v1/agents/${agent}/batches/${b.id}`)).body.counts.running as number;
        const ids = await withMongo((c) =>
          c
            .db()
            .collection('sessions')
            .find({ _id: { $regex: `^sess_${b.id.slice(6)}x` } } as never, { projection: { _id: 1 } })
            .map((d) => String(d._id))
            .toArray(),
        );
        const entrypointsRunning = (await sessionDocs(ids)).filter((d) => d.status === 'running').length;
        return running >= 1 && entrypointsRunning === running;
      },
      60_000,
      100,
    );
    // kill resolves once the worker has exited.
    await control('kill', 'worker', 'SIGKILL');
    // While every worker is down, the batch and its counts are readable.
    const during = await api('GET', `/v1/agents/${agent}/batches/${b.id}`);
    expect(during.status).toBe(200);
    expect(during.body.status).toBe('running');
    expect(during.body.counts.completed).toBeGreaterThanOrEqual(3);
    await control('start', 'worker');
    const done = await waitForBatch(agent, b.id, ['completed'], 240_000);
    expect(done.counts).toEqual({ pending: 0, running: 0, completed: n, failed: 0 });
    const lines = await allResults(agent, b.id);
    expect(lines.map((l) => [l.index, l.status, l.attempts, (l.data as { i: number }).i])).toEqual(Array.from({ length: n }, (_, i) => [i, 'completed', 1, i]));

    // Exactly one session workflow per item, linked to the batch by its BatchId search attribute.
    const connection = await Connection.connect({ address: T.temporal() });
    try {
      const client = new Client({ connection });
      const ids: string[] = [];
      await eventually(
        async () => {
          ids.length = 0;
          for await (const wf of client.workflow.list({ query: `BatchId = "${b.id}" AND WorkflowType = "sessionWorkflow"` })) ids.push(wf.workflowId);
          return ids.length === n;
        },
        30_000,
        500,
      );
      expect(new Set(ids).size).toBe(n);
      expect(ids.sort()).toEqual(lines.map((l) => l.session_id!).sort());
      const parent = await client.workflow.getHandle(lines[0]!.session_id!).describe();
      expect(parent.parentExecution?.workflowId).toBe(b.id);
    } finally {
      await connection.close();
    }
    const count = await withMongo((c) =>
      c
        .db()
        .collection('sessions')
        .countDocuments({ _id: { $regex: `^sess_${b.id.slice(6)}x` } } as never),
    );
    expect(count).toBe(n);
    for (const l of lines) expect(await hostHasSandbox(sandboxOf(l.session_id!))).toBe(false);
  }, 300_000);
});
