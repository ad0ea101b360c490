/**
 * Exec sessions and sandbox agent sessions through the public API, against real sandboxes:
 * raw HTTP + WebSocket, and the published OpenComputer client.
 */
import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import path from 'node:path';
import { promisify } from 'node:util';
import { api, control, eventually, T, withMongo } from '../../helpers/env';
import { newSandbox } from '../../helpers/sandboxes';
import { attach, attachReady, getExec, startExec } from '../../helpers/exec';
import { runSdk } from '../../helpers/sdk';

const run = promisify(execFile);
const ROOT = path.resolve(__dirname, '..', '..', '..');

/** A runner speaking the agent JSON-lines protocol without any network (stands in for the SDK runner). */
const FAKE_RUNNER = `
const fs = require('fs');
const cfg = JSON.parse(fs.readFileSync(process.env.SAP_AGENT_CONFIG, 'utf8'));
const emit = (e) => process.stdout.write(JSON.stringify(e) + '\\n');
let model = cfg.model || 'default-model';
let turns = 0;
const sid = cfg.resume || 'fake-session-' + process.pid;
function turn(text) {
  turns++;
  emit({ type: 'system', subtype: 'init', session_id: sid, model });
  emit({ type: 'assistant', session_id: sid, message: { content: [{ type: 'text', text: 'echo: ' + text }] } });
  emit({ type: 'result', subtype: 'success', session_id: sid, result: 'echo: ' + text, num_turns: turns });
  emit({ type: 'turn_complete', session_id: sid });
}
emit({ type: 'ready', options: cfg });
if (cfg.prompt) turn(cfg.prompt);
require('readline').createInterface({ input: process.stdin }).on('line', (line) => {
  const m = JSON.parse(line);
  if (m.type === 'prompt') turn(m.text);
  else if (m.type === 'interrupt') emit({ type: 'interrupted' });
  else if (m.type === 'configure') { if (m.model) model = m.model; emit({ type: 'configured', model }); }
  else emit({ type: 'error', message: 'unknown ' + m.type });
});
`;

let sb: string;

beforeAll(async () => {
  sb = await newSandbox({ envs: { SANDBOX_GREETING: 'hello-from-env' } });
});

afterAll(async () => {
  await api('DELETE', `/api/sandboxes/${sb}`);
});

