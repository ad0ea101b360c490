import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { SapApiError, SapClient } from '../../../client';
import { eventually, T, unique } from '../../helpers/env';

const CLI = path.join(__dirname, '..', '..', '..', 'dist', 'cli', 'main.js');
const COPY = 'cat "$AGENT_INPUT_PATH" > /tmp/agent_result.json';

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Runs the CLI as a real process; `whileRunning` may interrupt it. */
function sap(args: string[], opts: { env?: Record<string, string>; whileRunning?: (p: ReturnType<typeof spawn>) => void } = {}): Promise<Run> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [CLI, ...args], {
      env: { ...process.env, SAP_API_URL: T.api(), SAP_API_KEY: T.key(), ...opts.env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    p.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    p.on('exit', (code, signal) => resolve({ code, signal, stdout, stderr }));
    opts.whileRunning?.(p);
  });
}

const client = () => new SapClient({ url: T.api(), apiKey: T.key() });
/** Scratch directories of this file's tests, removed after them. */
const scratch: string[] = [];
const tmp = () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sap-cli-'));
  scratch.push(dir);
  return dir;
};
afterAll(() => {
  for (const dir of scratch) fs.rmSync(dir, { recursive: true, force: true });
});

describe('typed client', () => {
  it('answers typed values, and error answers as SapApiError carrying the error body', async () => {
    const c = client();
    const agent = await c.agents.create({ id: unique('cl'), core: 'bash', entrypoint: ['bash', '-c', COPY] });
    expect(agent.core).toBe('bash');
    const { session, result } = await c.sessions.run(agent.id, { input: { hello: 'world' } });
    expect(session.status).toBe('completed');
    expect(result.data).toEqual({ hello: 'world' });
    const err = await c.agents.get('no-such-agent-here').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SapApiError);
    expect((err as SapApiError).status).toBe(404);
    expect((err as SapApiError).body.error.type).toBe('not_found');
    const bad = await c.batches.create(agent.id, { items: [] }).catch((e: unknown) => e);
    expect((bad as SapApiError).body.error).toMatchObject({ type: 'invalid_request' });
    const b = await c.batches.create(agent.id, { items: [{ input: { a: 1 } }, { input: { a: 2 } }] }, { ndjson: true });
    const lines = [];
    for await (const l of c.followBatch(agent.id, b.id, { pollMs: 200 })) lines.push(l);
    expect(lines.map((l) => l.data)).toEqual([{ a: 1 }, { a: 2 }]);
    expect((await c.batches.getById(b.id)).status).toBe('completed');
  }, 60_000);
});

