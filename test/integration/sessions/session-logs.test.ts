/**
 * Session logs: the entrypoint's stdout and stderr, kept in MongoDB after the sandbox is gone, in
 * the order written (the entry helper relays both streams and records the order of their chunks).
 */
import { api, control, eventually, T, withMongo } from '../../helpers/env';
import { otherOrgKey } from '../../helpers/checkpoints';
import { bashAgentsDeletedAfterAll, runSession, startSession, waitForStatus } from '../../helpers/sessions';

jest.setTimeout(180_000);

const agents: string[] = [];
const agent = bashAgentsDeletedAfterAll(agents);

/** GET …/logs as text (or NDJSON), with the response's headers. */
async function logs(agentId: string, sessionId: string, query = '', accept = 'text/plain'): Promise<{ status: number; text: string; headers: Headers }> {
  const r = await fetch(`${T.api()}/v1/agents/${agentId}/sessions/${sessionId}/logs${query}`, { headers: { 'x-api-key': T.key(), accept } });
  return { status: r.status, text: await r.text(), headers: r.headers };
}

// Pauses between switches of stream: chunks are ordered by when the helper read them, so output
// written within the same instant on both streams may come in either order.
const INTERLEAVED = 'echo out-1; sleep 1; echo err-1 >&2; sleep 1; echo out-2; sleep 1; echo err-2 >&2';

describe('session logs', () => {
  it('keeps stdout and stderr of a completed session in order, as text and NDJSON, after the sandbox is gone', async () => {
    const id = await agent(`${INTERLEAVED}; echo '{}' > /tmp/agent_result.json`);
    const { session } = await runSession(id);
    expect(session.status).toBe('completed');
    const all = await logs(id, session.id);
    expect(all.status).toBe(200);
    expect(all.headers.get('content-type')).toMatch(/^text\/plain/);
    expect(all.text).toBe('out-1\nerr-1\nout-2\nerr-2\n');
    expect(all.headers.get('x-sap-log-truncated')).toBe('none');
    expect((await logs(id, session.id, '?stream=stdout')).text).toBe('out-1\nout-2\n');
    expect((await logs(id, session.id, '?stream=stderr')).text).toBe('err-1\nerr-2\n');
    const nd = await logs(id, session.id, '', 'application/x-ndjson');
    expect(nd.headers.get('content-type')).toMatch(/^application\/x-ndjson/);
    const lines = nd.text
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { stream: string; time: string; line: string });
    expect(lines.map((l) => [l.stream, l.line])).toEqual([
      ['stdout', 'out-1'],
      ['stderr', 'err-1'],
      ['stdout', 'out-2'],
      ['stderr', 'err-2'],
    ]);
    for (const l of lines) expect(Number.isNaN(Date.parse(l.time))).toBe(false);
  });

  it("a failed session's message ends with its stderr, and its log keeps both streams", async () => {
    const id = await agent('echo working; echo "oops: the widget broke" >&2; exit 3');
    const { session, result } = await runSession(id);
    expect(session.status).toBe('failed');
    expect(session.outcome.reason).toBe('exit_code');
    expect(session.outcome.message).toBe('entrypoint exited with code 3; stderr: oops: the widget broke');
    expect(result.message).toBe(session.outcome.message);
    expect((await logs(id, session.id)).text).toBe('working\noops: the widget broke\n');
  });

  it('keeps the last SESSION_LOG_MAX_BYTES (1 MiB) of a 3 MB output, and says it was cut', async () => {
    // Past the quick path (the worker reads the log when the session ends, not the create's answer).
    const id = await agent("sleep 2; head -c 3000000 /dev/zero | tr '\\0' a; echo; echo end-of-err >&2");
    const { session } = await runSession(id);
    expect(session.status).toBe('completed');
    const r = await logs(id, session.id, '?stream=stdout');
    expect([r.headers.get('x-sap-log-truncated'), r.headers.get('x-sap-log-bytes'), r.text.length]).toEqual([
      'stdout',
      'stdout=3000001,stderr=11',
      1024 * 1024,
    ]);
    expect(r.headers.get('x-sap-log-bytes')).toBe('stdout=3000001,stderr=11');
    expect(r.text.length).toBe(1024 * 1024);
    expect(r.text.endsWith('aaa\n')).toBe(true);
    expect((await logs(id, session.id, '?stream=stderr')).text).toBe('end-of-err\n');
  });

  it('stores nothing for a session that printed nothing, and answers it with an empty log', async () => {
    const id = await agent("echo '{}' > /tmp/agent_result.json");
    const { session } = await runSession(id);
    const r = await logs(id, session.id);
    expect([r.status, r.text]).toEqual([200, '']);
    const stored = await withMongo((c) =>
      c
        .db()
        .collection('session_logs')
        .findOne({ _id: session.id } as never),
    );
    expect(stored).toBeNull();
  });

  it("shows a running session's output so far, and keeps all of it when its worker is killed mid-run", async () => {
    const id = await agent('echo before; sleep 4; echo after >&2; sleep 1');
    const s = await startSession(id);
    await waitForStatus(id, s.id, ['running']);
    await eventually(async () => (await logs(id, s.id)).text === 'before\n', 20_000, 200);
    await control('kill', 'worker', 'SIGKILL');
    await control('start', 'worker');
    const done = await waitForStatus(id, s.id, ['completed', 'failed'], 90_000);
    expect(done.status).toBe('completed');
    expect((await logs(id, s.id)).text).toBe('before\nafter\n');
  });

  it('follow streams the output while the session runs and ends when it ends, with nothing lost or repeated', async () => {
    const id = await agent('for i in 1 2 3 4; do echo line-$i; sleep 1; done; echo err-end >&2');
    const s = await startSession(id);
    const res = await fetch(`${T.api()}/v1/agents/${id}/sessions/${s.id}/logs?follow=true`, { headers: { 'x-api-key': T.key() } });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    let text = '';
    let statusAtFirstLine: string | undefined;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString('utf8');
      if (statusAtFirstLine === undefined && text.includes('line-1')) statusAtFirstLine = (await api('GET', `/v1/agents/${id}/sessions/${s.id}`)).body.status;
    }
    // The first line came while the session was still going; the stream ended with the session.
    expect(['creating', 'running']).toContain(statusAtFirstLine);
    expect(text).toBe('line-1\nline-2\nline-3\nline-4\nerr-end\n');
    expect((await api('GET', `/v1/agents/${id}/sessions/${s.id}`)).body.status).toBe('completed');
    expect((await logs(id, s.id)).text).toBe(text);
    // NDJSON follow of an ended session: its stored log, then the end.
    const nd = await logs(id, s.id, '?follow=true&stream=stderr', 'application/x-ndjson');
    expect(
      nd.text
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l).line),
    ).toEqual(['err-end']);
  });

  it('answers bad queries with 400, and another organisation with 404', async () => {
    const id = await agent('echo hi');
    const { session } = await runSession(id);
    for (const q of ['stream=everything', 'follow=maybe', `stream=${'x'.repeat(5000)}`]) {
      const bad = await api('GET', `/v1/agents/${id}/sessions/${session.id}/logs?${q}`);
      expect([q.slice(0, 20), bad.status, bad.body.error.type]).toEqual([q.slice(0, 20), 400, 'invalid_request']);
    }
    const keyB = await otherOrgKey();
    const other = await api('GET', `/v1/agents/${id}/sessions/${session.id}/logs`, { key: keyB });
    expect([other.status, other.body.error.type]).toEqual([404, 'not_found']);
    expect((await api('GET', `/v1/agents/${id}/sessions/sess_doesnotexist/logs`)).status).toBe(404);
  });
});
