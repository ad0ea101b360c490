/**
 * Templates as OpenComputer's clients ask for them (`Sandbox.create({ template })`): base, default,
 * node and python are all the base image, which has every runtime; the sandbox keeps the name it
 * was asked for; any other name is refused with the list.
 */
import { api } from '../../helpers/env';
import { runSdk } from '../../helpers/sdk';

describe('templates', () => {
  it('creates sandboxes from node, python and default with the published client; each has its runtime and says its template', async () => {
    const r = await runSdk(`
      const made = {};
      try {
        for (const [template, cmd] of [['node', 'node -e "console.log(process.version)"'], ['python', 'python3 -c "import sys; print(sys.version_info[0])"'], ['default', 'node -v && python3 -V']]) {
          const sb = await sdk.Sandbox.create({ ...opts, template });
          made[template] = { id: sb.sandboxId, run: await sb.exec.run(cmd) };
        }
        let refused = null;
        try { await sdk.Sandbox.create({ ...opts, template: 'ubuntu-gpu' }); } catch (e) { refused = String(e.message); }
        out({ made, refused });
      } finally {
        for (const m of Object.values(made)) await sdk.Sandbox.connect(m.id, opts).then((s) => s.kill()).catch(() => undefined);
      }
    `);
    expect(r.made.node.run).toMatchObject({ exitCode: 0, stdout: expect.stringMatching(/^v\d+\./) });
    expect(r.made.python.run).toMatchObject({ exitCode: 0, stdout: '3\n' });
    expect(r.made.default.run).toMatchObject({ exitCode: 0, stdout: expect.stringMatching(/^v\d+\.[\s\S]*Python 3\./) });
    for (const template of ['node', 'python', 'default']) {
      const got = await api('GET', `/api/sandboxes/${r.made[template].id}`);
      expect([got.status, got.body.templateID]).toEqual([200, template]);
    }
    expect(r.refused).toContain('400');
    expect(r.refused).toContain('the templates are base, default, node, python');
  });

  it('refuses unknown templates over raw HTTP with the list, and answers the name asked for', async () => {
    for (const templateID of ['ubuntu-gpu', 'Node', 'base ', '__proto__', 'constructor', 'x'.repeat(200)]) {
      const r = await api('POST', '/api/sandboxes', { body: { templateID } });
      expect([r.status, r.body.error?.type]).toEqual([400, 'invalid_request']);
      expect(r.body.error.message).toContain('the templates are base, default, node, python');
    }
    expect((await api('POST', '/api/sandboxes', { body: { templateID: 'x'.repeat(201) } })).status).toBe(400);
    const made = await api('POST', '/api/sandboxes', { body: { templateID: 'python' } });
    try {
      expect([made.status, made.body.templateID]).toEqual([201, 'python']);
      const listed = (await api('GET', '/api/sandboxes')).body.find((s: { sandboxID: string }) => s.sandboxID === made.body.sandboxID);
      expect(listed?.templateID).toBe('python');
    } finally {
      if (made.body?.sandboxID) await api('DELETE', `/api/sandboxes/${made.body.sandboxID}`);
    }
  });
});
