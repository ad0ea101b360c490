import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { api, T } from '../../helpers/env';

const run = promisify(execFile);
const ROOT = path.resolve(__dirname, '..', '..', '..');

describe('health, readiness and the OpenAPI document', () => {
  it('answers /healthz and /readyz without a key', async () => {
    expect((await api('GET', '/healthz', { key: null })).status).toBe(200);
    const ready = await api('GET', '/readyz', { key: null });
    expect(ready.status).toBe(200);
    expect(ready.body).toMatchObject({ status: 'ok', mongo: 'ok', temporal: 'ok' });
  });

  it('publishes an OpenAPI 3.1 document generated from the route schemas', async () => {
    const doc = await api('GET', '/openapi.json', { key: null });
    expect(doc.status).toBe(200);
    expect(doc.body.openapi).toBe('3.1.0');
    expect(Object.keys(doc.body.paths)).toEqual(expect.arrayContaining(['/v1/agents', '/v1/agents/{agentId}', '/v1/agents/{agentId}/sessions/{id}/result']));
    expect(doc.body.components.schemas.CreateAgent.required).toEqual(expect.arrayContaining(['core', 'entrypoint']));
  });
});

describe('authentication', () => {
  it('refuses a missing key with 401 and the error body', async () => {
    const r = await api('GET', '/v1/agents', { key: null });
    expect(r.status).toBe(401);
    expect(r.body).toEqual({ error: { type: 'unauthorized', message: expect.stringMatching(/X-API-Key/) } });
  });

  it('refuses an unknown key with 401', async () => {
    const r = await api('GET', '/v1/agents', { key: 'not-a-key' });
    expect(r.status).toBe(401);
    expect(r.body.error.type).toBe('unauthorized');
  });

  it("hides one organisation's agents from another (404), with a key from the admin command", async () => {
    const env = { ...process.env, MONGO_URL: T.mongo() };
    const { stdout } = await run(process.execPath, [path.join(ROOT, 'dist/scripts/keys.js'), 'create', '--org', 'acme'], { env });
    const { key } = JSON.parse(stdout) as { key: string };
    expect(key).toMatch(/^sap_/);
    const created = await api('POST', '/v1/agents', { body: { id: 'acme-only', core: 'bash', entrypoint: ['true'] }, key });
    expect(created.status).toBe(201);
    expect((await api('GET', '/v1/agents/acme-only', { key })).status).toBe(200);
    const other = await api('GET', '/v1/agents/acme-only');
    expect(other.status).toBe(404);
    expect(other.body.error.type).toBe('not_found');
    const list = await api('GET', '/v1/agents');
    expect(list.body.agents.map((a: { id: string }) => a.id)).not.toContain('acme-only');
    // The same id is free in another organisation.
    expect((await api('POST', '/v1/agents', { body: { id: 'acme-only', core: 'bash', entrypoint: ['true'] } })).status).toBe(201);
  });

  it('stores keys hashed, never in clear', async () => {
    const { MongoClient } = await import('mongodb');
    const client = await MongoClient.connect(T.mongo());
    try {
      const docs = await client.db().collection('api_keys').find({}).toArray();
      expect(docs.length).toBeGreaterThan(0);
      expect(JSON.stringify(docs)).not.toContain(T.key());
    } finally {
      await client.close();
    }
  });
});

describe('the error body for each kind of bad input', () => {
  it('unknown route: 404', async () => {
    const r = await api('GET', '/v1/nothing-here');
    expect(r.status).toBe(404);
    expect(r.body.error).toEqual({ type: 'not_found', message: expect.any(String) });
  });

  it('malformed JSON: 400', async () => {
    const r = await api('POST', '/v1/agents', { raw: '{"core": "bash",', headers: { 'content-type': 'application/json' } });
    expect(r.status).toBe(400);
    expect(r.body.error.type).toBe('invalid_request');
    expect(r.body.error.message).toMatch(/malformed JSON/);
  });

  it('wrong types: 400 naming the field', async () => {
    const r = await api('POST', '/v1/agents', { body: { core: 'bash', entrypoint: 'not-an-array' } });
    expect(r.status).toBe(400);
    expect(r.body.error.message).toMatch(/body\.entrypoint/);
  });

  it('oversized body: 413', async () => {
    const r = await api('POST', '/v1/agents', {
      raw: JSON.stringify({ core: 'bash', entrypoint: ['x'], config: { pad: 'x'.repeat(9 * 1024 * 1024) } }),
      headers: { 'content-type': 'application/json' },
    });
    expect(r.status).toBe(413);
    expect(r.body.error.type).toBe('payload_too_large');
  });

  it('a body that is not JSON: 415', async () => {
    const r = await api('POST', '/v1/agents', { raw: 'core=bash', headers: { 'content-type': 'text/plain' } });
    expect(r.status).toBe(415);
    expect(r.body.error.type).toBe('unsupported_media_type');
  });

  it('never an HTML page or a stack trace', async () => {
    const r = await api('POST', '/v1/agents/%ZZ/sessions', { body: {} });
    expect(r.status).toBeGreaterThanOrEqual(400);
    expect(typeof r.body).toBe('object');
    expect(JSON.stringify(r.body)).not.toMatch(/<html|at .*\.js:\d+/i);
  });
});

describe('docker-compose.yml', () => {
  it('is a valid compose file', async () => {
    await expect(run('docker-compose', ['-f', path.join(ROOT, 'docker-compose.yml'), 'config', '-q'])).resolves.toBeDefined();
  });
});
