/**
 * `npm run bench -- conversations`: durable conversations (docs/api/conversations.md) on a tiny bash
 * runner that answers at once, so what is measured is the platform:
 *   - message → first event, p50: a warm sandbox, and one hibernated (idle past idleSeconds);
 *     `first_event` is the turn's `message` event (written when the turn starts, before the runner),
 *     `first_runner_event` the runner's first line (adds the runner's own start: node and bash);
 *   - fork → first event of the fork's own log, p50;
 *   - best-of-5: one fork request with count 5 and an evaluation, to the ranked answer;
 *   - storage per turn checkpoint (the layers' own bytes).
 * Events are read by polling the JSON page every POLL_MS (a follower on SSE sees them within the
 * API's follow interval more).
 */
type Call = <T = any>(method: string, path: string, body?: unknown, headers?: Record<string, string>) => Promise<{ status: number; body: T }>;

const POLL_MS = 5;

const RUNNER = [
  '#!/bin/bash',
  'echo \'{"type":"ready"}\'',
  'while IFS= read -r line; do',
  '  case "$line" in *\'"type":"prompt"\'*)',
  '    n=$(( $(cat /root/n 2>/dev/null || echo 0) + 1 )); echo $n > /root/n; echo "turn $n" > /workspace/turn-$n.txt',
  '    echo \'{"type":"assistant","text":"ok"}\'; echo \'{"type":"turn_complete"}\' ;;',
  '  esac',
  'done',
].join('\n');

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const p50 = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? Math.round(s[Math.floor((s.length - 1) / 2)]! * 10) / 10 : NaN;
};

