/**
 * A conversation on the default runner, the real Claude Agent SDK, against the fake Messages API
 * (test/helpers/fake-anthropic.js, served from a test host of this file's own, as in
 * agent-sdk.test.ts). The fake answers "You said: <message>. Earlier: <the earlier user messages>",
 * so each answer shows what the agent remembers: the SDK's own conversation state in /root/.claude,
 * resumed turn after turn from the sandbox's files. Forked at turn 2 of 4, the fork remembers
 * turns 1-2 only while the original remembers all four.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { api, eventually, unique } from '../../helpers/env';
import { hostClient } from '../../helpers/sandboxes';
import { TestHost } from '../../helpers/test-host';
import { startFakeMessagesApi } from '../../helpers/fake-messages-api';
import { FakeDns } from '../../helpers/fake-dns';

const FAKE_PORT = 8080;
const FAKE_LOG = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'sap-fake-anthropic-')), 'requests.ndjson');
const KEY = `sk-ant-test-${randomBytes(12).toString('hex')}`;
const STORE = `conv-sdk-${randomBytes(4).toString('hex')}`;

let testHost: TestHost | undefined;
const dns = new FakeDns();
let agentId: string | undefined;
const opened: string[] = [];

beforeAll(async () => {
  await dns.listen();
  testHost = new TestHost('198.18');
  await startFakeMessagesApi(testHost, { port: FAKE_PORT, log: FAKE_LOG, key: KEY });
  expect((await api('POST', '/api/secret-stores', { body: { name: STORE } })).status).toBe(201);
  expect((await api('PUT', `/api/secret-stores/${STORE}/secrets/ANTHROPIC_API_KEY`, { body: { value: KEY } })).status).toBe(200);
  agentId = unique('conv-claude');
  const r = await api('POST', '/v1/agents', {
    body: {
      id: agentId,
      core: 'node',
      entrypoint: ['true'],
      user: 'root',
      secret_store: STORE,
      env: { ANTHROPIC_BASE_URL: `http://${testHost.addr}:${FAKE_PORT}` },
    },
  });
  expect(r.status).toBe(201);
}, 60_000);

afterAll(async () => {
  for (const id of opened) await api('POST', `/v1/conversations/${id}/archive`).catch(() => undefined);
  if (agentId) await api('DELETE', `/v1/agents/${agentId}`);
  await api('DELETE', `/api/secret-stores/${STORE}`);
  testHost?.remove();
  await dns.close();
  fs.rmSync(path.dirname(FAKE_LOG), { recursive: true, force: true });
});

type Ev = { seq: number; turn: number; type: string; data: any };

async function turnDone(id: string, n: number): Promise<{ yieldReason: string; result: string | null }> {
  return eventually(
    async () => {
      const c = (await api('GET', `/v1/conversations/${id}`)).body;
      if (c.headTurn < n) return undefined;
      return ((await api('GET', `/v1/conversations/${id}/turns`)).body.turns as { turn: number; yieldReason: string; result: string | null }[]).find(
        (t) => t.turn === n,
      );
    },
    120_000,
    200,
  );
}

async function allEvents(id: string): Promise<Ev[]> {
  return (await api('GET', `/v1/conversations/${id}/events?level=internal&limit=500`)).body.events;
}

/** `bash -c script` in a sandbox, as its user (root here). */
async function inSandbox(sandboxId: string, script: string): Promise<string> {
  const r = await hostClient().execRun(sandboxId, { cmd: 'bash', args: ['-c', script], timeout: 30 });
  return r.stdout;
}

describe('a conversation on the Claude Agent SDK', () => {
  it('keeps the SDK’s memory across turns; a fork at turn 2 of 4 remembers turns 1-2 while the original is at turn 4', async () => {
    const c = await api('POST', `/v1/agents/${agentId}/conversations`, {
      body: { input: 'turn one', options: { model: 'claude-sonnet-4-5' }, idleSeconds: 3600 },
    });
    expect(c.status).toBe(201);
    const id: string = c.body.id;
    opened.push(id);
    expect((await turnDone(id, 1)).result).toBe('You said: turn one. Earlier: (nothing)');
    for (const [n, text] of [
      [2, 'turn two'],
      [3, 'turn three'],
      [4, 'turn four'],
    ] as const) {
      expect((await api('POST', `/v1/conversations/${id}/messages`, { body: { text } })).status).toBe(202);
      await turnDone(id, n);
    }
    expect((await turnDone(id, 4)).result).toBe('You said: turn four. Earlier: turn one | turn two | turn three');

    const f = await api('POST', `/v1/conversations/${id}/fork`, { body: { turn: 2, input: 'fork three' } });
    expect(f.status).toBe(201);
    const fid: string = f.body.forks[0].id;
    opened.push(fid);
    // The fork's next turn resumes the SDK session from turn 2's checkpoint: it remembers turns 1-2 only.
    expect((await turnDone(fid, 3)).result).toBe('You said: fork three. Earlier: turn one | turn two');

    // The SDK's conversation state (/root/.claude) in each sandbox says the same.
    const fork = (await api('GET', `/v1/conversations/${fid}`)).body;
    const orig = (await api('GET', `/v1/conversations/${id}`)).body;
    const grep = (t: string) => `grep -rl --include=*.jsonl '${t}' /root/.claude | wc -l`;
    expect(Number(await inSandbox(fork.sandboxId, grep('turn two')))).toBeGreaterThan(0);
    expect(Number(await inSandbox(fork.sandboxId, grep('turn three')))).toBe(0);
    expect(Number(await inSandbox(orig.sandboxId, grep('turn four')))).toBeGreaterThan(0);
    expect(Number(await inSandbox(orig.sandboxId, grep('fork three')))).toBe(0);

    // Events carry the SDK's messages; the API key is in none of them.
    const evs = await allEvents(id);
    expect(evs.some((e) => e.type === 'system' && e.data.subtype === 'init')).toBe(true);
    expect(evs.filter((e) => e.type === 'turn_complete').map((e) => e.turn)).toEqual([1, 2, 3, 4]);
    expect(JSON.stringify(evs)).not.toContain(KEY);
    expect(JSON.stringify(await allEvents(fid))).not.toContain(KEY);
  }, 600_000);
});