describe('exec sessions over raw HTTP and WebSocket', () => {
  it('keeps stdout and stderr apart, round-trips stdin, reports the exit code and records it', async () => {
    const es = await startExec(sb, {
      cmd: 'bash',
      args: ['-c', 'echo out; echo err >&2; echo "$SANDBOX_GREETING $MINE"; read l; echo "got $l"; exit 3'],
      envs: { MINE: 'mine' },
    });
    expect(es).toMatchObject({ sandboxID: sb, command: 'bash', running: true, exitCode: null, attachedClients: 0 });
    expect(es.sessionID).toMatch(/^es-[a-z0-9]+$/);
    const a = attach(sb, es.sessionID, { header: true });
    await a.until(() => a.scrollbackDone);
    a.stdin('hello\n');
    const closed = await a.closed;
    expect(closed.code).toBe(1000);
    expect(a.text('stdout')).toBe('out\nhello-from-env mine\ngot hello\n');
    expect(a.text('stderr')).toBe('err\n');
    expect(a.exitCode).toBe(3);
    const kinds = a.frames.map((f) => f.kind);
    expect(kinds.indexOf('scrollback-end')).toBeLessThan(kinds.indexOf('exit'));
    expect(kinds[kinds.length - 1]).toBe('exit');
    const after = await getExec(sb, es.sessionID);
    expect(after).toMatchObject({ running: false, exitCode: 3, attachedClients: 0 });
    expect(Date.parse(after.exitedAt)).toBeGreaterThanOrEqual(Date.parse(after.startedAt));
    const rec = await eventually(() =>
      withMongo((c) =>
        c
          .db()
          .collection('exec_sessions')
          .findOne({ _id: es.sessionID as never, exitCode: 3 }),
      ),
    );
    expect(rec).toMatchObject({ sandboxId: sb, command: 'bash', exitCode: 3 });
    expect(rec.exitedAt).toBeInstanceOf(Date);
    const list = (await api('GET', `/api/sandboxes/${sb}/exec`)).body as { sessionID: string }[];
    expect(list.map((s) => s.sessionID)).toContain(es.sessionID);
  });

  it('runs a short command with exec/run', async () => {
    const r = await api('POST', `/api/sandboxes/${sb}/exec/run`, { body: { cmd: 'sh', args: ['-c', 'cat; echo e >&2; exit 2'], stdin: 'in' } });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ exitCode: 2, stdout: 'in', stderr: 'e\n' });
    const t = await api('POST', `/api/sandboxes/${sb}/exec/run`, { body: { cmd: 'sleep', args: ['30'], timeout: 1 } });
    expect(t.body.exitCode).toBe(137);
  });

  it("writes nothing to a new sandbox's record for its first exec/run (its creation is its last activity)", async () => {
    const fresh = await newSandbox();
    const record = () =>
      withMongo((c) =>
        c
          .db()
          .collection('sandboxes')
          .findOne({ _id: fresh as never }),
      );
    const before = await record();
    expect(before).toMatchObject({ _id: fresh, status: 'running' });
    expect(before!.lastActiveAt).toBeUndefined();
    for (let i = 0; i < 3; i++) expect((await api('POST', `/api/sandboxes/${fresh}/exec/run`, { body: { cmd: 'true' } })).body.exitCode).toBe(0);
    // No event marks a write that was never made, so this negative check has to wait a bound. The
    // write, had one been made, would have been started (not awaited) before the API called the
    // host (services/exec/exec-live.ts, sandboxHost), so it has been in FerretDB's queue for the whole
    // command's run and answer; 300 ms more is many times a one-document write. What makes it hold
    // is the synchronous check in services/sandboxes/sandboxes.ts `touch` (a new sandbox's first minute writes
    // nothing): had it made a write, the comparison below would see lastActiveAt on most runs.
    await new Promise((r) => setTimeout(r, 300));
    expect(await record()).toEqual(before);
    // Another organisation still gets 404, although the owner is known without a lookup.
    const { stdout } = await run(process.execPath, [path.join(ROOT, 'dist/scripts/keys.js'), 'create', '--org', `other-${Date.now()}`], {
      env: { ...process.env, MONGO_URL: T.mongo() },
    });
    const other = (JSON.parse(stdout) as { key: string }).key;
    expect((await api('POST', `/api/sandboxes/${fresh}/exec/run`, { body: { cmd: 'true' }, key: other })).status).toBe(404);
    expect((await api('DELETE', `/api/sandboxes/${fresh}`)).status).toBe(200);
  });

  it('serves two clients at once, counts them exactly, replays scrollback to late and returning clients', async () => {
    const es = await startExec(sb, { cmd: 'bash', args: ['-c', 'echo early; while read l; do echo "echo $l"; done; exit 5'] });
    const a = await attachReady(sb, es.sessionID);
    const b = await attachReady(sb, es.sessionID);
    await a.until(() => a.text('stdout') === 'early\n');
    await b.until(() => b.text('stdout') === 'early\n');
    expect((await getExec(sb, es.sessionID)).attachedClients).toBe(2);
    a.stdin('one\n');
    await a.until(() => a.text('stdout').includes('echo one'));
    await b.until(() => b.text('stdout').includes('echo one'));
    b.ws.close();
    await b.closed;
    await eventually(async () => (await getExec(sb, es.sessionID)).attachedClients === 1, 5000, 20);
    // A late client gets everything so far, in order, before the end-of-scrollback marker.
    const c = attach(sb, es.sessionID);
    await c.until(() => c.scrollbackDone);
    const idx = c.frames.findIndex((f) => f.kind === 'scrollback-end');
    expect(Buffer.concat(c.frames.slice(0, idx).flatMap((f) => (f.kind === 'stdout' ? [f.data] : []))).toString()).toBe('early\necho one\n');
    expect((await getExec(sb, es.sessionID)).attachedClients).toBe(2);
    // Everyone leaves; the command keeps running; a returning client picks up where it was.
    a.ws.close();
    c.ws.close();
    await Promise.all([a.closed, c.closed]);
    await eventually(async () => (await getExec(sb, es.sessionID)).attachedClients === 0, 5000, 20);
    expect((await getExec(sb, es.sessionID)).running).toBe(true);
    const d = await attachReady(sb, es.sessionID);
    expect(d.text('stdout')).toBe('early\necho one\n');
    d.stdin('two\n');
    await d.until(() => d.text('stdout').includes('echo two'));
    d.stdin(''); // an empty stdin frame closes stdin: the loop ends
    expect((await d.closed).code).toBe(1000);
    expect(d.exitCode).toBe(5);
    // A client attaching after the exit gets the scrollback, then the exit code, then the socket closes.
    const e = attach(sb, es.sessionID);
    expect((await e.closed).code).toBe(1000);
    expect(e.text('stdout')).toBe('early\necho one\necho two\n');
    expect(e.frames.map((f) => f.kind).slice(-2)).toEqual(['scrollback-end', 'exit']);
    expect(e.exitCode).toBe(5);
  });

  it('kills a command maxRunAfterDisconnect seconds after its last client left, unless one returns', async () => {
    // sleep 120 ends by itself only after 120 s: a SIGKILL (137) before that is the limit's.
    const es = await startExec(sb, { cmd: 'sleep', args: ['120'], maxRunAfterDisconnect: 1 });
    const a = await attachReady(sb, es.sessionID);
    const leftAt = Date.now();
    a.ws.close();
    await a.closed;
    const ended = await eventually(
      async () => {
        const e = await getExec(sb, es.sessionID);
        return e.running === false ? e : undefined;
      },
      30_000,
      50,
    );
    expect(ended.exitCode).toBe(137);
    // Not before the limit: the host starts its 1 s count when it sees the client leave, after leftAt
    // (2 ms: both clocks' millisecond rounding).
    expect(Date.parse(ended.exitedAt) - leftAt).toBeGreaterThanOrEqual(1000 - 2);

    // `kept` is left, then rejoined; `alone`, with the same limit, is left after `kept` and stays
    // alone. Once `alone` has been killed, `kept`'s count, started first, would have run out too.
    const kept = await startExec(sb, { cmd: 'sleep', args: ['120'], maxRunAfterDisconnect: 5 });
    const alone = await startExec(sb, { cmd: 'sleep', args: ['120'], maxRunAfterDisconnect: 5 });
    const b = await attachReady(sb, kept.sessionID);
    const d = await attachReady(sb, alone.sessionID);
    b.ws.close();
    await eventually(async () => (await getExec(sb, kept.sessionID)).attachedClients === 0, 30_000, 20);
    const c = await attachReady(sb, kept.sessionID);
    d.ws.close();
    const aloneEnded = await eventually(
      async () => {
        const e = await getExec(sb, alone.sessionID);
        return e.running === false ? e : undefined;
      },
      30_000,
      50,
    );
    expect(aloneEnded.exitCode).toBe(137);
    expect(await getExec(sb, kept.sessionID)).toMatchObject({ running: true, attachedClients: 1 });
    c.ws.close();
    const killed = await api('POST', `/api/sandboxes/${sb}/exec/${kept.sessionID}/kill`, { body: { signal: 'SIGTERM' } });
    expect(killed.body).toMatchObject({ running: false, exitCode: 143 });
  });

  it('kills a command after its timeout', async () => {
    const es = await startExec(sb, { cmd: 'sleep', args: ['120'], timeout: 1 });
    const a = attach(sb, es.sessionID);
    await a.closed;
    expect(a.exitCode).toBe(137);
    expect(await getExec(sb, es.sessionID)).toMatchObject({ running: false, exitCode: 137 });
  });

  it('passes 6 MB of stdin intact, sent all at once on attach', async () => {
    const input = randomBytes(6 * 1024 * 1024);
    const es = await startExec(sb, { cmd: 'sha256sum' });
    const a = attach(sb, es.sessionID);
    await a.opened;
    for (let i = 0; i < input.length; i += 256 * 1024) a.stdin(input.subarray(i, i + 256 * 1024));
    a.ws.send(Buffer.from([0x00]));
    await a.closed;
    expect(a.text('stdout').split(' ')[0]).toBe(createHash('sha256').update(input).digest('hex'));
    expect(a.exitCode).toBe(0);
  });

  it('delivers 50 MB of output intact to a slow client', async () => {
    const made = await api('POST', `/api/sandboxes/${sb}/exec/run`, {
      body: { cmd: 'sh', args: ['-c', 'head -c 52428800 /dev/urandom > /workspace/big && sha256sum /workspace/big'] },
    });
    expect(made.body.exitCode).toBe(0);
    const want = made.body.stdout.split(' ')[0];
    const es = await startExec(sb, { cmd: 'sh', args: ['-c', 'read go; cat /workspace/big'] });
    const a = attach(sb, es.sessionID);
    await a.until(() => a.scrollbackDone);
    const hash = createHash('sha256');
    let bytes = 0;
    a.ws.on('message', (d: Buffer) => {
      if (d[0] === 0x01) {
        hash.update(d.subarray(1));
        bytes += d.length - 1;
      }
    });
    a.stdin('go\n');
    // Stop reading for a while: the command must wait, not the API's memory grow without bound.
    await a.until(() => bytes > 0);
    a.ws.pause();
    // The event: `cat` asleep in a write to its output (write, sendfile, splice or copy_file_range:
    // x86-64 numbers 1, 40, 275, 326 in /proc/<pid>/syscall), held back by the paused client.
    const catBlockedInWrite = async () => {
      const r = await api('POST', `/api/sandboxes/${sb}/exec/run`, {
        body: {
          cmd: 'sh',
          args: ['-c', 'for d in /proc/[0-9]*; do read c < $d/comm 2>/dev/null || continue; [ "$c" = cat ] && read n rest < $d/syscall && echo $n; done'],
        },
      });
      return ['1', '40', '275', '326'].includes(String(r.body.stdout).trim());
    };
    await eventually(catBlockedInWrite, 60_000, 100);
    expect((await getExec(sb, es.sessionID)).running).toBe(true);
    expect(bytes).toBeLessThan(52428800);
    a.ws.resume();
    await a.closed;
    expect(bytes).toBe(52428800);
    expect(hash.digest('hex')).toBe(want);
    expect(a.exitCode).toBe(0);
    await api('POST', `/api/sandboxes/${sb}/exec/run`, { body: { cmd: 'rm', args: ['/workspace/big'] } });
  }, 120_000);

  it('refuses other organisations, bad keys, bad ids and bad frames', async () => {
    const es = await startExec(sb, { cmd: 'bash', args: ['-c', 'while read l; do echo "$l"; done'] });
    const { stdout } = await run(process.execPath, [path.join(ROOT, 'dist/scripts/keys.js'), 'create', '--org', `other-${Date.now()}`], {
      env: { ...process.env, MONGO_URL: T.mongo() },
    });
    const other = (JSON.parse(stdout) as { key: string }).key;
    expect((await api('GET', `/api/sandboxes/${sb}/exec`, { key: other })).status).toBe(404);
    expect((await api('GET', `/api/sandboxes/${sb}/exec/${es.sessionID}`, { key: other })).status).toBe(404);
    expect((await api('POST', `/api/sandboxes/${sb}/exec`, { key: other, body: { cmd: 'true' } })).status).toBe(404);
    expect((await api('POST', `/api/sandboxes/${sb}/exec/${es.sessionID}/kill`, { key: other, body: {} })).status).toBe(404);
    expect((await api('POST', `/api/sandboxes/${sb}/exec/run`, { key: other, body: { cmd: 'true' } })).status).toBe(404);
    expect((await api('GET', `/api/sandboxes/${sb}/exec`, { key: null })).status).toBe(401);

    const refusals: [ReturnType<typeof attach>, string][] = [
      [attach(sb, es.sessionID, { key: other }), 'not_found'],
      [attach(sb, es.sessionID, { key: 'wrong-key' }), 'unauthorized'],
      [attach(sb, es.sessionID, { key: null }), 'unauthorized'],
      [attach(sb, 'es-doesnotexist'), 'not_found'],
      [attach(sb, 'not-an-id'), 'invalid_request'],
      [attach('sb-doesnotexist', es.sessionID), 'not_found'],
    ];
    for (const [a, type] of refusals) {
      const closed = await a.closed;
      expect([closed.code, JSON.parse(a.texts[0] ?? '{}').error?.type]).toEqual([1008, type]);
      expect(a.frames).toEqual([]);
    }

    expect((await api('GET', `/api/sandboxes/${sb}/exec/not-an-id`)).status).toBe(400);
    expect((await api('GET', `/api/sandboxes/${sb}/exec/es-doesnotexist`)).status).toBe(404);
    expect((await api('POST', '/api/sandboxes/sb-doesnotexist/exec', { body: { cmd: 'true' } })).status).toBe(404);
    for (const body of [{}, { cmd: '' }, { cmd: 'x', args: 'nope' }, { cmd: 'x', timeout: -1 }, { cmd: 'x', envs: { 'A B': '1' } }, { cmd: 'x', cwd: 'rel' }]) {
      const r = await api('POST', `/api/sandboxes/${sb}/exec`, { body });
      expect([r.status, r.body.error?.type]).toEqual([400, 'invalid_request']);
    }
    expect((await api('POST', `/api/sandboxes/${sb}/exec/${es.sessionID}/kill`, { body: { signal: 'SIGNOPE' } })).status).toBe(400);

    // Bad frames close the offending client (1003); the command keeps running for the others.
    const good = await attachReady(sb, es.sessionID);
    for (const bad of [(ws: import('ws').WebSocket) => ws.send('text frame'), (ws: import('ws').WebSocket) => ws.send(Buffer.from([0x07, 1, 2]))]) {
      const b = await attachReady(sb, es.sessionID);
      bad(b.ws);
      const closed = await b.closed;
      expect(closed.code).toBe(1003);
      expect(JSON.parse(b.texts[0]!).error.type).toBe('invalid_request');
    }
    good.stdin('still here\n');
    await good.until(() => good.text('stdout').includes('still here'));
    await eventually(async () => (await getExec(sb, es.sessionID)).attachedClients === 1, 5000, 20);
    good.ws.close();
    await api('POST', `/api/sandboxes/${sb}/exec/${es.sessionID}/kill`, { body: {} });
  });

  it('keeps commands running across an API restart; clients attach again', async () => {
    const es = await startExec(sb, { cmd: 'bash', args: ['-c', 'echo before; while read l; do echo "after $l"; done'] });
    const a = await attachReady(sb, es.sessionID);
    await control('kill', 'api');
    const closed = await a.closed;
    expect(closed.code).not.toBe(1000);
    await control('start', 'api');
    const b = await eventually(
      async () => {
        const x = attach(sb, es.sessionID);
        await x.until(() => x.scrollbackDone, 5000);
        return x;
      },
      30_000,
      200,
    );
    expect(b.text('stdout')).toBe('before\n');
    expect(await getExec(sb, es.sessionID)).toMatchObject({ running: true, attachedClients: 1 });
    b.stdin('restart\n');
    await b.until(() => b.text('stdout').includes('after restart'));
    const killed = await api('POST', `/api/sandboxes/${sb}/exec/${es.sessionID}/kill`, { body: { signal: 9 } });
    expect(killed.body).toMatchObject({ running: false, exitCode: 137 });
    await b.closed;
    expect(b.exitCode).toBe(137);
  }, 90_000);
});