export async function benchConversations(o: { n: number; call: Call }): Promise<Record<string, unknown>> {
  const { call } = o;
  const agentId = `bench-conv-${Date.now().toString(36)}`;
  const a = await call('POST', '/v1/agents', { id: agentId, core: 'bash', entrypoint: ['true'], files: { '/opt/runner.sh': RUNNER }, user: 'root' });
  if (a.status !== 201) throw new Error(`create agent: ${a.status} ${JSON.stringify(a.body)}`);
  const opened: string[] = [];
  const create = async (body: Record<string, unknown>) => {
    const r = await call('POST', `/v1/agents/${agentId}/conversations`, { runner: ['bash', '/opt/runner.sh'], ...body });
    if (r.status !== 201) throw new Error(`create conversation: ${r.status} ${JSON.stringify(r.body)}`);
    opened.push(r.body.id);
    return r.body.id as string;
  };
  const get = async (id: string) => (await call('GET', `/v1/conversations/${id}`)).body;
  const until = async <T>(fn: () => Promise<T | undefined | false>, what: string, ms = 120_000): Promise<T> => {
    const deadline = Date.now() + ms;
    for (;;) {
      const v = await fn();
      if (v) return v;
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await sleep(POLL_MS);
    }
  };
  const headAt = (id: string, turn: number) => until(async () => (await get(id)).headTurn >= turn, `turn ${turn} of ${id}`);
  const lastSeq = async (id: string) => {
    let after = 0;
    for (;;) {
      const r = await call('GET', `/v1/conversations/${id}/events?after=${after}&level=internal&limit=500`);
      if (!r.body.events.length) return after;
      after = r.body.next;
    }
  };
  /** Sends a message (or runs `start`) and times the first event after `after`, and the first of the runner. */
  const timeTurn = async (id: string, after: number, start: () => Promise<unknown>) => {
    const t0 = performance.now();
    await start();
    let first = 0;
    const startedAt = t0;
    let runner = 0;
    await until(async () => {
      const r = await call('GET', `/v1/conversations/${id}/events?after=${after}&level=internal&limit=50`);
      const evs = r.body.events as { type: string }[];
      if (evs.length && !first) first = performance.now() - t0;
      if (evs.some((e) => e.type !== 'message' && e.type !== 'turn_restarted') && !runner) runner = performance.now() - t0;
      return runner > 0;
    }, 'the first events');
    return { first, runner, start: startedAt };
  };
  try {
    // Warm: one conversation that never sleeps during the bench.
    const warm = await create({ input: 'hello', idleSeconds: 3600 });
    await headAt(warm, 1);
    const warmFirst: number[] = [];
    const warmRunner: number[] = [];
    for (let i = 0; i < o.n; i++) {
      const after = await lastSeq(warm);
      const t = await timeTurn(warm, after, () => call('POST', `/v1/conversations/${warm}/messages`, { text: `m${i}` }));
      warmFirst.push(t.first);
      warmRunner.push(t.runner);
      await headAt(warm, i + 2);
    }

    // Hibernated: idle 1 s, then each message wakes it.
    const cold = await create({ input: 'hello', idleSeconds: 1 });
    await headAt(cold, 1);
    const wokenFirst: number[] = [];
    const wokenRunner: number[] = [];
    const rounds = Math.max(3, Math.min(o.n, 5));
    for (let i = 0; i < rounds; i++) {
      await until(async () => (await get(cold)).sleeping, 'the sandbox to hibernate');
      const after = await lastSeq(cold);
      const t = await timeTurn(cold, after, () => call('POST', `/v1/conversations/${cold}/messages`, { text: `w${i}` }));
      wokenFirst.push(t.first);
      wokenRunner.push(t.runner);
      await headAt(cold, i + 2);
    }

    // Fork → the fork's first own event (its log shares the parent's up to turn 1's last event).
    const forkFirst: number[] = [];
    const forkRunner: number[] = [];
    const t1End = ((await call('GET', `/v1/conversations/${warm}/turns`)).body.turns as { turn: number; endSeq: number }[]).find((t) => t.turn === 1)!.endSeq;
    for (let i = 0; i < Math.max(3, Math.min(o.n, 5)); i++) {
      const t0 = performance.now();
      const r = await call('POST', `/v1/conversations/${warm}/fork`, { turn: 1, input: `f${i}` });
      if (r.status !== 201) throw new Error(`fork: ${r.status} ${JSON.stringify(r.body)}`);
      const fid = r.body.forks[0].id as string;
      opened.push(fid);
      const t = await timeTurn(fid, t1End, async () => undefined);
      const req = t.start - t0;
      forkFirst.push(req + t.first);
      forkRunner.push(req + t.runner);
    }

    // Best-of-5 wall time.
    const b0 = performance.now();
    const best = await call('POST', `/v1/conversations/${warm}/fork`, { turn: 1, count: 5, input: 'try', evaluate: 'test -f /workspace/turn-2.txt' });
    if (best.status !== 201) throw new Error(`best-of-5: ${best.status} ${JSON.stringify(best.body)}`);
    for (const f of best.body.forks) opened.push(f.id);
    await until(async () => (await call('GET', `/v1/conversations/forks/${best.body.group}`)).body.done, 'best-of-5', 300_000);
    const bestOf5 = performance.now() - b0;

    // Storage per turn checkpoint.
    const sb = (await get(warm)).sandboxId as string;
    const cps = (await call('GET', `/api/sandboxes/${sb}/checkpoints`)).body as { name: string; sizeBytes: number }[];
    const turnCps = cps.filter((c) => /-t\d+$/.test(c.name) && !c.name.endsWith('-t0'));
    return {
      bench: 'conversations',
      n: o.n,
      warm_first_event_p50_ms: p50(warmFirst),
      warm_first_runner_event_p50_ms: p50(warmRunner),
      woken_first_event_p50_ms: p50(wokenFirst),
      woken_first_runner_event_p50_ms: p50(wokenRunner),
      fork_first_event_p50_ms: p50(forkFirst),
      fork_first_runner_event_p50_ms: p50(forkRunner),
      best_of_5_wall_ms: Math.round(bestOf5),
      checkpoint_bytes_per_turn_p50: p50(turnCps.map((c) => c.sizeBytes)),
      checkpoints_measured: turnCps.length,
    };
  } finally {
    for (const id of opened) await call('POST', `/v1/conversations/${id}/archive`).catch(() => undefined);
    await call('DELETE', `/v1/agents/${agentId}`).catch(() => undefined);
  }
}
