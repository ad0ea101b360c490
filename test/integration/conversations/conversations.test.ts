/**
 * Conversations against the real stack: a bash runner (test/fixtures/conversation-runner.sh)
 * stands in for a model. It speaks the runner's JSON-lines protocol, writes /workspace/turn-<n>.txt
 * and keeps its memory in /root/.claude (where the Claude Agent SDK keeps its conversation state).
 */
import { execFile } from 'node:child_process';
import { Client, Connection } from '@temporalio/client';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { api, control, eventually, T, unique } from '../../helpers/env';
import { otherOrgKey } from '../../helpers/checkpoints';

const CLI = path.join(__dirname, '..', '..', '..', 'dist', 'cli', 'main.js');

/** Runs the CLI as a real process; resolves with its exit code and output. */
function sap(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [CLI, ...args], { env: { ...process.env, SAP_API_URL: T.api(), SAP_API_KEY: T.key() } }, (err, stdout, stderr) =>
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
  });
}

const RUNNER = fs.readFileSync(path.join(__dirname, '..', '..', 'fixtures', 'conversation-runner.sh'), 'utf8');

type Turn = {
  turn: number;
  status: string;
  yieldReason: string | null;
  left: boolean;
  after: number;
  attempt: number;
  endSeq: number | null;
  evaluation: { exitCode: number; outputTail: string } | null;
};
type Ev = { seq: number; turn: number; type: string; level: string; superseded: boolean; data: any };

let agentId: string;
/** A value of the agent's env: never stored in an event, whatever the runner prints. */
const SECRET = `tok-${Date.now().toString(36)}-do-not-store`;
const opened: string[] = [];

beforeAll(async () => {
  agentId = unique('conv-agent');
  const r = await api('POST', '/v1/agents', {
    body: { id: agentId, core: 'bash', entrypoint: ['true'], files: { '/opt/runner.sh': RUNNER }, user: 'root', env: { LEAK_ME: SECRET } },
  });
  expect(r.status).toBe(201);
});

afterAll(async () => {
  for (const id of opened) await api('POST', `/v1/conversations/${id}/archive`).catch(() => undefined);
  await api('DELETE', `/v1/agents/${agentId}`).catch(() => undefined);
});

async function create(body: Record<string, unknown> = {}, headers: Record<string, string> = {}) {
  const r = await api('POST', `/v1/agents/${agentId}/conversations`, { body: { runner: ['bash', '/opt/runner.sh'], idleSeconds: 3600, ...body }, headers });
  if (r.status !== 201 && r.status !== 200) throw new Error(`create: ${r.status} ${JSON.stringify(r.body)}`);
  if (!opened.includes(r.body.id)) opened.push(r.body.id);
  return r;
}

const turns = async (id: string): Promise<Turn[]> => (await api('GET', `/v1/conversations/${id}/turns`)).body.turns;

/** Waits until turn `n` of `id` has its checkpoint (it has ended) and returns it. */
async function turnDone(id: string, n: number, timeoutMs = 60_000): Promise<Turn> {
  return eventually(
    async () => {
      const t = (await turns(id)).find((x) => x.turn === n);
      return t && t.status !== 'running' && (await api('GET', `/v1/conversations/${id}`)).body.headTurn >= n ? t : undefined;
    },
    timeoutMs,
    100,
  );
}

async function say(id: string, text: string, key?: string) {
  return api('POST', `/v1/conversations/${id}/messages`, { body: { text }, headers: key ? { 'idempotency-key': key } : {} });
}

async function events(id: string, after = 0, level = 'internal'): Promise<Ev[]> {
  const out: Ev[] = [];
  for (;;) {
    const r = await api('GET', `/v1/conversations/${id}/events?after=${after}&level=${level}&limit=500`);
    expect(r.status).toBe(200);
    out.push(...r.body.events);
    if (r.body.events.length < 500) return out;
    after = r.body.next;
  }
}

async function readFile(sandboxId: string, p: string): Promise<{ status: number; text: string }> {
  const res = await fetch(`${T.api()}/api/sandboxes/${sandboxId}/files?path=${encodeURIComponent(p)}`, { headers: { 'x-api-key': T.key() } });
  return { status: res.status, text: await res.text() };
}

