import { api, eventually, T } from '../../helpers/env';
import { runSdk } from '../../helpers/sdk';

async function hostSandbox(id: string): Promise<number> {
  const r = await fetch(`${T.hostUrl()}/sandboxes/${id}`, { headers: { authorization: `Bearer ${T.hostToken()}` } });
  return r.status;
}

describe('/api/sandboxes', () => {
  it('creates, reads, lists and kills a sandbox over raw HTTP', async () => {
    const created = await api('POST', '/api/sandboxes', { body: { metadata: { owner: 'raw' }, envs: { GREETING: 'hi' }, memoryMB: 256 } });
    expect(created.status).toBe(201);
    const sb = created.body;
    expect(sb).toMatchObject({ status: 'running', templateID: 'base', metadata: { owner: 'raw' }, memoryMB: 256, timeout: 0 });
    expect(sb.sandboxID).toMatch(/^sb-[a-z0-9]+$/);
    expect(JSON.stringify(sb)).not.toContain('hi"');
    expect(await hostSandbox(sb.sandboxID)).toBe(200);
    expect((await api('GET', `/api/sandboxes/${sb.sandboxID}`)).body.sandboxID).toBe(sb.sandboxID);
    expect((await api('GET', '/api/sandboxes')).body.map((s: { sandboxID: string }) => s.sandboxID)).toContain(sb.sandboxID);
    const killed = await api('DELETE', `/api/sandboxes/${sb.sandboxID}`);
    expect(killed.status).toBe(200);
    expect(killed.body.status).toBe('stopped');
    expect(await hostSandbox(sb.sandboxID)).toBe(404);
    expect((await api('GET', `/api/sandboxes/${sb.sandboxID}`)).body.status).toBe('stopped');
    expect((await api('GET', '/api/sandboxes')).body.map((s: { sandboxID: string }) => s.sandboxID)).not.toContain(sb.sandboxID);
  });

  it('works with the published OpenComputer client: create, connect, kill', async () => {
    const r = await runSdk(`
      const sb = await sdk.Sandbox.create({ ...opts, metadata: { via: 'sdk' } });
      const again = await sdk.Sandbox.connect(sb.sandboxId, opts);
      const before = await again.isRunning();
      const status = sb.status;
      await sb.kill();
      out({ id: sb.sandboxId, status, killed: sb.status, connected: again.sandboxId, before, after: await again.isRunning() });
    `);
    expect(r.id).toMatch(/^sb-/);
    expect(r).toMatchObject({ status: 'running', killed: 'stopped', connected: r.id, before: true, after: false });
    expect(await hostSandbox(r.id)).toBe(404);
  });

  it('hides sandboxes from other organisations and rejects bad input', async () => {
    const sb = (await api('POST', '/api/sandboxes', { body: {} })).body;
    expect((await api('GET', `/api/sandboxes/${sb.sandboxID}`, { key: 'nope' })).status).toBe(401);
    const bad = [{ templateID: 'ubuntu-gpu' }, { timeout: -1 }, { envs: { 'BAD NAME': 'x' } }, { memoryMB: 'lots' }, { metadata: { n: 1 } }];
    for (const body of bad) {
      const r = await api('POST', '/api/sandboxes', { body });
      expect([r.status, r.body.error?.type]).toEqual([400, 'invalid_request']);
    }
    expect((await api('GET', '/api/sandboxes/not-an-id')).status).toBe(400);
    expect((await api('GET', '/api/sandboxes/sb-doesnotexist')).status).toBe(404);
    expect((await api('DELETE', '/api/sandboxes/sb-doesnotexist')).status).toBe(404);
    await api('DELETE', `/api/sandboxes/${sb.sandboxID}`);
  });

  it('destroys a sandbox idle past its timeout', async () => {
    const sb = (await api('POST', '/api/sandboxes', { body: { timeout: 1 } })).body;
    await eventually(async () => (await hostSandbox(sb.sandboxID)) === 404, 45_000, 500);
    expect((await api('GET', `/api/sandboxes/${sb.sandboxID}`)).body.status).toBe('stopped');
  }, 60_000);
});
