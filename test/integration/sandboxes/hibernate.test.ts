/**
 * Hibernate and wake, restore to a checkpoint, the checkpoint lifecycle, and the idle timeout that
 * hibernates: raw HTTP and the published OpenComputer client, against real sandboxes.
 */
import fs from 'node:fs';
import path from 'node:path';
import { api, eventually, T } from '../../helpers/env';
import { hostClient, hostSh, newSandbox } from '../../helpers/sandboxes';
import { startServer, viaHost } from '../../helpers/previews';
import { runSdk } from '../../helpers/sdk';

const made: string[] = [];
afterAll(async () => {
  for (const id of made) await api('DELETE', `/api/sandboxes/${id}`);
});

async function sandbox(body: Record<string, unknown> = {}): Promise<string> {
  const id = await newSandbox({ user: 'root', ...body });
  made.push(id);
  return id;
}

async function checkpoint(id: string, name?: string): Promise<{ id: string; status: string; sizeBytes: number }> {
  const r = await api('POST', `/api/sandboxes/${id}/checkpoints`, { body: name ? { name } : {} });
  expect(r.status).toBe(201);
  return r.body;
}

describe('hibernate and wake', () => {
  it('keeps id, files, env, metadata and previews, releases the cgroup, and applies each on_wake patch once', async () => {
    // A sandbox spawned from a checkpoint with a patch: the patch runs at the spawn; one added later runs at the next wake.
    const origin = await sandbox();
    await hostSh(origin, 'echo from-checkpoint > /workspace/base.txt');
    const cp = await checkpoint(origin);
    const patch = await api('POST', `/api/sandboxes/checkpoints/${cp.id}/patches`, {
      body: { script: 'echo wake >> /workspace/wakes.log', description: 'count wakes' },
    });
    expect(patch.status).toBe(201);
    const spawned = await api('POST', `/api/sandboxes/from-checkpoint/${cp.id}`, {
      body: { envs: { GREETING: 'hi there' }, metadata: { team: 'blue' }, user: 'root' },
    });
    expect(spawned.status).toBe(201);
    const id = spawned.body.sandboxID as string;
    made.push(id);
    await hostSh(id, 'echo mine > /root/mine.txt');
    expect(await hostSh(id, 'wc -l < /workspace/wakes.log')).toBe('1\n');
    const preview = await api('POST', `/api/sandboxes/${id}/preview`, { body: { port: 47411 } });
    expect(preview.status).toBe(201);
    const cgroup = `/sys/fs/cgroup/memory/sap/${id}`;
    const cgroupV2 = `/sys/fs/cgroup/sap/${id}`;
    expect(fs.existsSync(cgroup) || fs.existsSync(cgroupV2)).toBe(true);

    const asked = Date.now();
    const h = await api('POST', `/api/sandboxes/${id}/hibernate`);
    expect(h.status).toBe(200);
    expect(h.body).toMatchObject({ sandboxID: id, status: 'hibernated', metadata: { team: 'blue' } });
    // Stamped while the request was served (the API runs on this machine's clock).
    expect(Date.parse(h.body.hibernatedAt)).toBeGreaterThanOrEqual(asked);
    expect(Date.parse(h.body.hibernatedAt)).toBeLessThanOrEqual(Date.now());
    expect(fs.existsSync(cgroup) || fs.existsSync(cgroupV2)).toBe(false);
    expect(await hostClient().getSandbox(id)).toBeNull();
    expect((await api('GET', `/api/sandboxes/${id}`)).body.status).toBe('hibernated');
    expect((await api('GET', '/api/sandboxes')).body.map((s: { sandboxID: string }) => s.sandboxID)).toContain(id);
    // While hibernated, using it is a clear 409, not a missing sandbox; hibernating again is a no-op.
    const exec = await api('POST', `/api/sandboxes/${id}/exec/run`, { body: { cmd: 'true' } });
    expect(exec.status).toBe(409);
    expect(exec.body.error.message).toMatch(/hibernated/);
    expect((await api('GET', `/api/sandboxes/${id}/files?path=/root/mine.txt`)).status).toBe(409);
    const asleep = await viaHost(preview.body.hostname, '/');
    expect([asleep.status, asleep.json?.error?.message]).toEqual([503, expect.stringMatching(/hibernated/)]);
    expect((await api('POST', `/api/sandboxes/${id}/hibernate`)).body.status).toBe('hibernated');
    expect((await api('DELETE', `/api/sandboxes/${cp.id.replace(/^cp-/, 'sb-')}/checkpoints/${cp.id}`)).status).toBe(404);
    const later = await api('POST', `/api/sandboxes/checkpoints/${cp.id}/patches`, { body: { script: 'echo later >> /workspace/wakes.log' } });
    expect(later.status).toBe(201);

    const w = await api('POST', `/api/sandboxes/${id}/wake`, { body: { timeout: 0 } });
    expect(w.status).toBe(200);
    expect(w.body).toMatchObject({ sandboxID: id, status: 'running', hibernatedAt: null, metadata: { team: 'blue' } });
    expect(await hostSh(id, 'cat /workspace/base.txt /root/mine.txt; echo "$GREETING"; cat /workspace/wakes.log')).toBe(
      'from-checkpoint\nmine\nhi there\nwake\nlater\n',
    );
    // Processes did not survive: the preview's server is started again, and the same preview URL serves it.
    await startServer(id, 47411);
    const served = await eventually(async () => {
      const r = await viaHost(preview.body.hostname, '/hello');
      return r.status === 200 ? r : null;
    });
    expect(served.json).toMatchObject({ url: '/hello', port: 47411 });

    await api('POST', `/api/sandboxes/${id}/hibernate`);
    expect((await api('POST', `/api/sandboxes/${id}/wake`, { body: {} })).status).toBe(200);
    expect(await hostSh(id, 'wc -l < /workspace/wakes.log; cat /root/mine.txt')).toBe('2\nmine\n');
    // Its checkpoint can be deleted under it: it keeps its files and wakes again.
    expect((await api('DELETE', `/api/sandboxes/${origin}/checkpoints/${cp.id}`)).status).toBe(200);
    await api('POST', `/api/sandboxes/${id}/hibernate`);
    expect((await api('POST', `/api/sandboxes/${id}/wake`, { body: {} })).status).toBe(200);
    expect(await hostSh(id, 'cat /workspace/base.txt; wc -l < /workspace/wakes.log')).toBe('from-checkpoint\n2\n');
  }, 120_000);

  it("wakes a hibernated sandbox for the client's async wake (X-OSB-Async-Wake: 1): 503 { waking } until it is up", async () => {
    const id = await sandbox();
    await hostSh(id, 'echo still-here > /workspace/f');
    expect((await api('POST', `/api/sandboxes/${id}/hibernate`)).status).toBe(200);
    expect((await api('GET', `/api/sandboxes/${id}/files?path=/workspace/f`)).status).toBe(409); // without the header: no wake
    const first = await api('GET', `/api/sandboxes/${id}/files?path=/workspace/f`, { headers: { 'x-osb-async-wake': '1' } });
    expect([first.status, first.body.waking, first.body.error.type]).toEqual([503, true, 'unavailable']);
    const later = await eventually(async () => {
      const r = await api('GET', `/api/sandboxes/${id}/files?path=/workspace/f`, { headers: { 'x-osb-async-wake': '1' } });
      return r.status === 200 ? r : null;
    });
    expect(later.body).toBe('still-here\n');
    expect((await api('GET', `/api/sandboxes/${id}`)).body.status).toBe('running');
    // Through the client, whose Filesystem sends the header and retries the 503s.
    expect((await api('POST', `/api/sandboxes/${id}/hibernate`)).status).toBe(200);
    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      out({ before: sb.status, text: await sb.files.read('/workspace/f') });
    `,
      { SB: id },
    );
    expect(r).toEqual({ before: 'hibernated', text: 'still-here\n' });
  }, 60_000);

  it('refuses to wake an unknown, killed or running sandbox, and to hibernate a killed one', async () => {
    const unknown = await api('POST', '/api/sandboxes/sb-0000000000000000/wake', { body: {} });
    expect(unknown.status).toBe(404);
    expect(unknown.body.error.type).toBe('not_found');
    const id = await sandbox();
    const running = await api('POST', `/api/sandboxes/${id}/wake`, { body: {} });
    expect(running.status).toBe(409);
    expect(running.body.error.message).toMatch(/is running/);
    expect((await api('DELETE', `/api/sandboxes/${id}`)).status).toBe(200);
    const killed = await api('POST', `/api/sandboxes/${id}/wake`, { body: {} });
    expect(killed.status).toBe(409);
    expect(killed.body.error.message).toMatch(/was killed/);
    expect((await api('POST', `/api/sandboxes/${id}/hibernate`)).status).toBe(409);
  });

  it('reboots and power-cycles: every process ends, files stay, same id', async () => {
    const id = await sandbox({ envs: { E: 'e' } });
    await hostSh(id, 'echo keep > /workspace/keep');
    expect((await api('POST', `/api/sandboxes/${id}/exec`, { body: { cmd: 'sleep', args: ['600'] } })).status).toBe(201);
    for (const what of ['reboot', 'power-cycle']) {
      const r = await api('POST', `/api/sandboxes/${id}/${what}`);
      expect(r.status).toBe(200);
      expect(r.body).toMatchObject({ sandboxID: id, status: 'running' });
      expect(await hostSh(id, 'cat /workspace/keep; echo $E; pgrep -x sleep || echo none')).toBe('keep\ne\nnone\n');
    }
  });

  it('kills a hibernated sandbox (its saved layer goes too)', async () => {
    const id = await sandbox();
    await hostSh(id, 'echo x > /workspace/x');
    const h = await api('POST', `/api/sandboxes/${id}/hibernate`);
    expect(h.status).toBe(200);
    const saved = () => fs.readdirSync(path.join(T.dataDir(), 'layers')).filter((n) => n.startsWith(`${id}.h`));
    expect(saved()).toHaveLength(1);
    expect((await api('DELETE', `/api/sandboxes/${id}`)).body.status).toBe('stopped');
    expect(saved()).toEqual([]);
    expect((await api('POST', `/api/sandboxes/${id}/wake`, { body: {} })).status).toBe(409);
    expect(
      (
        await hostClient()
          .wake(id)
          .catch((e: { status: number }) => e)
      ).status,
    ).toBe(404);
  });

  it('hibernates instead of killing after the idle timeout when created with onTimeout: hibernate', async () => {
    const id = await sandbox({ timeout: 1, onTimeout: 'hibernate' });
    await hostSh(id, 'echo kept > /workspace/kept');
    const after = await eventually(
      async () => {
        const r = await api('GET', `/api/sandboxes/${id}`);
        return r.body.status === 'hibernated' ? r.body : null;
      },
      45_000,
      500,
    );
    expect(after).toMatchObject({ onTimeout: 'hibernate', timeout: 1 });
    const w = await api('POST', `/api/sandboxes/${id}/wake`, { body: { timeout: 0 } });
    expect(w.body).toMatchObject({ status: 'running', timeout: 0 });
    expect(await hostSh(id, 'cat /workspace/kept')).toBe('kept\n');
    expect((await api('POST', `/api/sandboxes/${id}/timeout`, { body: { timeout: 3600 } })).body.timeout).toBe(3600);
    expect((await api('POST', `/api/sandboxes/${id}/timeout`, { body: { timeout: -1 } })).status).toBe(400);
  }, 60_000);
});

describe('restore and the checkpoint lifecycle', () => {
  it('puts the files back in place under the same id, with the checkpoint fields the client expects', async () => {
    const id = await sandbox({ envs: { KEEP: 'env kept' } });
    await hostSh(id, 'echo one > /workspace/f; head -c 300000 /dev/urandom > /workspace/blob');
    const cp = await checkpoint(id, 'before');
    expect(cp).toMatchObject({ status: 'ready', name: 'before', sandboxId: id });
    expect(cp.sizeBytes).toBeGreaterThanOrEqual(300_000);
    const got = await api('GET', `/api/sandboxes/${id}/checkpoints/${cp.id}`);
    expect(got.body).toMatchObject({ id: cp.id, status: 'ready', error: null });
    await hostSh(id, 'rm /workspace/f; echo two > /workspace/g');
    const bg = await api('POST', `/api/sandboxes/${id}/exec`, { body: { cmd: 'sleep', args: ['600'] } });
    expect(bg.status).toBe(201);

    const r = await api('POST', `/api/sandboxes/${id}/checkpoints/${cp.id}/restore`);
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ sandboxID: id, status: 'running', fromCheckpoint: cp.id });
    expect(await hostSh(id, 'cat /workspace/f; test -e /workspace/g || echo no-g; echo "$KEEP"; pgrep -x sleep || echo no-sleep')).toBe(
      'one\nno-g\nenv kept\nno-sleep\n',
    );
    expect(r.body.patches).toEqual({ applied: [], failed: null });
    // It stands on the checkpoint: deleting that leaves its layer on the host until the sandbox is gone.
    expect((await api('DELETE', `/api/sandboxes/${id}/checkpoints/${cp.id}`)).status).toBe(200);
    expect(fs.existsSync(path.join(T.dataDir(), 'layers', cp.id))).toBe(true);
    expect(await hostSh(id, 'cat /workspace/f')).toBe('one\n');
    expect((await api('POST', `/api/sandboxes/${id}/checkpoints/cp-0000000000000000/restore`)).status).toBe(404);
    expect((await api('DELETE', `/api/sandboxes/${id}`)).status).toBe(200);
    expect(fs.existsSync(path.join(T.dataDir(), 'layers', cp.id))).toBe(false);
  }, 60_000);
});

describe('through the OpenComputer client', () => {
  it('hibernate, connect to a hibernated sandbox, wake, createCheckpoint, listCheckpoints, restoreCheckpoint, setTimeout', async () => {
    const r = await runSdk(`
      const sb = await sdk.Sandbox.create({ ...opts, envs: { WHO: 'sdk' } });
      try {
        await sb.files.write('/workspace/a.txt', 'A');
        const cp = await sb.createCheckpoint('sdk-cp');
        await sb.files.remove('/workspace/a.txt');
        await sb.restoreCheckpoint(cp.id);
        const restored = await sb.files.read('/workspace/a.txt');
        await sb.hibernate();
        const again = await sdk.Sandbox.connect(sb.sandboxId, opts);
        const hibernatedStatus = again.status;
        const running = await again.isRunning();
        await again.wake();
        const woke = await again.exec.run('cat /workspace/a.txt; echo " $WHO"');
        await again.setTimeout(120);
        const list = await again.listCheckpoints();
        out({ cpStatus: cp.status, restored, hibernatedStatus, running, woke: woke.stdout, list: list.map((c) => [c.name, c.status]), timeout: (await sdk.Sandbox.connect(sb.sandboxId, opts)).timeout ?? null });
      } finally {
        await sb.kill();
      }
    `);
    expect(r).toMatchObject({ cpStatus: 'ready', restored: 'A', hibernatedStatus: 'hibernated', running: false, woke: 'A sdk\n', list: [['sdk-cp', 'ready']] });
  }, 90_000);
});