/** Reads Server-Sent Events until `until` says stop (or the stream ends); closes the connection. */
function readSse(url: string, headers: Record<string, string>, until: (evs: { id: number; data: Ev }[]) => boolean): Promise<{ id: number; data: Ev }[]> {
  return new Promise((resolve, reject) => {
    const got: { id: number; data: Ev }[] = [];
    const req = http.get(url, { headers: { accept: 'text/event-stream', 'x-api-key': T.key(), ...headers } }, (res) => {
      let buf = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        buf += chunk;
        let i: number;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          const id = /^id: (\d+)$/m.exec(block);
          const data = /^data: (.*)$/m.exec(block);
          if (id && data) got.push({ id: Number(id[1]), data: JSON.parse(data[1]!) as Ev });
        }
        if (until(got)) {
          req.destroy();
          resolve(got);
        }
      });
      res.on('end', () => resolve(got));
      // The server went away mid-stream: what arrived is what the client saw.
      res.on('error', () => resolve(got));
      res.on('close', () => resolve(got));
    });
    req.on('error', (err) => (got.length ? resolve(got) : reject(err)));
  });
}

function expectContiguous(evs: { seq: number }[], from: number) {
  expect(evs.map((e) => e.seq)).toEqual(evs.map((_, i) => from + i));
}

