/**
 * Sandboxes created with an image manifest: built once per manifest (cached as a snapshot named
 * image-<hash>), then reused; raw HTTP with and without Server-Sent Events, and the client's Image.
 */
import { api, T, unique, withMongo } from '../../helpers/env';
import { runSdk } from '../../helpers/sdk';

const made: string[] = [];
afterAll(async () => {
  for (const id of made) await api('DELETE', `/api/sandboxes/${id}`);
});

/** POST /api/sandboxes with Accept: text/event-stream; returns the events in order. */
async function createStreamed(body: unknown): Promise<{ event: string; data: any }[]> {
  const res = await fetch(`${T.api()}/api/sandboxes`, {
    method: 'POST',
    headers: { 'x-api-key': T.key(), 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify(body),
  });
  expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
  const text = await res.text();
  return text
    .split('\n\n')
    .filter((p) => p.startsWith('event: '))
    .map((p) => {
      const [ev, data] = p.split('\n');
      return { event: ev!.slice(7), data: JSON.parse(data!.slice(6)) };
    });
}

const run = async (id: string, cmd: string) => (await api('POST', `/api/sandboxes/${id}/exec/run`, { body: { cmd: 'bash', args: ['-c', cmd] } })).body;

describe('sandboxes created with an image', () => {
  it('builds the image once; a second create with the same manifest takes no build', async () => {
    const marker = unique('img');
    const image = {
      base: 'base',
      steps: [
        { type: 'run', args: { commands: [`echo ${marker} > /opt/marker; date +%s%N > /opt/built-at`] } },
        { type: 'env', args: { vars: { FROM_IMAGE: marker } } },
        { type: 'workdir', args: { path: '/opt' } },
      ],
    };
    const first = await createStreamed({ image });
    const result = first.find((e) => e.event === 'result');
    expect(result?.data.status).toBe('running');
    made.push(result!.data.sandboxID);
    expect(first.filter((e) => e.event === 'build_log').length).toBeGreaterThan(0);
    expect(first.some((e) => e.event === 'build_log' && e.data.type === 'cache')).toBe(false);

    const second = await createStreamed({ image });
    const r2 = second.find((e) => e.event === 'result')!.data;
    made.push(r2.sandboxID);
    expect(second.filter((e) => e.event === 'build_log').map((e) => e.data.type)).toEqual(['cache']);
    // Without SSE: a plain 201, the same cached build.
    const third = await api('POST', '/api/sandboxes', { body: { image } });
    expect(third.status).toBe(201);
    made.push(third.body.sandboxID);

    const outs = await Promise.all(
      [result!.data.sandboxID, r2.sandboxID, third.body.sandboxID].map((id) => run(id, 'cat /opt/marker /opt/built-at; echo "$FROM_IMAGE"; pwd')),
    );
    expect(new Set(outs.map((o) => o.stdout)).size).toBe(1); // one build: the same built-at in all three
    expect(outs[0].stdout).toMatch(new RegExp(`^${marker}\\n\\d+\\n${marker}\\n/opt\\n$`));
    const snaps = await withMongo((c) =>
      c
        .db()
        .collection('snapshots')
        .countDocuments({ manifest: JSON.stringify(image) }),
    );
    expect(snaps).toBe(1);
  }, 180_000);

  it('reports a failed build as an error event (SSE) or 409 (JSON), and refuses bad manifests', async () => {
    const image = { base: 'base', steps: [{ type: 'run', args: { commands: [`echo ${unique('fail')}; exit 7`] } }] };
    const events = await createStreamed({ image });
    const err = events.find((e) => e.event === 'error');
    expect(err?.data.error).toMatch(/build failed/);
    expect(events.some((e) => e.event === 'result')).toBe(false);
    const plain = await api('POST', '/api/sandboxes', { body: { image } });
    expect(plain.status).toBe(409);
    expect(plain.body.error.message).toMatch(/build failed/);
    expect((await api('POST', '/api/sandboxes', { body: { image: { steps: [{ type: 'nope' }] } } })).status).toBe(400);
    expect((await api('POST', '/api/sandboxes', { body: { image: { steps: [] }, snapshot: 'x' } })).status).toBe(400);
  }, 120_000);

  it('works with the client: Sandbox.create({ image }) with build logs', async () => {
    const marker = unique('sdk-img');
    const r = await runSdk(
      `
      const { Image } = await import('@opencomputer/sdk/node');
      const image = Image.base().runCommands('echo ${marker} > /opt/m').env({ SDK_IMAGE: '${marker}' });
      const logs = [];
      step('create a (builds)');
      const a = await sdk.Sandbox.create({ ...opts, image, onBuildLog: (l) => logs.push(l) });
      step('created ' + a.sandboxId + '; create b (cached)');
      const b = await sdk.Sandbox.create({ ...opts, image, onBuildLog: (l) => logs.push('second: ' + l) });
      step('created ' + b.sandboxId + '; exec.run in a');
      const outA = await a.exec.run('cat /opt/m; echo $SDK_IMAGE');
      step('exec.run in b');
      const outB = await b.exec.run('cat /opt/m');
      step('kill a and b');
      await a.kill(); await b.kill();
      out({ outA: outA.stdout, outB: outB.stdout, secondLogs: logs.filter((l) => l.startsWith('second: ')).length, firstLogs: logs.filter((l) => !l.startsWith('second: ')).length });
    `,
    );
    expect(r).toMatchObject({ outA: `${marker}\n${marker}\n`, outB: `${marker}\n`, secondLogs: 1 });
    expect(r.firstLogs).toBeGreaterThan(0);
  }, 180_000);
});
