/**
 * The operator role (docs/threat-model.md, "The operator role"): the fleet's views (the hosts, the
 * Temporal UI's address, /metrics) answer operator keys only, made with the operator's CLI; a tenant's
 * key is refused them (403) and keeps its own resources.
 */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { api, T, unique } from '../../helpers/env';
import { otherOrgKey } from '../../helpers/checkpoints';

jest.setTimeout(60_000);

const ROOT = path.resolve(__dirname, '..', '..', '..');
const keysCli = (args: string[]) =>
  promisify(execFile)(process.execPath, [path.join(ROOT, 'dist/scripts/keys.js'), ...args], { env: { ...process.env, MONGO_URL: T.mongo() } });

let tenant = '';
let operator = '';
beforeAll(async () => {
  tenant = await otherOrgKey(unique('op-tenant'));
  operator = await otherOrgKey(unique('op-operator'), 'operator');
});

describe('the operator role', () => {
  it("answers GET /api/hosts to an operator's key only: a tenant's gets 403 with the error body", async () => {
    for (const key of [tenant, T.key()]) {
      const r = await api('GET', '/api/hosts', { key });
      expect(r.status).toBe(403);
      expect(r.body.error.type).toBe('forbidden');
      expect(r.body.error.message).toMatch(/^operator only/);
      expect(JSON.stringify(r.body)).not.toMatch(/hostId|reservedMB/);
    }
    const op = await api('GET', '/api/hosts', { key: operator });
    expect(op.status).toBe(200);
    expect(op.body.hosts.length).toBeGreaterThan(0);
    expect(op.body.hosts[0]).toHaveProperty('reservedMB');
  });

  it("gives the Temporal UI's address to an operator's key only, and each key its role", async () => {
    const t = await api('GET', '/api/console/config', { key: tenant });
    expect(t.status).toBe(200);
    expect(t.body).toEqual({ temporalUiUrl: null, temporalNamespace: expect.any(String), role: 'tenant' });
    const o = await api('GET', '/api/console/config', { key: operator });
    expect(o.body).toEqual({ temporalUiUrl: 'http://temporal-ui.test.invalid:8233', temporalNamespace: t.body.temporalNamespace, role: 'operator' });
  });

  it("keeps an operator's key to its own organisation's resources elsewhere (it is not a skeleton key)", async () => {
    const agent = unique('op-agent');
    expect((await api('POST', '/v1/agents', { key: tenant, body: { id: agent, core: 'bash', entrypoint: ['true'] } })).status).toBe(201);
    try {
      expect((await api('GET', `/v1/agents/${agent}`, { key: operator })).status).toBe(404);
      expect((await api('GET', '/v1/agents', { key: operator })).body.agents.map((a: { id: string }) => a.id)).not.toContain(agent);
    } finally {
      await api('DELETE', `/v1/agents/${agent}`, { key: tenant });
    }
  });

  it("answers /metrics (every organisation's counters) to loopback and operator keys, never to a tenant's key", async () => {
    // The test stack sets no METRICS_TOKEN: this runner is a loopback peer.
    const open = await fetch(`${T.api()}/metrics`);
    expect(open.status).toBe(200);
    expect(await open.text()).toContain('sap_http_request_duration_seconds');
    const asTenant = await api('GET', '/metrics', { key: tenant });
    expect(asTenant.status).toBe(403);
    expect(asTenant.body.error.type).toBe('forbidden');
    const asOperator = await fetch(`${T.api()}/metrics`, { headers: { 'x-api-key': operator } });
    expect(asOperator.status).toBe(200);
    expect((await api('GET', '/metrics', { key: 'sap_not-a-key-of-anyone' })).status).toBe(401);
  });

  it('documents the 403 of the operator routes, and no route of the API makes keys', async () => {
    const doc = (await api('GET', '/openapi.json', { key: null })).body;
    expect(Object.keys(doc.paths['/api/hosts'].get.responses)).toContain('403');
    expect(doc.paths['/api/hosts'].get.summary).toMatch(/operator keys only/);
    expect(Object.keys(doc.paths).filter((p) => /key/i.test(p))).toEqual([]);
  });

  it('makes operator keys with the CLI only when asked (tenant by default), refuses other roles, and lists each key with its role', async () => {
    const org = unique('op-cli');
    const plain = JSON.parse((await keysCli(['create', '--org', org])).stdout);
    expect(plain.role).toBe('tenant');
    expect((await api('GET', '/api/hosts', { key: plain.key })).status).toBe(403);
    const op = JSON.parse((await keysCli(['create', '--org', org, '--role', 'operator', '--label', 'ops'])).stdout);
    expect(op.role).toBe('operator');
    await expect(keysCli(['create', '--org', org, '--role', 'admin'])).rejects.toMatchObject({ code: 2 });
    const listed = (await keysCli(['list', '--org', org])).stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(listed.map((k: { role: string; label: string }) => [k.label, k.role]).sort()).toEqual([
      ['cli', 'tenant'],
      ['ops', 'operator'],
    ]);
  });
});