describe('exec sessions with the published OpenComputer client', () => {
  it('start, attach, list, run and kill', async () => {
    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      const dec = new TextDecoder();
      let stdout = '', stderr = '', scroll = 0;
      const s = await sb.exec.start('bash', {
        args: ['-c', 'echo hi; echo oops >&2; read l; echo "got $l"; exit 7'],
        onStdout: (d) => { stdout += dec.decode(d); },
        onStderr: (d) => { stderr += dec.decode(d); },
        onScrollbackEnd: () => { scroll++; },
      });
      // The command is waiting for its line once it has written what comes before the read.
      for (const t0 = Date.now(); !(stdout.includes('hi') && stderr.includes('oops')) && Date.now() - t0 < 10000; ) await new Promise((r) => setTimeout(r, 20));
      s.sendStdin('sdk\\n');
      const code = await s.done;
      let late = '';
      const again = await sb.exec.attach(s.sessionId, { onStdout: (d) => { late += dec.decode(d); } });
      const lateCode = await again.done;
      const list = await sb.exec.list();
      const ran = await sb.exec.run('echo ran; exit 4');
      const long = await sb.exec.start('sleep', { args: ['60'] });
      await long.kill(15);
      const afterKill = (await sb.exec.list()).find((x) => x.sessionID === long.sessionId);
      const longCode = await long.done;
      out({ out: stdout, err: stderr, code, scroll, late, lateCode, listed: list.some((x) => x.sessionID === s.sessionId && x.exitCode === 7 && !x.running), ran, afterKill, longCode });
    `,
      { SB: sb },
    );
    expect(r).toMatchObject({ out: 'hi\ngot sdk\n', err: 'oops\n', code: 7, scroll: 1, late: 'hi\ngot sdk\n', lateCode: 7, listed: true });
    expect(r.ran).toEqual({ exitCode: 4, stdout: 'ran\n', stderr: '' });
    expect(r.afterKill).toMatchObject({ running: false, exitCode: 143 });
    expect(r.longCode).toBe(143);
  });
});

describe('sandbox agent sessions', () => {
  it('runs a runner speaking JSON lines; agentSessionID follows what it reports; the client attaches and talks to it', async () => {
    const created = await api('POST', `/api/sandboxes/${sb}/agent`, {
      body: {
        prompt: 'first',
        model: 'test-model',
        maxTurns: 3,
        allowedTools: ['Read'],
        permissionMode: 'acceptEdits',
        mcpServers: { fs: { command: 'fs-server', args: ['-v'] } },
        runner: ['node', '-e', FAKE_RUNNER],
      },
    });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ sandboxID: sb, running: true, agentSessionID: '' });
    expect(created.body.sessionID).toMatch(/^as-[a-z0-9]+$/);
    expect(Number.isNaN(Date.parse(created.body.startedAt))).toBe(false);
    const id = created.body.sessionID as string;
    const got = await eventually(
      async () => {
        const r = await api('GET', `/api/sandboxes/${sb}/agent/${id}`);
        return r.body.agentSessionID ? r.body : undefined;
      },
      15_000,
      100,
    );
    expect(got.agentSessionID).toMatch(/^fake-session-\d+$/);

    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      const events = [];
      let turns = 0;
      const done = new Promise((resolve) => {
        (async () => {
          const s = await sb.agent.attach(process.env.AS, {
            onEvent: (e) => {
              events.push(e);
              if (e.type === 'turn_complete') {
                turns++;
                if (turns === 1) { s.configure({ model: 'other-model' }); s.sendPrompt('second'); }
                if (turns === 2) { s.interrupt(); }
              }
              if (e.type === 'interrupted') s.kill().then(() => s.done).then(resolve);
            },
          });
        })();
      });
      const code = await done;
      const list = await sb.agent.list();
      out({ events, code, list });
    `,
      { SB: sb, AS: id },
    );
    const types = (r.events as { type: string }[]).map((e) => e.type);
    expect(types).toEqual([
      'ready',
      'system',
      'assistant',
      'result',
      'turn_complete',
      'configured',
      'system',
      'assistant',
      'result',
      'turn_complete',
      'interrupted',
    ]);
    const ready = r.events[0];
    expect(ready.options).toEqual({
      prompt: 'first',
      model: 'test-model',
      maxTurns: 3,
      allowedTools: ['Read'],
      permissionMode: 'acceptEdits',
      mcpServers: { fs: { command: 'fs-server', args: ['-v'] } },
    });
    expect(r.events[2].message.content[0].text).toBe('echo: first');
    expect(r.events[6].model).toBe('other-model');
    expect(r.events[7].message.content[0].text).toBe('echo: second');
    expect(r.code).toBe(137);
    const listed = (r.list as { sessionID: string; running: boolean; agentSessionID: string }[]).find((s) => s.sessionID === id);
    expect(listed).toMatchObject({ running: false, agentSessionID: got.agentSessionID });
  });

  it('passes resume through; kill answers with the stopped session; other organisations cannot see it', async () => {
    const created = await api('POST', `/api/sandboxes/${sb}/agent`, { body: { resume: 'earlier-session', runner: ['node', '-e', FAKE_RUNNER], prompt: 'p' } });
    const id = created.body.sessionID as string;
    const got = await eventually(
      async () => {
        const r = await api('GET', `/api/sandboxes/${sb}/agent/${id}`);
        return r.body.agentSessionID ? r.body : undefined;
      },
      15_000,
      100,
    );
    expect(got.agentSessionID).toBe('earlier-session');
    const killed = await api('POST', `/api/sandboxes/${sb}/agent/${id}/kill`, { body: {} });
    expect(killed.body).toMatchObject({ sessionID: id, running: false, agentSessionID: 'earlier-session', exitCode: 137 });
    expect((await api('GET', `/api/sandboxes/${sb}/agent/as-doesnotexist`)).status).toBe(404);
    expect((await api('POST', `/api/sandboxes/${sb}/agent`, { body: { maxTurns: 0 } })).status).toBe(400);
    expect((await api('POST', `/api/sandboxes/${sb}/agent`, { body: { permissionMode: 'yolo' } })).status).toBe(400);
    expect((await api('POST', `/api/sandboxes/${sb}/agent`, { body: { mcpServers: { x: {} } } })).status).toBe(400);
  });
});
