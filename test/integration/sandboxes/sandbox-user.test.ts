/**
 * The `user` option through the API: /api sandboxes default to the sandbox user (OpenComputer's
 * convention), `root` on request; agents take `user` for their sessions' sandboxes (default root);
 * anything but root and sandbox is refused with the error body.
 */
import { api, unique } from '../../helpers/env';
import { sh } from '../../helpers/sandboxes';
import { sessionResult } from '../../helpers/probes';

describe('the sandbox user through the API', () => {
  const sandboxes: string[] = [];
  const agents: string[] = [];
  afterAll(async () => {
    for (const id of sandboxes) await api('DELETE', `/api/sandboxes/${id}`);
    for (const id of agents) await api('DELETE', `/v1/agents/${id}`);
  });

  it('gives /api sandboxes the sandbox user by default and root on request; refuses other users', async () => {
    const byDefault = await api('POST', '/api/sandboxes', { body: {} });
    const root = await api('POST', '/api/sandboxes', { body: { user: 'root' } });
    for (const r of [byDefault, root]) if (r.status === 201) sandboxes.push(r.body.sandboxID);
    expect([byDefault.status, byDefault.body.user, root.status, root.body.user]).toEqual([201, 'sandbox', 201, 'root']);
    expect((await api('GET', `/api/sandboxes/${byDefault.body.sandboxID}`)).body.user).toBe('sandbox');
    expect(await sh(byDefault.body.sandboxID, 'whoami; echo $HOME; pwd')).toBe('sandbox\n/home/sandbox\n/workspace\n');
    expect(await sh(root.body.sandboxID, 'whoami; echo $HOME; pwd')).toBe('root\n/root\n/workspace\n');
    for (const user of ['admin', '1000', 'nobody', '', 0]) {
      const bad = await api('POST', '/api/sandboxes', { body: { user } });
      expect([bad.status, bad.body.error?.type]).toEqual([400, 'invalid_request']);
    }
  });

  it("runs an agent's sessions as its user; the agent shows it, and null goes back to the default", async () => {
    const id = unique('useragent');
    const created = await api('POST', '/v1/agents', {
      body: {
        id,
        core: 'bash',
        user: 'sandbox',
        files: { '/workspace/given.txt': 'given' },
        entrypoint: [
          'bash',
          '-c',
          'printf \'{"uid":"%s","home":"%s","owner":"%s"}\' "$(id -u)" "$HOME" "$(stat -c %U /workspace/given.txt)" > /tmp/agent_result.json',
        ],
      },
    });
    if (created.status === 201) agents.push(id);
    expect([created.status, created.body.user]).toEqual([201, 'sandbox']);
    const s = await api('POST', `/v1/agents/${id}/sessions`, { body: { input: {} } });
    expect(s.status).toBe(201);
    const result = await sessionResult(id, s.body.id);
    expect([result.status, result.data]).toEqual(['completed', { uid: '1000', home: '/home/sandbox', owner: 'sandbox' }]);
    const reset = await api('PATCH', `/v1/agents/${id}`, { body: { user: null } });
    expect([reset.status, reset.body.user]).toEqual([200, null]);
    const bad = await api('PATCH', `/v1/agents/${id}`, { body: { user: 'admin' } });
    expect([bad.status, bad.body.error?.type]).toEqual([400, 'invalid_request']);
  });
});