describe('conversations', () => {
  test('create with a first input, messages as idempotent Updates, turns, result, events in order', async () => {
    const key = unique('conv-key');
    const first = await create({ input: 'one', metadata: { purpose: 'test' } }, { 'idempotency-key': key });
    expect(first.status).toBe(201);
    const again = await create({ input: 'one' }, { 'idempotency-key': key });
    expect(again.status).toBe(200);
    expect(again.body.id).toBe(first.body.id);
    const id: string = first.body.id;
    const t1 = await turnDone(id, 1);
    expect(t1).toMatchObject({ status: 'completed', yieldReason: 'completed', attempt: 1 });

    const mkey = unique('msg');
    const a = await say(id, 'two', mkey);
    const b = await say(id, 'two', mkey);
    expect(a.status).toBe(202);
    expect(b.body.turn).toBe(a.body.turn);
    expect(a.body.turn).toBe(2);
    await turnDone(id, 2);
    expect((await turns(id)).map((t) => t.turn)).toEqual([1, 2]);

    const result = await api('GET', `/v1/conversations/${id}/result`);
    expect(result.body).toMatchObject({ turn: 2, yieldReason: 'completed', result: 'done 2', usage: { inputTokens: 10, outputTokens: 5 } });
    const conv = await api('GET', `/v1/conversations/${id}`);
    expect(conv.body).toMatchObject({ status: 'idle', headTurn: 2, tokensUsed: 30, metadata: { purpose: 'test' } });

    const all = await events(id);
    expectContiguous(all, 1);
    expect(all.filter((e) => e.type === 'turn_complete').map((e) => e.turn)).toEqual([1, 2]);
    const assistant = all.filter((e) => e.type === 'assistant').map((e) => e.data.text);
    expect(assistant).toEqual(['I remember: one', 'I remember: one,two']);
    // Levels: `user` hides tool use and the runner's own chatter.
    const user = await events(id, 0, 'user');
    expect(user.some((e) => e.type === 'tool_use' || e.type === 'ready')).toBe(false);
    expect(user.some((e) => e.type === 'assistant')).toBe(true);
    // A page after a sequence number starts right after it.
    const later = await events(id, all[3]!.seq);
    expect(later[0]!.seq).toBe(all[3]!.seq + 1);
  });

  test('a secret the sandbox was given is never stored in an event, even when the runner prints it', async () => {
    const { body } = await create({ input: 'leak' });
    await turnDone(body.id, 1);
    const evs = await events(body.id);
    expect(JSON.stringify(evs)).not.toContain(SECRET);
    expect(evs.find((e) => e.type === 'assistant' && String(e.data.text).startsWith('the token is'))!.data.text).toBe('the token is [secret]');
  });

  test('bad input is refused before it is accepted: schema 400, the Update validator 409 at max_turns', async () => {
    const { body } = await create({ limits: { turns: 1 } });
    const id: string = body.id;
    expect((await say(id, '')).status).toBe(400);
    expect((await say(id, 'x'.repeat(64 * 1024 + 1))).status).toBe(400);
    expect((await say(id, 'only')).status).toBe(202);
    const refused = await say(id, 'one too many');
    expect(refused.status).toBe(409);
    expect(refused.body.error.message).toMatch(/max_turns/);
    await turnDone(id, 1);
    expect((await turns(id)).map((t) => t.turn)).toEqual([1]);
  });

  test('limits and cancel: turnSeconds ends a turn deadline_exceeded, tokens end one budget_exceeded and refuse the next, cancel drops the queue and interrupts', async () => {
    const slow = (await create({ input: 'sleep 30', limits: { turnSeconds: 1 } })).body.id as string;
    const budget = (await create({ input: 'one', limits: { tokens: 20 } })).body.id as string;
    expect((await turnDone(slow, 1)).yieldReason).toBe('deadline_exceeded');

    expect((await turnDone(budget, 1)).yieldReason).toBe('completed');
    expect((await say(budget, 'two')).status).toBe(202);
    expect((await turnDone(budget, 2)).yieldReason).toBe('budget_exceeded');
    const refused = await say(budget, 'three');
    expect(refused.status).toBe(409);
    expect(refused.body.error.message).toMatch(/budget_exceeded/);

    const busy = (await create({ input: 'sleep 60' })).body.id as string;
    expect((await say(busy, 'queued one')).status).toBe(202);
    await eventually(async () => (await turns(busy)).find((t) => t.turn === 1 && t.status === 'running'), 60_000);
    let dropped = 0;
    await eventually(async () => {
      const r = await api('POST', `/v1/conversations/${busy}/cancel`);
      dropped += r.body.dropped as number;
      return r.body.interrupted === 1;
    });
    expect(dropped).toBe(1);
    expect((await turnDone(busy, 1)).yieldReason).toBe('interrupted');
    expect((await turns(busy)).map((t) => t.turn)).toEqual([1]);
  });

  test('another organisation sees none of it', async () => {
    const { body } = await create({});
    const other = await otherOrgKey();
    for (const [m, p] of [
      ['GET', `/v1/conversations/${body.id}`],
      ['GET', `/v1/conversations/${body.id}/events`],
      ['POST', `/v1/conversations/${body.id}/messages`],
      ['POST', `/v1/conversations/${body.id}/fork`],
    ] as const) {
      const r = await api(m, p, { key: other, body: m === 'POST' ? (p.endsWith('fork') ? { turn: 0 } : { text: 'hi' }) : undefined });
      expect(r.status).toBe(404);
    }
  });

  test('SSE follows events; a client that reconnects with Last-Event-ID loses none and repeats none', async () => {
    const { body } = await create({ input: 'first' });
    const id: string = body.id;
    const url = `${T.api()}/v1/conversations/${id}/events?level=internal`;
    const part1 = await readSse(url, {}, (g) => g.some((e) => e.data.type === 'turn_complete' && e.data.turn === 1));
    const lastId = part1.at(-1)!.id;
    expect(await say(id, 'second')).toMatchObject({ status: 202 });
    const part2 = await readSse(url, { 'last-event-id': String(lastId) }, (g) => g.some((e) => e.data.type === 'turn_complete' && e.data.turn === 2));
    const seqs = [...part1, ...part2].map((e) => e.id);
    expectContiguous(
      seqs.map((seq) => ({ seq })),
      1,
    );
    expect(seqs).toEqual((await events(id)).map((e) => e.seq).slice(0, seqs.length));
  });

  test('fork at turn 2 of 4: the fork has turn 2’s files and memory while the original is at turn 4; events shared; linked both ways', async () => {
    const { body } = await create({ input: 'alpha' });
    const id: string = body.id;
    await turnDone(id, 1);
    for (const [n, text] of [
      [2, 'beta'],
      [3, 'gamma'],
      [4, 'delta'],
    ] as const) {
      expect((await say(id, text)).status).toBe(202);
      await turnDone(id, n);
    }
    const forked = await api('POST', `/v1/conversations/${id}/fork`, { body: { turn: 2 } });
    expect(forked.status).toBe(201);
    const fork = forked.body.forks[0];
    opened.push(fork.id);
    expect(fork.forkedFrom).toEqual({ conversationId: id, turn: 2 });
    const fid: string = fork.id;
    const ready = await eventually(async () => {
      const c = (await api('GET', `/v1/conversations/${fid}`)).body;
      return c.status === 'idle' && c.sandboxId ? c : undefined;
    }, 60_000);
    const orig = (await api('GET', `/v1/conversations/${id}`)).body;
    expect(orig.forks).toEqual([{ conversationId: fid, turn: 2 }]);
    // …and in Temporal: the fork's memo names its parent, the parent's lists its forks.
    const connection = await Connection.connect({ address: T.temporal() });
    try {
      const temporal = new Client({ connection });
      expect((await temporal.workflow.getHandle(fid).describe()).memo).toMatchObject({ forkedFrom: { conversationId: id, turn: 2 } });
      await eventually(async () => {
        const memo = (await temporal.workflow.getHandle(id).describe()).memo as { forks?: unknown } | undefined;
        return JSON.stringify(memo?.forks) === JSON.stringify([{ conversationId: fid, turn: 2 }]);
      });
    } finally {
      await connection.close();
    }

    // Files and the agent's memory at turn 2 in the fork, at turn 4 in the original.
    expect((await readFile(ready.sandboxId, '/root/.claude/memory.txt')).text).toBe('alpha\nbeta\n');
    expect((await readFile(ready.sandboxId, '/workspace/turn-2.txt')).status).toBe(200);
    expect((await readFile(ready.sandboxId, '/workspace/turn-3.txt')).status).toBe(404);
    expect((await readFile(orig.sandboxId, '/root/.claude/memory.txt')).text).toBe('alpha\nbeta\ngamma\ndelta\n');
    expect((await readFile(orig.sandboxId, '/workspace/turn-4.txt')).status).toBe(200);

    // The fork's log is the original's up to turn 2, by reference; its turns 1-2 are the original's.
    const origEvents = await events(id);
    const t2end = origEvents.filter((e) => e.turn <= 2).at(-1)!.seq;
    expect((await events(fid)).map((e) => e.seq)).toEqual(origEvents.filter((e) => e.seq <= t2end).map((e) => e.seq));
    expect((await turns(fid)).map((t) => t.turn)).toEqual([1, 2]);

    // Its next message continues from turn 2's memory; the original is untouched.
    expect((await say(fid, 'epsilon')).body.turn).toBe(3);
    await turnDone(fid, 3);
    const fe = await events(fid);
    expectContiguous(fe, 1);
    expect(fe.filter((e) => e.type === 'assistant').at(-1)!.data.text).toBe('I remember: alpha,beta,epsilon');
    expect((await readFile(orig.sandboxId, '/root/.claude/memory.txt')).text).toBe('alpha\nbeta\ngamma\ndelta\n');

    // Rewind the original to turn 1: later turns are kept, marked left; the sandbox is back at turn 1.
    const rw = await api('POST', `/v1/conversations/${id}/rewind`, { body: { turn: 1 } });
    expect(rw.status).toBe(200);
    expect(rw.body).toEqual({ headTurn: 1, left: [2, 3, 4] });
    expect((await turns(id)).map((t) => [t.turn, t.left])).toEqual([
      [1, false],
      [2, true],
      [3, true],
      [4, true],
    ]);
    expect((await readFile(orig.sandboxId, '/root/.claude/memory.txt')).text).toBe('alpha\n');
    expect((await say(id, 'zeta')).body.turn).toBe(5);
    const t5 = await turnDone(id, 5);
    expect(t5.after).toBe(1);
    expect((await readFile(orig.sandboxId, '/root/.claude/memory.txt')).text).toBe('alpha\nzeta\n');
  });

  test('best-of-N: forks with the same message, evaluated in their sandboxes, ranked by exit code', async () => {
    const { body } = await create({ input: 'base' });
    await turnDone(body.id, 1);
    const r = await api('POST', `/v1/conversations/${body.id}/fork`, {
      body: { turn: 1, count: 3, input: 'try', evaluate: 'n=$(od -An -N1 -tu1 /dev/urandom | tr -d " "); echo "score $n"; exit $((n % 3))' },
    });
    expect(r.status).toBe(201);
    expect(r.body.forks).toHaveLength(3);
    for (const f of r.body.forks) opened.push(f.id);
    const group = await eventually(async () => {
      const g = (await api('GET', `/v1/conversations/forks/${r.body.group}`)).body;
      return g.done ? g : undefined;
    }, 120_000);
    const codes: number[] = group.ranked.map((x: { exitCode: number }) => x.exitCode);
    expect(codes).toEqual([...codes].sort((a, b) => a - b));
    for (const x of group.ranked) expect(x.outputTail).toMatch(new RegExp(`^score \\d+\\n$`));
  });

  test('interrupt ends the running turn (interrupted); needs_input waits for input', async () => {
    const { body } = await create({ input: 'sleep 60' });
    const id: string = body.id;
    await eventually(async () => (await turns(id)).find((t) => t.turn === 1 && t.status === 'running'), 60_000);
    await eventually(async () => (await api('POST', `/v1/conversations/${id}/interrupt`)).body.turn === 1);
    const t1 = await turnDone(id, 1);
    expect(t1.yieldReason).toBe('interrupted');
    expect((await say(id, 'ask what next?')).status).toBe(202);
    expect((await turnDone(id, 2)).yieldReason).toBe('needs_input');
    expect((await api('GET', `/v1/conversations/${id}`)).body.status).toBe('awaiting_input');
  });

  test('archive destroys the sandbox; the conversation refuses messages and can still be forked; delete frees it once its forks are gone', async () => {
    const { body } = await create({ input: 'keep' });
    const id: string = body.id;
    await turnDone(id, 1);
    const a = await api('POST', `/v1/conversations/${id}/archive`);
    expect(a.body.status).toBe('archived');
    expect((await say(id, 'more')).status).toBe(409);
    const f = await api('POST', `/v1/conversations/${id}/fork`, { body: { turn: 1, input: 'again' } });
    expect(f.status).toBe(201);
    opened.push(f.body.forks[0].id);
    await turnDone(f.body.forks[0].id, 2);
    const ev = (await events(f.body.forks[0].id)).filter((e) => e.type === 'assistant');
    expect(ev.map((e) => e.data.text)).toEqual(['I remember: keep', 'I remember: keep,again']);
    // Deleting frees its storage: not while it runs, not before its forks are gone.
    const fid: string = f.body.forks[0].id;
    expect((await api('DELETE', `/v1/conversations/${fid}`)).status).toBe(409);
    expect((await api('DELETE', `/v1/conversations/${id}`)).status).toBe(409);
    await api('POST', `/v1/conversations/${fid}/archive`);
    expect((await api('DELETE', `/v1/conversations/${fid}`)).status).toBe(200);
    const sandboxId = (await api('GET', `/v1/conversations/${id}`)).body.sandboxId as string;
    expect((await api('DELETE', `/v1/conversations/${id}`)).status).toBe(200);
    expect((await api('GET', `/v1/conversations/${id}`)).status).toBe(404);
    expect((await api('GET', `/v1/conversations/${id}/events`)).status).toBe(404);
    const left = await api('GET', `/api/sandboxes/${sandboxId}/checkpoints`);
    expect(left.status === 404 || (left.body as unknown[]).length === 0).toBe(true);
  });

  test('sleep between turns: idle, the sandbox hibernates; the next message wakes it and continues with its memory', async () => {
    const { body } = await create({ input: 'before sleep', idleSeconds: 1 });
    const id: string = body.id;
    await turnDone(id, 1);
    const asleep = await eventually(async () => {
      const c = (await api('GET', `/v1/conversations/${id}`)).body;
      return c.sleeping ? c : undefined;
    }, 60_000);
    expect((await api('GET', `/api/sandboxes/${asleep.sandboxId}`)).body.status).toBe('hibernated');
    expect((await say(id, 'after wake')).status).toBe(202);
    await turnDone(id, 2);
    const awake = (await api('GET', `/v1/conversations/${id}`)).body;
    expect(awake.sleeping).toBe(false);
    expect((await events(id)).filter((e) => e.type === 'assistant').at(-1)!.data.text).toBe('I remember: before sleep,after wake');
  });

  test('an API restarted while a client follows events: the client resumes from its last sequence number, losing none and repeating none', async () => {
    const { body } = await create({ input: 'sleep 3' });
    const id: string = body.id;
    const url = `${T.api()}/v1/conversations/${id}/events?level=internal`;
    // The API is killed once this client has seen an event (not once the store has one: the stream
    // may not have sent it yet), and started again whatever happens, so later tests have their API.
    let sawOne!: () => void;
    const seen = new Promise<void>((resolve) => (sawOne = resolve));
    const following = readSse(url, {}, (got) => {
      if (got.length) sawOne();
      return false;
    });
    let part1: { id: number; data: Ev }[];
    try {
      await seen;
      await control('kill', 'api', 'SIGKILL');
      part1 = await following;
      expect(part1.length).toBeGreaterThan(0);
    } finally {
      await control('start', 'api');
      await eventually(async () => (await api('GET', '/healthz').catch(() => ({ status: 0 }))).status === 200, 60_000);
    }
    const part2 = await readSse(url, { 'last-event-id': String(part1.at(-1)!.id) }, (g) => g.some((e) => e.data.type === 'turn_complete'));
    const seqs = [...part1, ...part2].map((e) => ({ seq: e.id }));
    expectContiguous(seqs, 1);
    expect(seqs.length).toBe((await events(id)).length);
  });

  test('the CLI starts one, sends a message, follows its events to the turn end, and forks', async () => {
    const started = await sap(['conversations', 'start', agentId, '--input', 'cli one', '--runner', '["bash","/opt/runner.sh"]']);
    expect(started.code).toBe(0);
    const id = (JSON.parse(started.stdout) as { id: string }).id;
    opened.push(id);
    await turnDone(id, 1);
    const said = await sap(['conversations', 'say', id, 'cli two', '--idempotency-key', unique('cli')]);
    expect(JSON.parse(said.stdout)).toMatchObject({ turn: 2 });
    const followed = await sap(['conversations', 'events', id, '--follow', '--turn', '2', '--level', 'user']);
    expect(followed.code).toBe(0);
    const evs = followed.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Ev);
    expect(evs.at(-1)).toMatchObject({ type: 'turn_complete', turn: 2 });
    expect(evs.filter((e) => e.type === 'assistant').map((e) => e.data.text)).toEqual(['I remember: cli one', 'I remember: cli one,cli two']);
    const forked = await sap(['conversations', 'fork', id, '--turn', '1', '--input', 'cli fork']);
    const fork = (JSON.parse(forked.stdout) as { forks: { id: string; forkedFrom: unknown }[] }).forks[0]!;
    opened.push(fork.id);
    expect(fork.forkedFrom).toEqual({ conversationId: id, turn: 1 });
  });

  test.each(['worker', 'host'] as const)(
    'a %s killed with SIGKILL mid-turn: the turn runs again from its starting checkpoint, completes once, the first attempt superseded',
    async (proc) => {
      const { body } = await create({ input: 'first' });
      const id: string = body.id;
      await turnDone(id, 1);
      expect((await say(id, 'sleep 4')).status).toBe(202);
      await eventually(async () => (await events(id)).some((e) => e.turn === 2 && e.type === 'system'), 60_000);
      await control('kill', proc, 'SIGKILL');
      try {
        await control('start', proc);
      } catch {
        /* the supervisor restarts it itself */
      }
      const t2 = await turnDone(id, 2, 180_000);
      expect(t2.yieldReason).toBe('completed');
      expect(t2.attempt).toBeGreaterThan(1);
      const ev = await events(id);
      expectContiguous(ev, 1);
      const second = ev.filter((e) => e.turn === 2);
      expect(second.some((e) => e.superseded)).toBe(true);
      expect(second.filter((e) => !e.superseded && e.type === 'turn_complete')).toHaveLength(1);
      expect(second.some((e) => e.type === 'turn_restarted')).toBe(true);
      // The first attempt's half-turn was undone: the memory holds the turn once.
      const conv = (await api('GET', `/v1/conversations/${id}`)).body;
      expect((await readFile(conv.sandboxId, '/root/.claude/memory.txt')).text).toBe('first\nsleep 4\n');
    },
  );
});