describe('sap CLI', () => {
  it('creates and lists agents, runs a session and prints its result', async () => {
    const dir = tmp();
    const id = unique('cli');
    fs.writeFileSync(path.join(dir, 'agent.json'), JSON.stringify({ id, core: 'bash', entrypoint: ['bash', '-c', COPY] }));
    const created = await sap(['agents', 'create', '-f', path.join(dir, 'agent.json')]);
    expect(created.code).toBe(0);
    expect(JSON.parse(created.stdout)).toMatchObject({ id, core: 'bash' });
    const listed = await sap(['agents', 'list']);
    expect(listed.code).toBe(0);
    expect((JSON.parse(listed.stdout) as { id: string }[]).map((a) => a.id)).toContain(id);
    const run = await sap(['sessions', 'run', id, '--input', '{"x":42}']);
    expect(run.code).toBe(0);
    expect(JSON.parse(run.stdout)).toMatchObject({ status: 'completed', data: { x: 42 } });
  }, 60_000);

  it("prints a session's logs, and lists an agent's failed sessions", async () => {
    const id = unique('clil');
    await client().agents.create({
      id,
      core: 'bash',
      entrypoint: ['bash', '-c', 'echo "to stdout"; sleep 1; echo "why: $(cat "$AGENT_INPUT_PATH")" >&2; test -n "$(grep ok "$AGENT_INPUT_PATH")"'],
    });
    const failed = JSON.parse((await sap(['sessions', 'run', id, '--input', '{"v":"bad"}'])).stdout) as { session_id: string; status: string };
    const ok = JSON.parse((await sap(['sessions', 'run', id, '--input', '{"v":"ok"}'])).stdout) as { session_id: string; status: string };
    expect([failed.status, ok.status]).toEqual(['failed', 'completed']);
    const logs = await sap(['sessions', 'logs', id, failed.session_id]);
    expect(logs.code).toBe(0);
    expect(logs.stdout).toBe('to stdout\nwhy: {"v":"bad"}\n');
    expect((await sap(['sessions', 'logs', id, failed.session_id, '--stream', 'stderr'])).stdout).toBe('why: {"v":"bad"}\n');
    const list = await sap(['sessions', 'list', id, '--status', 'failed']);
    expect(list.code).toBe(0);
    const rows = list.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { id: string; status: string; outcome: { message: string } });
    expect(rows.map((r) => [r.id, r.status])).toEqual([[failed.session_id, 'failed']]);
    expect(rows[0]!.outcome.message).toContain('why: {"v":"bad"}');
    expect((await sap(['sessions', 'list', id, '--status', 'sideways'])).code).toBe(1);
  }, 60_000);

  it('prints the error body and exits non-zero on an error answer; a missing key is a usage error', async () => {
    const bad = await sap(['agents', 'list'], { env: { SAP_API_KEY: 'not-a-key' } });
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain('"type":"unauthorized"');
    const missing = await sap(['sessions', 'run', 'no-such-agent-zz']);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain('"type":"not_found"');
    const nokey = await sap(['agents', 'list'], { env: { SAP_API_KEY: '' } });
    expect(nokey.code).toBe(1);
    expect(nokey.stderr).toContain('no API key');
  }, 30_000);

  it('batch run shows progress, writes results as they finish, and resumes after an interruption with nothing lost or duplicated', async () => {
    const dir = tmp();
    const id = unique('clib');
    await client().agents.create({ id, core: 'bash', entrypoint: ['bash', '-c', `sleep 1; ${COPY}`] });
    const n = 20;
    const itemsFile = path.join(dir, 'items.jsonl');
    fs.writeFileSync(itemsFile, Array.from({ length: n }, (_, i) => JSON.stringify({ input: { i } })).join('\n') + '\n');
    const out = path.join(dir, 'results.jsonl');
    const args = ['batch', 'run', id, itemsFile, '--concurrency', '4', '--out', out];

    const first = await sap(args, {
      whileRunning: (p) => {
        void eventually(async () => fs.existsSync(out) && fs.readFileSync(out, 'utf8').split('\n').filter(Boolean).length >= 4, 60_000, 100).then(() =>
          p.kill('SIGINT'),
        );
      },
    });
    expect(first.code).toBe(130);
    expect(first.stderr).toMatch(/batch batch_[a-z0-9]+: 20 items, concurrency 4/);
    expect(first.stderr).toMatch(/\d+\/20 done \| \d+ failed \| \d+ running \| [\d.]+\/s \| ETA/);
    expect(first.stderr).toContain('interrupted');
    const before = fs.readFileSync(out, 'utf8').split('\n').filter(Boolean).length;
    expect(before).toBeGreaterThanOrEqual(4);
    expect(before).toBeLessThan(n);
    // A line cut short by a harder interruption is dropped and written again.
    fs.appendFileSync(out, '{"index":');

    const second = await sap(args);
    expect(second.stderr).toContain('attaching to batch_');
    expect(second.code).toBe(0);
    expect(second.stderr).toMatch(/completed: 20 completed, 0 failed/);
    const lines = fs
      .readFileSync(out, 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as { index: number; status: string; data: { i: number } });
    expect(lines.map((l) => l.index)).toEqual(Array.from({ length: n }, (_, i) => i));
    expect(lines.every((l) => l.status === 'completed' && l.data.i === l.index)).toBe(true);
    const marker = JSON.parse(fs.readFileSync(`${out}.batch`, 'utf8')) as { batch_id: string };
    // One batch only: the rerun attached to the first.
    const batches = await client().batches.list(id);
    expect(batches.items.map((b) => b.id)).toEqual([marker.batch_id]);

    const status = await sap(['batch', 'status', marker.batch_id]);
    expect(status.code).toBe(0);
    expect(JSON.parse(status.stdout)).toMatchObject({ id: marker.batch_id, status: 'completed', counts: { completed: n } });
  }, 180_000);

  it('batch run ends with the failures grouped by reason and the first line of their messages', async () => {
    const dir = tmp();
    const id = unique('clif');
    // Items with "bad" fail with exit 3 and a two-line stderr; items with "slow" time out; the rest complete.
    await client().agents.create({
      id,
      core: 'bash',
      timeoutSeconds: 1,
      entrypoint: [
        'bash',
        '-c',
        `grep -q slow "$AGENT_INPUT_PATH" && sleep 30; if grep -q bad "$AGENT_INPUT_PATH"; then printf 'bad input\\nsecond line\\n' >&2; exit 3; fi; ${COPY}`,
      ],
    });
    const itemsFile = path.join(dir, 'items.jsonl');
    const items = [{ k: 'bad' }, { k: 'ok' }, { k: 'bad' }, { k: 'slow' }, { k: 'ok' }];
    fs.writeFileSync(itemsFile, items.map((input) => JSON.stringify({ input })).join('\n') + '\n');
    const r = await sap(['batch', 'run', id, itemsFile, '--concurrency', '5', '--out', path.join(dir, 'results.jsonl')]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/completed: 2 completed, 3 failed/);
    const summary = r.stderr.slice(r.stderr.indexOf('failures by reason'));
    expect(summary).toBe(
      'failures by reason (3):\n' +
        '  exit_code: 2\n' +
        '    2 × entrypoint exited with code 3; stderr: bad input\n' +
        '  timeout: 1\n' +
        '    1 × entrypoint exceeded the agent timeout\n',
    );
  }, 120_000);

  it('batch cancel cancels a running batch', async () => {
    const id = unique('clic');
    await client().agents.create({ id, core: 'bash', entrypoint: ['bash', '-c', `sleep 5; ${COPY}`] });
    const b = await client().batches.create(id, { items: Array.from({ length: 6 }, () => ({})), concurrency: 2 });
    const r = await sap(['batch', 'cancel', b.id]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ id: b.id, status: 'cancelled' });
  }, 60_000);
});
