/**
 * The default agent runner on the real Claude Agent SDK (the one scripts/toolchain.sh installs and
 * every sandbox sees at /opt/sap/node_modules), end to end against a fake Anthropic Messages API
 * (test/helpers/fake-anthropic.js) served from a test host: a network namespace of this test's own
 * at an address of 198.18.0.0/15, reached through the sandbox's egress. The sandbox's
 * ANTHROPIC_BASE_URL points there, and its ANTHROPIC_API_KEY comes from a secret store: the fake
 * answers 401 to any other key, so the turn completes only if the store's value arrived.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { api, eventually } from '../../helpers/env';
import { newSandbox, run } from '../../helpers/sandboxes';
import { attachReady, type Attached } from '../../helpers/exec';
import { runSdk } from '../../helpers/sdk';
import { TestHost } from '../../helpers/test-host';
import { startFakeMessagesApi } from '../../helpers/fake-messages-api';
import { FakeDns } from '../../helpers/fake-dns';

const FAKE_PORT = 8080;
const FAKE_LOG = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'sap-fake-anthropic-')), 'requests.ndjson');
const KEY = `sk-ant-test-${randomBytes(12).toString('hex')}`;
const STORE = `agent-sdk-${randomBytes(4).toString('hex')}`;

type Event = { type: string; [k: string]: any };

let sb: string;
let testHost: TestHost | undefined;
/**
 * The sandbox resolver's upstream, answering NXDOMAIN for every name as a network without the
 * internet does. Without it no upstream answers at all, and every name Claude Code looks up at start
 * (its non-essential traffic: telemetry, error reports) waits out the resolver (~6 s per agent start).
 */
const dns = new FakeDns();

/** The requests the fake has received (one JSON line each). */
function fakeLog(): { method: string; path: string; keyOk: boolean; auth: string; body: { stream?: boolean } }[] {
  const text = fs.existsSync(FAKE_LOG) ? fs.readFileSync(FAKE_LOG, 'utf8') : '';
  return text
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l));
}

/** The JSON events an agent session has printed so far. */
function events(a: Attached): Event[] {
  return a
    .text('stdout')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as Event);
}

/** The texts of the assistant messages among `evs`. */
function assistantTexts(evs: Event[]): string[] {
  return evs
    .filter((e) => e.type === 'assistant')
    .flatMap((e) => (e.message?.content ?? []) as { type: string; text?: string }[])
    .filter((b) => b.type === 'text')
    .map((b) => b.text ?? '');
}

/** Tool results the SDK fed back to the model (the `user` events carrying tool_result blocks). */
function toolResults(evs: Event[]): { content: unknown; is_error?: boolean }[] {
  return evs
    .filter((e) => e.type === 'user' && Array.isArray(e.message?.content))
    .flatMap((e) => e.message.content as { type: string; content: unknown; is_error?: boolean }[])
    .filter((b) => b.type === 'tool_result');
}

/** `bash -c script` in the file's sandbox: { exitCode, stdout, stderr }. */
const runSh = (script: string) => run(sb, script, { timeout: 30 });

const countOf = (a: Attached, type: string) => events(a).filter((e) => e.type === type).length;

/** Starts an agent session with the default runner and attaches to it. */
async function startAgent(body: Record<string, unknown>): Promise<{ id: string; a: Attached; t0: number }> {
  const t0 = Date.now();
  const r = await api('POST', `/api/sandboxes/${sb}/agent`, { body });
  if (r.status !== 201) throw new Error(`create agent session: ${r.status} ${JSON.stringify(r.body)}`);
  return { id: r.body.sessionID as string, a: await attachReady(sb, r.body.sessionID as string), t0 };
}

async function stopAgent(id: string, a: Attached): Promise<void> {
  a.ws.close();
  await api('POST', `/api/sandboxes/${sb}/agent/${id}/kill`, { body: {} });
}

