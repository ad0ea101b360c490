import fs from 'node:fs';
import { api, control, eventually, withMongo } from '../../helpers/env';
import { otherOrgKey } from '../../helpers/checkpoints';
import { bashAgent, createAgent, hostHasSandbox, runSession, sandboxOf, startSession, waitForStatus } from '../../helpers/sessions';

const COPY = 'cat "$AGENT_INPUT_PATH" > /tmp/agent_result.json';

describe('agents', () => {
  it('creates, reads, lists, updates and deletes an agent', async () => {
    const created = await api('POST', '/v1/agents', {
      body: { core: 'python', display_name: 'Echo', entrypoint: ['python3', '-c', 'print(1)'], env: { TOKEN: 's3cret-value' }, channels: ['slack'] },
    });
    expect(created.status).toBe(201);
    const a = created.body;
    expect(a).toMatchObject({ display_name: 'Echo', core: 'python', channels: ['slack'], packages: [], config: null, snapshot: null, timeoutSeconds: 3600 });
    expect(a.id).toMatch(/^agt_/);
    expect(JSON.stringify(a)).not.toContain('s3cret-value');
    expect((await api('GET', `/v1/agents/${a.id}`)).body.id).toBe(a.id);
    const patched = await api('PATCH', `/v1/agents/${a.id}`, { body: { display_name: 'Echo 2', timeoutSeconds: 60 } });
    expect(patched.status).toBe(200);
    expect(patched.body).toMatchObject({ display_name: 'Echo 2', timeoutSeconds: 60, core: 'python' });
    expect((await api('GET', '/v1/agents?limit=200')).body.agents.map((x: { id: string }) => x.id)).toContain(a.id);
    expect((await api('DELETE', `/v1/agents/${a.id}`)).status).toBe(200);
    expect((await api('GET', `/v1/agents/${a.id}`)).status).toBe(404);
  });

  it('rejects a duplicate id (409), an unknown core and bad fields (400)', async () => {
    const id = await bashAgent('true');
    const dup = await api('POST', '/v1/agents', { body: { id, core: 'bash', entrypoint: ['true'] } });
    expect(dup.status).toBe(409);
    expect(dup.body.error.type).toBe('conflict');
    const bad = [
      { core: 'cobol', entrypoint: ['x'] },
      { core: 'bash' },
      { core: 'bash', entrypoint: [] },
      { core: 'bash', entrypoint: ['x'], files: { 'relative/path': 'x' } },
      { core: 'bash', entrypoint: ['x'], timeoutSeconds: 0 },
      { core: 'bash', entrypoint: ['x'], id: 'bad id!' },
      { core: 'bash', entrypoint: ['x'], unknownField: 1 },
    ];
    for (const body of bad) {
      const r = await api('POST', '/v1/agents', { body });
      expect([r.status, r.body.error?.type]).toEqual([400, 'invalid_request']);
    }
    expect((await api('PATCH', `/v1/agents/${id}`, { body: { core: 'cobol' } })).status).toBe(400);
    expect((await api('PATCH', '/v1/agents/nope-nope', { body: { display_name: 'x' } })).status).toBe(404);
  });

  it('refuses to delete an agent with a running session (409)', async () => {
    const id = await bashAgent('sleep 30');
    const s = await startSession(id);
    const r = await api('DELETE', `/v1/agents/${id}`);
    expect(r.status).toBe(409);
    await api('DELETE', `/v1/agents/${id}/sessions/${s.id}`);
    expect((await api('DELETE', `/v1/agents/${id}`)).status).toBe(200);
  });
});

