import { api, eventually, T, unique } from '../../helpers/env';
import { runSdk } from '../../helpers/sdk';
import { hostClient, hostSh, newSandbox } from '../../helpers/sandboxes';
import { otherOrgKey } from '../../helpers/checkpoints';

jest.setTimeout(180_000);

const b64 = (s: string) => Buffer.from(s).toString('base64');

/** A manifest exercising every step type that works without a network. */
const manifest = (tag: string) => ({
  base: 'base',
  steps: [
    { type: 'run', args: { commands: ['mkdir -p /opt/app', `echo ${tag} > /opt/app/tag`] } },
    { type: 'add_file', args: { path: '/opt/app/config.json', content: b64('{"k":1}'), encoding: 'base64' } },
    {
      type: 'add_dir',
      args: {
        path: '/opt/app/lib',
        files: [
          { relativePath: 'a/one.txt', content: b64('one') },
          { relativePath: 'two.txt', content: b64('two') },
        ],
      },
    },
    { type: 'env', args: { vars: { APP_MODE: 'snap', APP_TAG: tag } } },
    { type: 'workdir', args: { path: '/opt/app' } },
    { type: 'run', args: { commands: ['echo "$APP_MODE in $(pwd)" > built.txt'] } },
  ],
});

/** POSTs a snapshot with Accept: text/event-stream and returns the parsed events. */
async function buildSse(body: unknown, key = T.key()): Promise<{ status: number; type: string | null; events: { event: string; data: any }[] }> {
  const res = await fetch(`${T.api()}/api/snapshots`, {
    method: 'POST',
    headers: { 'x-api-key': key, 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  const events = text
    .split('\n\n')
    .filter((p) => p.includes('data: '))
    .map((p) => {
      const event = /^event: (.*)$/m.exec(p)?.[1] ?? '';
      return { event, data: JSON.parse(/^data: (.*)$/m.exec(p)![1]!) };
    });
  return { status: res.status, type: res.headers.get('content-type'), events };
}

describe('snapshots', () => {
  it('builds from a manifest with SSE progress; the hash is stable; sandboxes start from it with its env and workdir', async () => {
    const name = unique('snap');
    const r = await buildSse({ name, image: manifest('v1') });
    expect(r.status).toBe(200);
    expect(r.type).toMatch(/text\/event-stream/);
    const logs = r.events.filter((e) => e.event === 'build_log');
    expect(logs.length).toBeGreaterThanOrEqual(6);
    expect(logs[0]!.data).toMatchObject({ step: 1, type: 'run' });
    expect(logs.map((l) => l.data.step)).toEqual([...logs.map((l) => l.data.step)].sort((a, b) => a - b));
    const result = r.events[r.events.length - 1]!;
    expect(result).toEqual({ event: 'result', data: expect.objectContaining({ status: 'ready' }) });
    const snap = result.data;
    expect(snap).toMatchObject({ name, status: 'ready', error: null });
    expect(snap.id).toMatch(/^snap-[a-z0-9]+$/);
    expect(snap.contentHash).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(snap.checkpointId).toMatch(/^cp-/);
    expect(snap.manifest.steps).toHaveLength(6);

    // The same steps give the same hash; different steps another.
    const again = (await buildSse({ name: unique('snap'), image: manifest('v1') })).events.pop()!.data;
    expect(again.contentHash).toBe(snap.contentHash);
    const other = (await buildSse({ name: unique('snap'), image: manifest('v2') })).events.pop()!.data;
    expect(other.status).toBe('ready');
    expect(other.contentHash).not.toBe(snap.contentHash);

    // Read by id and by name; listed as a bare array.
    expect((await api('GET', `/api/snapshots/${snap.id}`)).body.id).toBe(snap.id);
    expect((await api('GET', `/api/snapshots/${name}`)).body.id).toBe(snap.id);
    const list = await api('GET', '/api/snapshots');
    expect(Array.isArray(list.body)).toBe(true);
    expect(list.body.map((s: { id: string }) => s.id)).toEqual(expect.arrayContaining([snap.id, again.id, other.id]));

    // A sandbox from it: the image's files, env and default working directory; lastUsedAt moves.
    const sb = await api('POST', '/api/sandboxes', { body: { snapshot: name, envs: { APP_TAG: 'override' } } });
    expect(sb.status).toBe(201);
    expect(sb.body.snapshot).toBe(snap.id);
    const out = await hostSh(
      sb.body.sandboxID,
      'pwd; cat tag built.txt config.json lib/a/one.txt lib/two.txt; echo; echo $APP_MODE $APP_TAG; grep APP_MODE /etc/environment',
    );
    expect(out).toBe('/opt/app\nv1\nsnap in /opt/app\n{"k":1}onetwo\nsnap override\nAPP_MODE="snap"\n');
    const used = (await api('GET', `/api/snapshots/${snap.id}`)).body;
    expect(Date.parse(used.lastUsedAt)).toBeGreaterThan(Date.parse(snap.lastUsedAt));

    // In use by a running sandbox: 409; the name is taken: 409.
    expect((await api('DELETE', `/api/snapshots/${snap.id}`)).status).toBe(409);
    expect((await api('POST', '/api/snapshots', { body: { name, image: { steps: [] } } })).status).toBe(409);
    await api('DELETE', `/api/sandboxes/${sb.body.sandboxID}`);
    const del = await api('DELETE', `/api/snapshots/${name}`);
    expect(del.status).toBe(200);
    expect((await api('GET', `/api/snapshots/${snap.id}`)).status).toBe(404);
    expect((await api('GET', `/api/sandboxes/checkpoints/${snap.checkpointId}/patches`)).status).toBe(404);
    await expect(hostClient().layerHash(snap.checkpointId)).rejects.toMatchObject({ type: 'not_found' });
    // The build sandboxes are gone.
    expect((await hostClient().listSandboxes({ owner: 'snapshot' })).length).toBe(0);
  });

  it('fails a step with a clear error naming it (and apt_install without a reachable mirror)', async () => {
    const failing = await buildSse({
      name: unique('bad'),
      image: {
        steps: [
          { type: 'run', args: { commands: ['true'] } },
          { type: 'run', args: { commands: ['echo oops >&2; exit 4'] } },
        ],
      },
    });
    const err = failing.events.pop()!;
    expect(err.event).toBe('error');
    expect(err.data.error).toMatch(/^step 2 \(run\) failed: command "echo oops >&2; exit 4" exited with code 4: oops/);
    expect(failing.events.some((e) => e.event === 'build_log' && e.data.message === 'oops')).toBe(true);

    const apt = await buildSse({ name: unique('apt'), image: { steps: [{ type: 'apt_install', args: { packages: ['cowsay'] } }] } });
    const aptErr = apt.events.pop()!;
    expect(aptErr.event).toBe('error');
    expect(aptErr.data.error).toMatch(/^step 1 \(apt_install\) failed: apt-get/);
    expect((await hostClient().listSandboxes({ owner: 'snapshot' })).length).toBe(0);
  });

  it('answers JSON at once (202, building) without SSE, and snapshots an existing checkpoint', async () => {
    const name = unique('async');
    const r = await api('POST', '/api/snapshots', { body: { name, image: { steps: [{ type: 'run', args: { commands: ['sleep 1; echo done > /done'] } }] } } });
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ name, status: 'building', contentHash: null });
    const ready = await eventually(
      async () => {
        const g = await api('GET', `/api/snapshots/${name}`);
        return g.body.status === 'ready' ? g.body : undefined;
      },
      60_000,
      200,
    );
    expect(ready.contentHash).toMatch(/^sha256:/);

    const a = await newSandbox();
    await hostSh(a, 'echo from-cp > /workspace/x');
    const cpId = (await api('POST', `/api/sandboxes/${a}/checkpoints`, { body: {} })).body.id as string;
    await api('POST', `/api/sandboxes/checkpoints/${cpId}/patches`, { body: { script: 'echo patched >> /workspace/x' } });
    const fromCp = await api('POST', '/api/snapshots', { body: { name: unique('fromcp'), checkpointId: cpId } });
    expect(fromCp.status).toBe(201);
    expect(fromCp.body).toMatchObject({ status: 'ready', checkpointId: cpId });
    expect(fromCp.body.contentHash).toMatch(/^sha256:[0-9a-f]{64}$/);
    const sb = (await api('POST', '/api/sandboxes', { body: { snapshot: fromCp.body.id } })).body.sandboxID;
    expect(await hostSh(sb, 'cat /workspace/x')).toBe('from-cp\npatched\n');
    // The checkpoint is in use by the snapshot.
    expect((await api('DELETE', `/api/sandboxes/${a}/checkpoints/${cpId}`)).status).toBe(409);
    await api('DELETE', `/api/sandboxes/${sb}`);
    expect((await api('DELETE', `/api/snapshots/${fromCp.body.id}`)).status).toBe(200);
    // A snapshot of someone's checkpoint leaves the checkpoint alone.
    expect((await api('GET', `/api/sandboxes/checkpoints/${cpId}/patches`)).status).toBe(200);
    await api('DELETE', `/api/sandboxes/${a}`);
  });

  it("answers 404 for another organisation's snapshots and 400 for bad input", async () => {
    const name = unique('mine');
    const snap = (await buildSse({ name, image: { steps: [] } })).events.pop()!.data;
    const key = await otherOrgKey();
    expect((await api('GET', `/api/snapshots/${snap.id}`, { key })).status).toBe(404);
    expect((await api('GET', `/api/snapshots/${name}`, { key })).status).toBe(404);
    expect((await api('DELETE', `/api/snapshots/${name}`, { key })).status).toBe(404);
    expect((await api('GET', '/api/snapshots', { key })).body).toEqual([]);
    const sb = await api('POST', '/api/sandboxes', { body: { snapshot: name }, key });
    expect([sb.status, sb.body.error.type]).toEqual([400, 'invalid_request']);
    // The same name is free in the other organisation.
    expect((await api('POST', '/api/snapshots', { body: { name, image: { steps: [] } }, key })).status).toBe(202);

    const bad = [
      {},
      { name: 'x' },
      { name: 'has space', image: { steps: [] } },
      { name: 'ok', image: { steps: [{ type: 'nope', args: {} }] } },
      { name: 'ok', image: { base: 'ubuntu', steps: [] } },
      { name: 'ok', image: { steps: [{ type: 'run', args: { commands: [] } }] } },
      { name: 'ok', image: { steps: [{ type: 'add_file', args: { path: 'relative', content: '' } }] } },
      { name: 'ok', image: { steps: [{ type: 'add_dir', args: { path: '/x', files: [{ relativePath: '../up', content: '' }] } }] } },
      { name: 'ok', image: { steps: [{ type: 'env', args: { vars: { 'BAD-NAME': 'x' } } }] } },
      { name: 'ok', image: { steps: [{ type: 'apt_install', args: { packages: ['-oAPT::x'] } }] } },
      { name: 'ok', image: { steps: [] }, checkpointId: 'cp-abc' },
      { name: 'ok', checkpointId: 'cp-doesnotexist' },
    ];
    for (const body of bad) {
      const r = await api('POST', '/api/snapshots', { body });
      expect([JSON.stringify(body), r.status, r.body.error?.type]).toEqual([JSON.stringify(body), 400, 'invalid_request']);
    }
    expect((await api('GET', '/api/snapshots/bad%20name')).status).toBe(400);
    expect((await api('GET', '/api/snapshots/snap-doesnotexist')).status).toBe(404);
    expect((await api('POST', '/api/sandboxes', { body: { snapshot: 'no-such-snapshot' } })).status).toBe(400);
  });

  it('works with the published OpenComputer client: Snapshots.create (image builder, SSE), list, get, Sandbox.create({ snapshot })', async () => {
    const name = unique('sdk');
    const r = await runSdk(`
      const node = await import('@opencomputer/sdk/node');
      const logs = [];
      const image = node.Image.base().runCommands('echo sdk > /sdk.txt').env({ FROM_SDK: '1' }).workdir('/srv').addFile('/srv/hello.txt', 'hello');
      const snapshots = new node.Snapshots(opts);
      const created = await snapshots.create({ name: ${JSON.stringify(name)}, image, onBuildLogs: (l) => logs.push(l) });
      const listed = await snapshots.list();
      const got = await snapshots.get(${JSON.stringify(name)});
      const sb = await sdk.Sandbox.create({ ...opts, snapshot: ${JSON.stringify(name)} });
      let failed = null;
      try { await snapshots.create({ name: ${JSON.stringify(name + '-bad')}, image: node.Image.base().runCommands('exit 9') }); } catch (e) { failed = e.message; }
      out({ created, listed: listed.map((s) => s.name), got, logs: logs.length, sandbox: sb.sandboxId, failed });
    `);
    expect(r.created).toMatchObject({ name, status: 'ready' });
    expect(r.listed).toContain(name);
    expect(r.got.id).toBe(r.created.id);
    expect(r.logs).toBeGreaterThanOrEqual(4);
    expect(r.failed).toMatch(/Build failed: step 1 \(run\) failed/);
    expect(await hostSh(r.sandbox, 'pwd; cat /sdk.txt hello.txt; echo; echo $FROM_SDK')).toBe('/srv\nsdk\nhello\n1\n');
    await api('DELETE', `/api/sandboxes/${r.sandbox}`);
  });
});
