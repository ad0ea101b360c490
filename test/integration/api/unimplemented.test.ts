/**
 * The client calls this server does not implement answer 501 with the error body naming the call,
 * after authentication and the 404 for another organisation's sandbox (never a 404 that looks like a
 * missing sandbox for a sandbox that exists). The list is the README's.
 */
import fs from 'node:fs';
import path from 'node:path';
import { api } from '../../helpers/env';
import { otherOrgKey } from '../../helpers/checkpoints';
import { newSandbox } from '../../helpers/sandboxes';
import { runSdk } from '../../helpers/sdk';
import { UNIMPLEMENTED } from '../../../api/routes/unimplemented';

let sb: string;
beforeAll(async () => {
  sb = await newSandbox({});
});
afterAll(async () => {
  await api('DELETE', `/api/sandboxes/${sb}`);
});

const fill = (p: string, id: string) => p.replace(':id', id).replace(':name', 'some-template');

describe('calls of the client that are not implemented', () => {
  it('answer 501 naming the call, 401 without a key, 404 for another organisation, and are listed in the README', async () => {
    const other = await otherOrgKey();
    const readme = fs.readFileSync(path.join(__dirname, '..', '..', '..', 'docs', 'api', 'sandboxes.md'), 'utf8');
    for (const u of UNIMPLEMENTED) {
      const method = u.method.toUpperCase();
      const body = method === 'GET' || method === 'DELETE' ? undefined : {};
      const r = await api(method, fill(u.path, sb), { body });
      expect({ call: u.call, status: r.status, type: r.body?.error?.type }).toEqual({ call: u.call, status: 501, type: 'not_implemented' });
      expect(r.body.error.message).toContain(u.call);
      expect((await api(method, fill(u.path, sb), { body, key: null })).status).toBe(401);
      if (u.path.includes(':id')) {
        expect({ call: u.call, status: (await api(method, fill(u.path, sb), { body, key: other })).status }).toEqual({ call: u.call, status: 404 });
        expect((await api(method, fill(u.path, 'sb-0000000000000000'), { body })).status).toBe(404);
      }
      expect(readme).toContain(`\`${u.call}\``);
    }
  });

  it('refuses create options it would otherwise ignore (previewAuth, webhooks) with 501, creating nothing', async () => {
    for (const extra of [{ previewAuth: { scheme: 'bearer', token: 'auto' } }, { webhooks: [{ url: 'http://example.com/hook' }] }]) {
      const marker = `refused-${Date.now().toString(36)}-${Object.keys(extra)[0]}`;
      const r = await api('POST', '/api/sandboxes', { body: { ...extra, metadata: { marker } } });
      expect([r.status, r.body.error.type]).toEqual([501, 'not_implemented']);
      expect(r.body.error.message).toMatch(/Sandbox\.create\(\{ (previewAuth|webhooks) \}\)/);
      const mine = (await api('GET', '/api/sandboxes')).body.filter((s: { metadata: Record<string, string> }) => s.metadata.marker === marker);
      expect(mine).toEqual([]);
    }
  });

  it('surface through the client as its errors with the 501 status', async () => {
    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      const msgs = [];
      for (const f of [() => sb.setAutoscale({ enabled: true }), () => sb.getAutoscale(), () => sb.mounts.list()]) {
        try { await f(); msgs.push('ok'); } catch (e) { msgs.push(String(e.message)); }
      }
      out(msgs);
    `,
      { SB: sb },
    );
    for (const m of r) expect(m).toMatch(/501/);
  });
});