describe('session lifecycle on real sandboxes', () => {
  it('completes with the result the agent wrote, and destroys the sandbox', async () => {
    const agent = await bashAgent(COPY);
    const created = await startSession(agent, { input: { hello: 'world', n: 1 }, metadata: { user: 'u1' } });
    expect(created).toMatchObject({
      status: 'creating',
      input: { hello: 'world', n: 1 },
      metadata: { user: 'u1' },
      result: null,
      preview_url: null,
      agent_id: agent,
    });
    expect(created.id).toMatch(/^sess_[a-z0-9]+$/);
    const done = await waitForStatus(agent, created.id, ['completed', 'failed']);
    expect({ status: done.status, outcome: done.outcome }).toEqual({ status: 'completed', outcome: { reason: null, exit_code: 0, message: null } });
    expect(done.result).toEqual({ hello: 'world', n: 1 });
    // A quick session goes from creating to completed: its ending records where and when it ran.
    const ending = await withMongo((c) =>
      c
        .db()
        .collection('session_results')
        .findOne({ _id: created.id } as never),
    );
    expect(ending!.sandbox_id).toBe(sandboxOf(created.id));
    expect(ending!.started_at.getTime()).toBeGreaterThanOrEqual(Date.parse(done.created_at));
    expect(ending!.started_at.getTime()).toBeLessThanOrEqual(ending!.completed_at.getTime());
    const result = await api('GET', `/v1/agents/${agent}/sessions/${created.id}/result`);
    expect(result.status).toBe(200);
    expect(result.body).toMatchObject({ data: { hello: 'world', n: 1 }, status: 'completed' });
    expect(Date.parse(result.body.completed_at)).not.toBeNaN();
    // The outcome is recorded first, then the sandbox is destroyed.
    await eventually(async () => !(await hostHasSandbox(sandboxOf(created.id))), 10_000);
  });

  it('shows a session that runs longer than a second as running, with its start, until it ends', async () => {
    const agent = await bashAgent('sleep 2; echo \'{"slow":true}\' > /tmp/agent_result.json');
    const s = await startSession(agent);
    const running = await waitForStatus(agent, s.id, ['running', 'completed', 'failed']);
    expect(running.status).toBe('running');
    expect(Date.parse(running.updated_at)).toBeGreaterThan(Date.parse(running.created_at));
    const progress = await withMongo((c) =>
      c
        .db()
        .collection('session_progress')
        .findOne({ _id: s.id } as never),
    );
    expect(progress!.sandbox_id).toBe(sandboxOf(s.id));
    const done = await waitForStatus(agent, s.id, ['completed', 'failed']);
    expect({ status: done.status, result: done.result }).toEqual({ status: 'completed', result: { slow: true } });
    expect(Date.parse(done.updated_at)).toBeGreaterThan(Date.parse(running.updated_at));
  });

  it("starts sessions with an agent's new definition right after it is updated", async () => {
    const agent = await bashAgent('echo \'{"v":1}\' > /tmp/agent_result.json');
    expect((await runSession(agent)).result.data).toEqual({ v: 1 });
    const patched = await api('PATCH', `/v1/agents/${agent}`, { body: { entrypoint: ['bash', '-c', 'echo \'{"v":2}\' > /tmp/agent_result.json'] } });
    expect(patched.status).toBe(200);
    expect((await runSession(agent)).result.data).toEqual({ v: 2 });
    // Temporal's visibility sees the last session closed a moment after it ended.
    await eventually(async () => (await api('DELETE', `/v1/agents/${agent}`)).status === 200, 15_000);
    expect((await api('POST', `/v1/agents/${agent}/sessions`, { body: { input: {} } })).status).toBe(404);
  });

  it('completes with null data when no result file was written', async () => {
    const { session, result } = await runSession(await bashAgent('echo nothing to say'));
    expect(session.status).toBe('completed');
    expect(result.data).toBeNull();
  });

  it('fails on a non-zero exit, keeping what the agent wrote and the exit code', async () => {
    const { session, result, resultStatus } = await runSession(await bashAgent('echo \'{"partial":true}\' > /tmp/agent_result.json; exit 3'));
    expect(session.status).toBe('failed');
    expect(resultStatus).toBe(200);
    expect(result).toMatchObject({ status: 'failed', data: { partial: true }, reason: 'exit_code', exit_code: 3 });
  });

  it('fails on timeout', async () => {
    const { session, result } = await runSession(await bashAgent('sleep 30', { timeoutSeconds: 1 }));
    expect(session.status).toBe('failed');
    expect(result.reason).toBe('timeout');
  });

  it('fails a result that is not a JSON object, or not JSON', async () => {
    const arr = await runSession(await bashAgent('echo "[1,2]" > /tmp/agent_result.json'));
    expect(arr.result).toMatchObject({ status: 'failed', reason: 'invalid_result', data: null });
    const junk = await runSession(await bashAgent('echo "not json" > /tmp/agent_result.json'));
    expect(junk.result).toMatchObject({ status: 'failed', reason: 'invalid_result' });
  });

  it('fails a result larger than the limit instead of storing it', async () => {
    const script = 'python3 -c "import json; json.dump({\\"pad\\": \\"x\\" * (5 * 1024 * 1024)}, open(\\"/tmp/agent_result.json\\", \\"w\\"))"';
    const { result } = await runSession(await bashAgent(script));
    expect(result).toMatchObject({ status: 'failed', reason: 'invalid_result', data: null });
    expect(result.message).toMatch(/limit/);
  });

  it('runs node and python cores', async () => {
    const node = await createAgent(
      [
        'node',
        '-e',
        'const fs=require("fs");const i=JSON.parse(fs.readFileSync(process.env.AGENT_INPUT_PATH));fs.writeFileSync("/tmp/agent_result.json",JSON.stringify({sum:i.a+i.b}))',
      ],
      { core: 'node' },
    );
    expect((await runSession(node, { a: 2, b: 3 })).result.data).toEqual({ sum: 5 });
    const py = await createAgent(
      [
        'python3',
        '-c',
        'import json,os; i=json.load(open(os.environ["AGENT_INPUT_PATH"])); json.dump({"upper": i["s"].upper()}, open("/tmp/agent_result.json","w"))',
      ],
      { core: 'python' },
    );
    expect((await runSession(py, { s: 'abc' })).result.data).toEqual({ upper: 'ABC' });
  });

  it("writes the agent's files before the entrypoint starts", async () => {
    const agent = await createAgent(['bash', '/workspace/run.sh'], {
      files: { '/workspace/run.sh': 'echo "{\\"from\\":\\"file\\"}" > /tmp/agent_result.json\n' },
    });
    expect((await runSession(agent)).result.data).toEqual({ from: 'file' });
  });

  it('answers 409 for the result while running, and DELETE ends it as cancelled and destroys the sandbox', async () => {
    const agent = await bashAgent('sleep 60');
    const s = await startSession(agent);
    await waitForStatus(agent, s.id, ['running']);
    const early = await api('GET', `/v1/agents/${agent}/sessions/${s.id}/result`);
    expect(early.status).toBe(409);
    expect(early.body.error).toEqual({ type: 'conflict', message: expect.stringMatching(/still running/) });
    expect(await hostHasSandbox(sandboxOf(s.id))).toBe(true);
    const del = await api('DELETE', `/v1/agents/${agent}/sessions/${s.id}`);
    expect(del.status).toBe(200);
    expect(del.body.status).toBe('failed');
    expect(del.body.outcome.reason).toBe('cancelled');
    expect(await hostHasSandbox(sandboxOf(s.id))).toBe(false);
    const again = await api('DELETE', `/v1/agents/${agent}/sessions/${s.id}`);
    expect(again.body).toEqual(del.body);
    expect((await api('GET', `/v1/agents/${agent}/sessions/${s.id}/result`)).body.reason).toBe('cancelled');
  });

  it('returns the same session for the same Idempotency-Key and starts nothing new', async () => {
    const agent = await bashAgent(COPY);
    const key = `idem-${Date.now()}`;
    const a = await api('POST', `/v1/agents/${agent}/sessions`, { body: { input: { n: 1 } }, headers: { 'idempotency-key': key } });
    const b = await api('POST', `/v1/agents/${agent}/sessions`, { body: { input: { n: 1 } }, headers: { 'idempotency-key': key } });
    expect(a.status).toBe(201);
    expect(b.status).toBe(200);
    expect(b.body.id).toBe(a.body.id);
    await waitForStatus(agent, a.body.id, ['completed']);
    const list = await api('GET', `/v1/agents/${agent}/sessions`);
    expect(list.body.sessions).toHaveLength(1);
    const bad = await api('POST', `/v1/agents/${agent}/sessions`, { body: {}, headers: { 'idempotency-key': 'x'.repeat(300) } });
    expect(bad.status).toBe(400);
  });

  it('carries 1 MiB of input and unicode intact', async () => {
    const agent = await bashAgent(COPY);
    const input = { text: 'héllo wörld — 你好 — 🚀', pad: 'z'.repeat(1024 * 1024) };
    const { session, result } = await runSession(agent, input);
    expect(session.status).toBe('completed');
    expect(result.data).toEqual(input);
  });

  it('lists sessions newest first with a status filter and cursor paging', async () => {
    const agent = await bashAgent('true');
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await startSession(agent)).id);
    for (const id of ids) await waitForStatus(agent, id, ['completed']);
    const p1 = await api('GET', `/v1/agents/${agent}/sessions?limit=2&status=completed`);
    expect(p1.body.sessions.map((s: { id: string }) => s.id)).toEqual([ids[2], ids[1]]);
    const p2 = await api('GET', `/v1/agents/${agent}/sessions?limit=2&status=completed&cursor=${p1.body.next_cursor}`);
    expect(p2.body.sessions.map((s: { id: string }) => s.id)).toEqual([ids[0]]);
    expect(p2.body.next_cursor).toBeNull();
    expect((await api('GET', `/v1/agents/${agent}/sessions?status=running`)).body.sessions).toEqual([]);
    expect((await api('GET', `/v1/agents/${agent}/sessions?status=bogus`)).status).toBe(400);
    expect((await api('GET', `/v1/agents/${agent}/sessions?cursor=forged`)).status).toBe(400);
  });

  it('?wait answers when the session ends, or with its current state when the time is up', async () => {
    const agent = await bashAgent('sleep 1.5; echo \'{"waited":true}\' > /tmp/agent_result.json');
    const s = await startSession(agent);
    // The time is up before the session ends (it sleeps 1.5 s once running): the answer is its current state.
    const short = await api('GET', `/v1/agents/${agent}/sessions/${s.id}?wait=0.3`);
    expect(short.status).toBe(200);
    expect(['creating', 'running']).toContain(short.body.status);
    const done = await api('GET', `/v1/agents/${agent}/sessions/${s.id}/result?wait=30`);
    expect(done.status).toBe(200);
    expect(done.body).toMatchObject({ status: 'completed', data: { waited: true } });
    // Ended already: answered with its end, not after the longest wait (60 s, this test's whole time limit).
    expect((await api('GET', `/v1/agents/${agent}/sessions/${s.id}?wait=60`)).body.status).toBe('completed');
    for (const bad of ['-1', '61', 'soon']) {
      const r = await api('GET', `/v1/agents/${agent}/sessions/${s.id}?wait=${bad}`);
      expect(r.status).toBe(400);
      expect(r.body.error.type).toBe('invalid_request');
    }
    // Another organisation cannot wait on it either.
    const other = await api('GET', `/v1/agents/${agent}/sessions/${s.id}?wait=1`, { key: await otherOrgKey() });
    expect(other.status).toBe(404);
  });

  it('answers bad input on session routes with the error body', async () => {
    const agent = await bashAgent('true');
    expect((await api('POST', '/v1/agents/no-such-agent/sessions', { body: {} })).status).toBe(404);
    expect((await api('POST', `/v1/agents/${agent}/sessions`, { body: { input: 'text' } })).status).toBe(400);
    expect((await api('POST', `/v1/agents/${agent}/sessions`, { body: { input: [1] } })).status).toBe(400);
    expect((await api('GET', `/v1/agents/${agent}/sessions/not-a-session`)).status).toBe(400);
    expect((await api('GET', `/v1/agents/${agent}/sessions/sess_doesnotexist`)).status).toBe(404);
    expect((await api('DELETE', `/v1/agents/${agent}/sessions/sess_doesnotexist`)).status).toBe(404);
  });
});

