import fs from 'node:fs';
import path from 'node:path';
import { api, eventually, T, unique } from '../../helpers/env';
import { bashAgent, runSession } from '../../helpers/sessions';

/** Parses the Prometheus text format into `name{labels}` → value; throws on a malformed line. */
function parseProm(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+\d+)?$/.exec(line);
    if (!m) throw new Error(`not Prometheus text: ${line}`);
    const value = m[3] === '+Inf' ? Infinity : m[3] === '-Inf' ? -Infinity : Number(m[3]);
    if (Number.isNaN(value) && m[3] !== 'NaN') throw new Error(`bad value: ${line}`);
    out.set(`${m[1]}${m[2] ?? ''}`, value);
  }
  return out;
}

async function scrape(url: string): Promise<Map<string, number>> {
  const res = await fetch(url);
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/plain/);
  return parseProm(await res.text());
}

const sum = (m: Map<string, number>, prefix: string) => [...m].filter(([k]) => k.startsWith(prefix)).reduce((a, [, v]) => a + v, 0);

describe('metrics', () => {
  it('API /metrics parses as Prometheus text and its counters move with the work', async () => {
    const agent = await bashAgent('cat "$AGENT_INPUT_PATH" > /tmp/agent_result.json');
    const route = `sap_http_request_duration_seconds_count{method="GET",route="/v1/agents/:agentId",status="200"}`;
    const before = await scrape(`${T.api()}/metrics`);
    for (let i = 0; i < 3; i++) expect((await api('GET', `/v1/agents/${agent}`)).status).toBe(200);
    await runSession(agent, { m: 1 });
    const b = await api('POST', `/v1/agents/${agent}/batches`, { body: { items: [{}, {}] } });
    expect(b.status).toBe(201);
    const after = await scrape(`${T.api()}/metrics`);
    expect((after.get(route) ?? 0) - (before.get(route) ?? 0)).toBe(3);
    expect((after.get('sap_sessions_created_total') ?? 0) - (before.get('sap_sessions_created_total') ?? 0)).toBe(1);
    expect((after.get('sap_batches_created_total') ?? 0) - (before.get('sap_batches_created_total') ?? 0)).toBe(1);
    expect((after.get('sap_batch_items_submitted_total') ?? 0) - (before.get('sap_batch_items_submitted_total') ?? 0)).toBe(2);
    expect([...after.keys()].some((k) => k.startsWith('sap_batch_items{state="pending"}'))).toBe(true);
    expect(after.has('sap_api_process_resident_memory_bytes')).toBe(true);
    // Labels carry route patterns, never the ids of a path.
    expect([...after.keys()].some((k) => k.includes(agent))).toBe(false);
    // Let the batch finish, so the worker's counters below see only their own sessions.
    await eventually(async () => (await api('GET', `/v1/agents/${agent}/batches/${b.body.id}`)).body.status === 'completed', 30_000, 200);
  }, 60_000);

  it('worker /metrics has session, sandbox and Temporal SDK metrics that move with the work', async () => {
    const url = process.env.SAP_TEST_WORKER_METRICS_URL!;
    const before = await eventually(() => scrape(url), 10_000);
    const agent = await bashAgent('cat "$AGENT_INPUT_PATH" > /tmp/agent_result.json');
    const failing = await bashAgent('exit 5');
    await runSession(agent, { w: 1 });
    await runSession(failing, {});
    const done = 'sap_sessions_finished_total{status="completed",reason="ok"}';
    const failed = 'sap_sessions_finished_total{status="failed",reason="exit_code"}';
    // A session's outcome is visible through the API just before its last activity (which
    // destroys the sandbox) completes and is counted: wait for the counters to catch up.
    const after = await eventually(async () => {
      const m = await scrape(url);
      return (m.get(failed) ?? 0) > (before.get(failed) ?? 0) ? m : undefined;
    }, 10_000);
    expect((after.get('sap_sessions_started_total') ?? 0) - (before.get('sap_sessions_started_total') ?? 0)).toBe(2);
    expect((after.get(done) ?? 0) - (before.get(done) ?? 0)).toBe(1);
    expect((after.get(failed) ?? 0) - (before.get(failed) ?? 0)).toBe(1);
    expect(sum(after, 'sap_session_duration_seconds_count') - sum(before, 'sap_session_duration_seconds_count')).toBe(2);
    expect([...after.keys()].some((k) => k.startsWith('sap_activity_duration_seconds_count{activity="provisionSandboxAndRunEntrypoint"'))).toBe(true);
    expect(after.has('sap_exec_sessions_running')).toBe(true);
    // The Temporal SDK's own worker metrics, from its Runtime telemetry exporter.
    expect([...after.keys()].some((k) => k.startsWith('temporal_'))).toBe(true);
  }, 60_000);
});

describe('logs', () => {
  it('request lines are JSON with request id, org and path ids; API keys never appear', async () => {
    const reqId = unique('req');
    const agent = await bashAgent('true');
    const secret = `sk-${unique('secret')}`;
    expect((await api('GET', `/v1/agents/${agent}`, { headers: { 'x-request-id': reqId } })).status).toBe(200);
    expect((await api('GET', `/v1/agents/${agent}`, { key: secret, headers: { 'x-request-id': `${reqId}-bad` } })).status).toBe(401);
    expect((await api('GET', `/v1/agents?api_key=${secret}`, { key: null, headers: { 'x-request-id': `${reqId}-q` } })).status).toBe(401);
    const file = path.join(T.logDir(), 'api.log');
    const lines = await eventually(async () => {
      const found = fs
        .readFileSync(file, 'utf8')
        .split('\n')
        .filter((l) => l.includes(reqId));
      return found.length >= 3 ? found : undefined;
    }, 10_000);
    const ok = JSON.parse(lines.find((l) => l.includes(`"id":"${reqId}"`))!) as Record<string, any>;
    expect(ok).toMatchObject({ orgId: expect.any(String), agentId: agent, req: { id: reqId, method: 'GET' }, res: { statusCode: 200 } });
    const all = fs.readFileSync(file, 'utf8');
    expect(all).not.toContain(secret);
    expect(all).not.toContain(T.key());
    expect(lines.find((l) => l.includes(`${reqId}-q`))).toContain('api_key=[redacted]');
  }, 30_000);
});