beforeAll(async () => {
  await dns.listen();
  testHost = new TestHost('198.18');
  await startFakeMessagesApi(testHost, { port: FAKE_PORT, log: FAKE_LOG, key: KEY });
  const store = await api('POST', '/api/secret-stores', { body: { name: STORE } });
  expect(store.status).toBe(201);
  expect((await api('PUT', `/api/secret-stores/${STORE}/secrets/ANTHROPIC_API_KEY`, { body: { value: KEY } })).status).toBe(200);
  sb = await newSandbox({ secretStore: STORE, envs: { ANTHROPIC_BASE_URL: `http://${testHost.addr}:${FAKE_PORT}` } });
}, 60_000);

afterAll(async () => {
  if (sb) await api('DELETE', `/api/sandboxes/${sb}`);
  await api('DELETE', `/api/secret-stores/${STORE}`);
  testHost?.remove();
  await dns.close();
  fs.rmSync(path.dirname(FAKE_LOG), { recursive: true, force: true });
});

describe('the default agent runner on the Claude Agent SDK', () => {
  it('answers a prompt through the fake API, streams the SDK events, ends its turn, and continues the conversation', async () => {
    const { id, a, t0 } = await startAgent({ prompt: 'hello there', model: 'claude-sonnet-4-5' });
    try {
      let firstSdkEvent = 0;
      await a.until(() => {
        if (!firstSdkEvent && events(a).some((e) => e.type === 'system')) firstSdkEvent = Date.now();
        return countOf(a, 'turn_complete') >= 1;
      }, 90_000);
      const turnEnd = Date.now();
      // Figures for the README (never asserted: the machine is noisy).
      process.stdout.write(`agent-sdk timing: start → first SDK event ${firstSdkEvent - t0} ms, start → turn end ${turnEnd - t0} ms\n`);

      const evs = events(a);
      expect(evs[0]).toEqual({ type: 'ready' });
      const init = evs.find((e) => e.type === 'system' && e.subtype === 'init')!;
      expect(init).toMatchObject({ model: 'claude-sonnet-4-5', cwd: '/workspace' });
      expect(typeof init.session_id).toBe('string');
      expect(assistantTexts(evs)).toContain('You said: hello there. Earlier: (nothing)');
      const result = evs.find((e) => e.type === 'result')!;
      expect(result).toMatchObject({ subtype: 'success', is_error: false, result: 'You said: hello there. Earlier: (nothing)', session_id: init.session_id });
      expect(evs[evs.length - 1]).toEqual({ type: 'turn_complete', session_id: init.session_id });
      const state = await eventually(async () => {
        const r = await api('GET', `/api/sandboxes/${sb}/agent/${id}`);
        return r.body.agentSessionID ? r.body : undefined;
      }, 15_000);
      expect(state.agentSessionID).toBe(init.session_id);

      // A second prompt on stdin resumes the same conversation: the fake sees the first message.
      a.stdin(`${JSON.stringify({ type: 'prompt', text: 'second question' })}\n`);
      await a.until(() => countOf(a, 'turn_complete') >= 2, 90_000);
      expect(assistantTexts(events(a))).toContain('You said: second question. Earlier: hello there');

      // The fake got streaming requests, every one with the store's key; the key is in no answer or event.
      const log = fakeLog();
      expect(log.some((r) => r.path === '/v1/messages' && r.body.stream === true)).toBe(true);
      expect(log.filter((r) => r.path.startsWith('/v1/')).length).toBeGreaterThan(0);
      expect(log.filter((r) => !r.keyOk).map((r) => `${r.method} ${r.path} ${r.auth}`)).toEqual([]);
      expect(a.text('stdout')).not.toContain(KEY);
      expect(JSON.stringify((await api('GET', `/api/sandboxes/${sb}`)).body)).not.toContain(KEY);
      expect(JSON.stringify((await api('GET', `/api/sandboxes/${sb}/agent/${id}`)).body)).not.toContain(KEY);
    } finally {
      await stopAgent(id, a);
    }

    // `resume` in a new agent session continues that conversation too.
    const first = (await api('GET', `/api/sandboxes/${sb}/agent/${id}`)).body.agentSessionID as string;
    const again = await startAgent({ prompt: 'third', resume: first });
    try {
      await again.a.until(() => countOf(again.a, 'turn_complete') >= 1, 90_000);
      const evs = events(again.a);
      expect(assistantTexts(evs)).toContain('You said: third. Earlier: hello there | second question');
      expect(evs.find((e) => e.type === 'result')).toMatchObject({ session_id: first });
    } finally {
      await stopAgent(again.id, again.a);
    }
  }, 240_000);

  it('interrupt ends a turn that is still streaming with `interrupted`; the session then takes the next prompt', async () => {
    const { id, a } = await startAgent({ prompt: 'tell a long story [slow]' });
    try {
      // The fake has begun streaming the slow answer (about a minute long) once it logged the turn's
      // request: the one that offers tools (Claude Code's side request for a title offers none).
      await eventually(
        async () => fakeLog().some((r) => JSON.stringify(r.body).includes('long story') && JSON.stringify(r.body).includes('"tools":[{')),
        90_000,
        200,
      );
      a.stdin(`${JSON.stringify({ type: 'interrupt' })}\n`);
      await a.until(() => countOf(a, 'turn_complete') >= 1, 30_000);
      const evs = events(a);
      const types = evs.map((e) => e.type);
      expect(types).toContain('interrupted');
      expect(types.indexOf('interrupted')).toBeLessThan(types.indexOf('turn_complete'));
      // The long answer never completed.
      expect(assistantTexts(evs).some((t) => t.includes('word599'))).toBe(false);
      expect(evs.some((e) => e.type === 'result' && e.subtype === 'success')).toBe(false);

      a.stdin(`${JSON.stringify({ type: 'prompt', text: 'after the interrupt' })}\n`);
      await a.until(() => countOf(a, 'turn_complete') >= 2, 90_000);
      expect(assistantTexts(events(a)).some((t) => t.startsWith('You said: after the interrupt.'))).toBe(true);
    } finally {
      await stopAgent(id, a);
    }
  }, 240_000);

  it('allowedTools: a listed tool runs; a tool not listed is not available to the model', async () => {
    const ask = (file: string) => `please [tool Bash {"command":"echo made > /workspace/${file}; echo wrote-${file}"}]`;
    const allowed = await startAgent({ prompt: ask('allowed.txt'), allowedTools: ['Bash', 'Read'] });
    try {
      await allowed.a.until(() => countOf(allowed.a, 'turn_complete') >= 1, 90_000);
      const evs = events(allowed.a);
      expect(toolResults(evs)).toEqual([expect.objectContaining({ content: 'wrote-allowed.txt', is_error: false })]);
      expect(assistantTexts(evs)).toContain('tool result (ok: wrote-allowed.txt)');
    } finally {
      await stopAgent(allowed.id, allowed.a);
    }
    expect((await runSh('cat /workspace/allowed.txt')).stdout).toBe('made\n');

    const refused = await startAgent({ prompt: ask('refused.txt'), allowedTools: ['Read'] });
    try {
      await refused.a.until(() => countOf(refused.a, 'turn_complete') >= 1, 90_000);
      const evs = events(refused.a);
      const init = evs.find((e) => e.type === 'system' && e.subtype === 'init')!;
      expect(init.tools).toContain('Read');
      expect(init.tools).not.toContain('Bash');
      const results = toolResults(evs);
      expect(results).toHaveLength(1);
      expect(results[0]).toMatchObject({ is_error: true, content: expect.stringContaining('No such tool available: Bash') });
    } finally {
      await stopAgent(refused.id, refused.a);
    }
    expect((await runSh('test -e /workspace/refused.txt; echo $?')).stdout).toBe('1\n');
  }, 240_000);

  it('starts through the published client and ends its turn with the answer', async () => {
    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      const events = [];
      const s = await sb.agent.start({ prompt: 'from the client', model: 'claude-sonnet-4-5', onEvent: (e) => {
        events.push(e);
        if (e.type === 'turn_complete') s.kill();
      } });
      const code = await s.done;
      out({ events, code, id: s.sessionId });
    `,
      { SB: sb },
    );
    expect(r.id).toMatch(/^as-/);
    const evs = r.events as Event[];
    expect(evs[0]).toEqual({ type: 'ready' });
    expect(assistantTexts(evs)).toContain('You said: from the client. Earlier: (nothing)');
    expect(evs[evs.length - 1].type).toBe('turn_complete');
  }, 240_000);
});