describe('isolation', () => {
  it("a sandbox cannot read host files or see another sandbox's processes", async () => {
    const secret = `/tmp/sap-host-secret-${Date.now()}`;
    fs.writeFileSync(secret, 'host-only');
    try {
      const stamp = Date.now();
      const marker = `marker${stamp}`;
      const sleeper = await bashAgent(`exec -a ${marker} sleep 30`);
      const s1 = await startSession(sleeper);
      await waitForStatus(sleeper, s1.id, ['running']);
      const prober = await bashAgent(
        // Its own background process is seen once it has exec'd (looked for 100 times, 50 ms apart): the control of the "seen" check.
        `(exec -a own${stamp} sleep 5) & own=false; for i in $(seq 100); do grep -qa "own""${stamp}" /proc/[0-9]*/cmdline 2>/dev/null && { own=true; break; }; sleep 0.05; done; ` +
          `found=false; [ -e ${secret} ] && found=true; seen=false; grep -qa "marker""${stamp}" /proc/[0-9]*/cmdline 2>/dev/null && seen=true; ` +
          `work=false; [ -e /work ] && work=true; echo "{\\"own\\":$own,\\"secret\\":$found,\\"seen\\":$seen,\\"work\\":$work}" > /tmp/agent_result.json`,
      );
      const { result } = await runSession(prober);
      expect(result.data).toEqual({ own: true, secret: false, seen: false, work: false });
      await api('DELETE', `/v1/agents/${sleeper}/sessions/${s1.id}`);
    } finally {
      fs.rmSync(secret, { force: true });
    }
  });
});

describe('durability', () => {
  it('a session survives its worker being killed with SIGKILL: one result, no orphan sandbox', async () => {
    const agent = await bashAgent(`sleep 4; ${COPY}`);
    const s = await startSession(agent, { input: { survived: true } });
    await waitForStatus(agent, s.id, ['running']);
    // kill resolves once the worker has exited.
    await control('kill', 'worker', 'SIGKILL');
    expect(await hostHasSandbox(sandboxOf(s.id))).toBe(true);
    // While every worker is down, the session is still readable.
    expect((await api('GET', `/v1/agents/${agent}/sessions/${s.id}`)).body.status).toBe('running');
    await control('start', 'worker');
    const done = await waitForStatus(agent, s.id, ['completed', 'failed'], 90_000);
    expect(done.status).toBe('completed');
    expect(done.result).toEqual({ survived: true });
    await eventually(async () => !(await hostHasSandbox(sandboxOf(s.id))), 10_000);
    const docs = await withMongo((c) =>
      c
        .db()
        .collection('sessions')
        .countDocuments({ _id: s.id } as never),
    );
    expect(docs).toBe(1);
  }, 120_000);
});
