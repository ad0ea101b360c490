import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Stack } from '../../../scripts/launcher';
import { startTwoHostStack } from '../../helpers/two-hosts';
import { SERVER_JS, viaHost } from '../../helpers/previews';
import { newSandbox, sh, type ApiCall } from '../../helpers/sandboxes';
import { PROJECT_ROOT } from '../../../config';

/**
 * Scale-out on one machine: a stack of its own with two sandbox hosts (SANDBOX_HOSTS=2, as
 * `npm start` runs it), real Temporal, FerretDB and sandboxes. Placement spreads sessions over both;
 * a checkpoint taken on one host spawns on the other; a preview of a sandbox on the second host is
 * served by the API through the host's HTTP port (PREVIEW_TRANSPORT=tcp: the path an API on another
 * machine takes); and the second host killed with its worker is written off: its sessions end
 * host_lost (or run again on the first with retryOnHostLoss), its sandboxes answer 410, and when it
 * comes back it destroys those of its sessions and instances, keeps its API sandboxes running, and
 * takes new work again (a frozen host: lost-host.test.ts).
 */
jest.setTimeout(300_000);

const KEY = 'scale-out-test-key';
const TOKEN = 'scale-out-host-token-0123456789';
/** Short, so that the host-loss test is quick: a host silent this long (s) is lost. */
const DEAD_AFTER_S = 4;

let stack: Stack;
let dataDir: string;

beforeAll(async () => {
  ({ stack, dataDir } = await startTwoHostStack({
    prefix: 'sap-scale-',
    apiKey: KEY,
    hostToken: TOKEN,
    deadAfterS: DEAD_AFTER_S,
    env: { PREVIEW_TRANSPORT: 'tcp' },
  }));
}, 180_000);

afterAll(async () => {
  await stack?.stop({ destroySandboxes: true });
  // The processes' logs outlive the run (for a failure's investigation): the last run's only.
  const keep = path.join(os.tmpdir(), 'sap-scale-out-last-logs');
  fs.rmSync(keep, { recursive: true, force: true });
  if (stack) fs.cpSync(stack.logDir, keep, { recursive: true });
  if (dataDir) fs.rmSync(dataDir, { recursive: true, force: true });
});

async function call<T = any>(method: string, p: string, body?: unknown): Promise<{ status: number; body: T }> {
  const res = await fetch(`${stack.apiUrl}${p}`, {
    method,
    headers: { 'x-api-key': KEY, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: (text ? JSON.parse(text) : null) as T };
}

/** The ids of the sandboxes each host has (first host first). */
async function sandboxesByHost(): Promise<string[][]> {
  return Promise.all(
    stack.hostList.map(async (h) => {
      const res = await fetch(`${h.url}/sandboxes`, { headers: { authorization: `Bearer ${TOKEN}` } });
      return ((await res.json()) as { id: string }[]).map((s) => s.id);
    }),
  );
}

/** Lines of a host's entrypoint audit log: one per session entrypoint it started. */
function auditLines(i: number): { sandboxId?: string; sessionId?: string; owner?: { id: string } }[] {
  const file = path.join(stack.hostList[i]!.dataDir, 'audit', 'entrypoints.ndjson');
  if (!fs.existsSync(file)) return [];
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));
}

/** The workflow's history as the Temporal CLI shows it (for a failure's message). */
function history(workflowId: string): string {
  try {
    const cli = (args: string[]) =>
      execFileSync(path.join(PROJECT_ROOT, '.tools', 'bin', 'temporal'), [...args, '-w', workflowId, '--address', stack.temporalAddress], {
        encoding: 'utf8',
        timeout: 10_000,
      });
    return `${cli(['workflow', 'show'])}\n${cli(['workflow', 'describe'])}`;
  } catch (err) {
    return String(err);
  }
}

/** This file's own stack's API, for the shared sandbox helpers. */
const via: ApiCall = (method, p, opts) => call(method, p, opts.body);

async function waitSession(agent: string, id: string, timeoutMs = 60_000): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await call('GET', `/v1/agents/${agent}/sessions/${id}?wait=5`);
    if (r.body.status === 'completed' || r.body.status === 'failed') return r.body;
    if (Date.now() > deadline) throw new Error(`session ${id} still ${r.body.status} after ${timeoutMs} ms; its workflow:\n${history(id)}`);
  }
}

/** Creates API sandboxes until one lands on host `i` (placement is random by free capacity). */
async function sandboxOnHost(i: number, make: () => Promise<string>): Promise<string> {
  for (let n = 0; n < 30; n++) {
    const id = await make();
    if ((await sandboxesByHost())[i]!.includes(id)) return id;
  }
  throw new Error(`30 sandboxes in a row landed elsewhere than host ${i + 1}`);
}

const viaApi = (hostname: string, p: string) => viaHost(hostname, p, { api: stack.apiUrl });

describe('two sandbox hosts', () => {
  it('registers both hosts with their load, and places sessions on both', async () => {
    expect(stack.hostList.map((h) => h.hostId)).toEqual([expect.stringMatching(/-1$/), expect.stringMatching(/-2$/)]);
    for (const h of stack.hostList) {
      const health = (await (await fetch(`${h.url}/healthz`)).json()) as Record<string, unknown>;
      expect(health).toMatchObject({
        ok: true,
        hostId: h.hostId,
        sandboxes: expect.any(Number),
        maxSandboxes: expect.any(Number),
        reservedMB: expect.any(Number),
        memoryMB: expect.any(Number),
      });
    }
    const agent = await call('POST', '/v1/agents', { id: 'spread', core: 'bash', entrypoint: ['bash', '-c', 'cp "$AGENT_INPUT_PATH" /tmp/agent_result.json'] });
    expect(agent.status).toBe(201);
    // Which worker takes a session is Temporal's choice (see the snapshot test below): rounds of 16
    // until both hosts ran some (at most 8 rounds).
    let total = 0;
    for (let round = 0; round < 8 && (total === 0 || auditLines(0).length === 0 || auditLines(1).length === 0); round++) {
      const ids: string[] = [];
      for (let i = 0; i < 16; i++) ids.push((await call('POST', '/v1/agents/spread/sessions', { input: { i } })).body.id);
      const ended = await Promise.all(ids.map((id) => waitSession('spread', id)));
      expect(ended.map((s) => s.status)).toEqual(ids.map(() => 'completed'));
      expect(ended.map((s) => s.result.i)).toEqual(ids.map((_, i) => i));
      total += ids.length;
    }
    // Each host's audit log names the sessions it ran: both ran some, none ran one twice.
    const [a, b] = [auditLines(0), auditLines(1)];
    expect(a.length).toBeGreaterThan(0);
    expect(b.length).toBeGreaterThan(0);
    expect(a.length + b.length).toBe(total);
    expect(new Set([...a, ...b].map((l) => l.sandboxId)).size).toBe(total);
  });

  it('spawns a checkpoint taken on one host on the other, with its files and patches', async () => {
    const origin = await sandboxOnHost(0, () => newSandbox({ user: 'root' }, { via }));
    await sh(
      origin,
      'echo from-host-1 > /workspace/made.txt && head -c 300000 /dev/urandom > /workspace/blob && sha256sum /workspace/blob > /workspace/blob.sum',
      { via },
    );
    const cp = await call('POST', `/api/sandboxes/${origin}/checkpoints`, { name: 'moving' });
    expect(cp.status).toBe(201);
    const cpId = cp.body.id as string;
    expect((await call('POST', `/api/sandboxes/checkpoints/${cpId}/patches`, { script: 'echo patched >> /workspace/patch.log' })).status).toBe(201);
    const spawned = await sandboxOnHost(1, async () => {
      const r = await call('POST', `/api/sandboxes/from-checkpoint/${cpId}`, {});
      if (r.status !== 201) throw new Error(`spawn: ${r.status} ${JSON.stringify(r.body)}`);
      return r.body.sandboxID as string;
    });
    expect(await sh(spawned, 'cat /workspace/made.txt /workspace/patch.log && sha256sum -c /workspace/blob.sum', { via })).toBe(
      'from-host-1\npatched\n/workspace/blob: OK\n',
    );
    // The layer is now cached on the second host, beside the first host's own copy.
    for (const h of stack.hostList) expect(fs.existsSync(path.join(h.dataDir, 'layers', cpId, 'layer.json'))).toBe(true);
    // Restore in place on the second host of the same checkpoint: no copy needed, same files.
    await sh(spawned, 'rm /workspace/made.txt', { via });
    expect((await call('POST', `/api/sandboxes/${spawned}/checkpoints/${cpId}/restore`, {})).status).toBe(200);
    expect(await sh(spawned, 'cat /workspace/made.txt', { via })).toBe('from-host-1\n');
  });

  it('runs sessions of an agent whose snapshot was made on one host on both hosts (the layer follows)', async () => {
    const origin = await sandboxOnHost(0, () => newSandbox({ user: 'root' }, { via }));
    await sh(origin, 'echo baked-in > /opt/tool.txt', { via });
    const cp = await call('POST', `/api/sandboxes/${origin}/checkpoints`, { name: 'for-snapshot' });
    expect(cp.status).toBe(201);
    const snap = await call('POST', '/api/snapshots', { name: 'made-on-host-1', checkpointId: cp.body.id });
    expect(snap.status).toBe(201);
    expect(
      (
        await call('POST', '/v1/agents', {
          id: 'snapped',
          core: 'bash',
          snapshot: 'made-on-host-1',
          entrypoint: ['bash', '-c', 'printf \'{"tool": "%s"}\' "$(cat /opt/tool.txt)" > /tmp/agent_result.json'],
        })
      ).status,
    ).toBe(201);
    const before = auditLines(1).length;
    // A session runs on the host whose worker took it (unless that host is clearly fuller), and
    // which worker takes a task is Temporal's choice: 12 sessions all went to the first host once
    // in about 15 runs. Rounds of 12 until some ran on the second host (at most 8 rounds).
    for (let round = 0; round < 8 && auditLines(1).length === before; round++) {
      const ids: string[] = [];
      for (let i = 0; i < 12; i++) ids.push((await call('POST', '/v1/agents/snapped/sessions', { input: {} })).body.id);
      const ended = await Promise.all(ids.map((id) => waitSession('snapped', id)));
      expect(ended.map((e) => [e.status, e.result?.tool, e.outcome?.message ?? null])).toEqual(ids.map(() => ['completed', 'baked-in', null]));
    }
    // Some ran on the second host, which copied the snapshot's layer from the first.
    expect(auditLines(1).length).toBeGreaterThan(before);
    expect(fs.existsSync(path.join(stack.hostList[1]!.dataDir, 'layers', cp.body.id, 'layer.json'))).toBe(true);
  });

  it("serves a preview of a sandbox on the second host through that host's HTTP port", async () => {
    const sb = await sandboxOnHost(1, () => newSandbox({}, { via }));
    expect((await call('POST', `/api/sandboxes/${sb}/exec`, { cmd: 'node', args: ['-e', SERVER_JS, '8000'] })).status).toBe(201);
    const preview = await call('POST', `/api/sandboxes/${sb}/preview`, { port: 8000 });
    expect(preview.status).toBe(201);
    const hostname = String(preview.body.hostname);
    let res = { status: 0, text: '' };
    for (let i = 0; i < 50; i++) {
      res = await viaApi(hostname, '/hello?x=1');
      if (res.status === 200) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(res.status).toBe(200);
    expect(JSON.parse(res.text)).toMatchObject({ port: 8000, method: 'GET', url: '/hello?x=1' });
    // Nothing listens on 8001 inside: a clear 502 through the tunnel.
    const closed = await call('POST', `/api/sandboxes/${sb}/preview`, { port: 8001 });
    expect(closed.status).toBe(201);
    const refused = await viaApi(String(closed.body.hostname), '/');
    expect(refused.status).toBe(502);
  });

  it('writes off a host killed with its worker: host_lost, 410s, retryOnHostLoss reruns elsewhere, and the host rejoins with its API sandbox', async () => {
    const second = stack.hostList[1]!;
    const sleeper = await call('POST', '/v1/agents', { id: 'sleeper', core: 'bash', entrypoint: ['bash', '-c', 'sleep 600'] });
    expect(sleeper.status).toBe(201);
    const rerun = await call('POST', '/v1/agents', {
      id: 'rerun',
      core: 'bash',
      retryOnHostLoss: true,
      entrypoint: ['bash', '-c', 'sleep 6; echo "{\\"host\\": \\"$(cat /proc/sys/kernel/hostname)\\"}" > /tmp/agent_result.json'],
    });
    expect(rerun.status).toBe(201);
    expect(rerun.body.retryOnHostLoss).toBe(true);
    // Sessions until each agent has one running on the second host.
    const onSecond = async (agent: string): Promise<string> => {
      for (let n = 0; n < 30; n++) {
        const id = (await call('POST', `/v1/agents/${agent}/sessions`, { input: {} })).body.id as string;
        for (let w = 0; w < 100; w++) {
          const running = auditLines(1).some((l) => JSON.stringify(l).includes(id));
          if (running) return id;
          if (auditLines(0).some((l) => JSON.stringify(l).includes(id))) break;
          await new Promise((r) => setTimeout(r, 100));
        }
      }
      throw new Error(`no ${agent} session landed on the second host`);
    };
    const lostSession = await onSecond('sleeper');
    const rerunSession = await onSecond('rerun');
    const apiSandbox = await sandboxOnHost(1, () => newSandbox({}, { via }));
    // A checkpoint whose only copy is on the second host.
    await sh(apiSandbox, 'echo only-here > /workspace/f', { via });
    const stranded = await call('POST', `/api/sandboxes/${apiSandbox}/checkpoints`, { name: 'stranded' });
    expect(stranded.status).toBe(201);
    // An instance on the second host.
    expect((await call('POST', '/v1/agents', { id: 'keeper', core: 'bash', entrypoint: ['bash', '-c', 'true'] })).status).toBe(201);
    let instance = '';
    for (let n = 0; n < 30 && !instance; n++) {
      const made = await call('POST', '/v1/agents/keeper/instances', {});
      expect(made.status).toBe(201);
      let got = made.body;
      for (let w = 0; w < 100 && got.status !== 'running'; w++) {
        await new Promise((r) => setTimeout(r, 100));
        got = (await call('GET', `/v1/agents/keeper/instances/${made.body.id}`)).body;
      }
      if ((await sandboxesByHost())[1]!.includes(got.sandbox_id)) instance = made.body.id;
    }
    expect(instance).not.toBe('');

    await Promise.all([stack.kill(second.worker, 'SIGKILL'), stack.kill(second.proc, 'SIGKILL')]);

    const lost = await waitSession('sleeper', lostSession, 90_000);
    expect(lost).toMatchObject({ status: 'failed', outcome: { reason: 'host_lost' } });
    expect(lost.outcome.message).toContain(second.hostId);

    const again = await waitSession('rerun', rerunSession, 90_000);
    expect(again).toMatchObject({ status: 'completed' });
    expect(auditLines(0).some((l) => JSON.stringify(l).includes(rerunSession))).toBe(true);

    // The instance is written off by the workers' host watch.
    let inst = (await call('GET', `/v1/agents/keeper/instances/${instance}`)).body;
    for (let w = 0; w < 100 && inst.status !== 'failed'; w++) {
      await new Promise((r) => setTimeout(r, 200));
      inst = (await call('GET', `/v1/agents/keeper/instances/${instance}`)).body;
    }
    expect(inst).toMatchObject({ status: 'failed', error: expect.stringMatching(/^host_lost: /) });

    // The checkpoint's only copy went with the host: a clear 503, not a hang.
    const spawn = await call('POST', `/api/sandboxes/from-checkpoint/${stranded.body.id}`, {});
    expect(spawn.status).toBe(503);
    expect(spawn.body.error.message).toContain(`only on sandbox host ${second.hostId}, which is lost`);

    const gone = await call('POST', `/api/sandboxes/${apiSandbox}/exec/run`, { cmd: 'true' });
    expect(gone.status).toBe(410);
    expect(gone.body.error).toMatchObject({ type: 'gone', message: expect.stringContaining(second.hostId) });

    // New sessions all go to the first host meanwhile.
    expect(
      (await call('POST', '/v1/agents', { id: 'meanwhile', core: 'bash', entrypoint: ['bash', '-c', 'cp "$AGENT_INPUT_PATH" /tmp/agent_result.json'] })).status,
    ).toBe(201);
    const before = auditLines(0).length;
    const quick = await Promise.all([0, 1, 2, 3].map(async (i) => (await call('POST', '/v1/agents/meanwhile/sessions', { input: { i } })).body.id as string));
    expect((await Promise.all(quick.map((id) => waitSession('meanwhile', id)))).map((s) => s.status)).toEqual([
      'completed',
      'completed',
      'completed',
      'completed',
    ]);
    expect(auditLines(0).length).toBe(before + 4);

    // Back: the sessions' and the instance's sandboxes are destroyed; the API sandbox, adopted by the
    // restarted host, is running again with its files; and the host takes work again.
    await stack.start(second.proc);
    await stack.start(second.worker);
    const kept = (await sandboxesByHost())[1]!;
    expect(kept).toContain(apiSandbox);
    expect(kept).not.toContain(inst.sandbox_id);
    const sessionsThere = await fetch(`${second.url}/sandboxes?owner=session`, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(await sessionsThere.json()).toEqual([]);
    // Every sandbox it kept is an API sandbox of the earlier tests, shown running.
    for (const id of kept) expect((await call('GET', `/api/sandboxes/${id}`)).body.status).toBe('running');
    expect((await call('GET', `/api/sandboxes/${apiSandbox}`)).body.status).toBe('running');
    expect(await sh(apiSandbox, 'cat /workspace/f', { via })).toBe('only-here\n');
    expect((await call('GET', `/api/sandboxes/${inst.sandbox_id}`)).body.status).toBe('stopped');
    const fresh = await sandboxOnHost(1, () => newSandbox({}, { via }));
    expect(await sh(fresh, 'echo back', { via })).toBe('back\n');
  });
});
