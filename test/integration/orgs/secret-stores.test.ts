import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { MongoClient } from 'mongodb';
import { api as rawApi, eventually, Res, T, unique } from '../../helpers/env';
import { otherOrgKey } from '../../helpers/checkpoints';
import { SecretBox } from '../../../lib/secret-box';
import { DEFAULT_INJECT_INTO } from '../../../contract/sealed';
import type { SecretEntryDoc, SecretStoreDoc } from '../../../store/secrets';

/*
 * Secret stores: CRUD and its errors, secrets reaching sessions', instances' and sandboxes'
 * environments, values never in any answer, log line or stored document, other organisations' 404s.
 */

const sha256 = (s: string): string => createHash('sha256').update(s).digest('hex');

/** Every answer this file gets, to check afterwards that no secret value is in any of them. */
const answers: string[] = [];
async function api(method: string, p: string, opts: Parameters<typeof rawApi>[2] = {}): Promise<Res> {
  const r = await rawApi(method, p, opts);
  answers.push(
    `${method} ${p} ${r.status} ${[...r.headers].map(([k, v]) => `${k}: ${v}`).join('\n')} ${typeof r.body === 'string' ? r.body : JSON.stringify(r.body)}`,
  );
  return r;
}

/** A value that appears nowhere else: the test looks for it in answers, logs and MongoDB. */
const VALUE = `sk-test-${randomBytes(18).toString('hex')}`;
const OTHER_VALUE = `sk-other-${randomBytes(18).toString('hex')}`;

const expectError = (r: Res, status: number, type: string) => {
  expect([r.status, r.body?.error?.type, typeof r.body?.error?.message]).toEqual([status, type, 'string']);
};

describe('secret stores', () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterAll(async () => {
    for (const undo of cleanup.reverse()) await undo().catch(() => undefined);
  }, 120_000);

  async function newStore(secrets: Record<string, string> = {}, key?: string): Promise<{ id: string; name: string }> {
    const name = unique('store');
    const r = await api('POST', '/api/secret-stores', { body: { name }, key });
    expect(r.status).toBe(201);
    cleanup.push(() => api('DELETE', `/api/secret-stores/${r.body.id}`, { key }));
    for (const [k, v] of Object.entries(secrets)) {
      const s = await api('PUT', `/api/secret-stores/${r.body.id}/secrets/${k}`, { body: { value: v }, key });
      expect(s.status).toBe(200);
    }
    return r.body;
  }

  async function newAgent(body: Record<string, unknown>): Promise<string> {
    const id = unique('sec-agent');
    const r = await api('POST', '/v1/agents', { body: { id, core: 'bash', ...body } });
    expect([r.status, r.body?.error]).toEqual([201, undefined]);
    cleanup.push(() => api('DELETE', `/v1/agents/${id}`));
    return id;
  }

  it('creates, lists, reads and deletes stores and secrets; values never come back', async () => {
    const name = unique('store');
    const created = await api('POST', '/api/secret-stores', { body: { name } });
    expect(created.status).toBe(201);
    expect(Object.keys(created.body).sort()).toEqual(['createdAt', 'egressAllowlist', 'id', 'name', 'updatedAt']);
    expect(created.body.egressAllowlist).toEqual([]);
    expect(created.body.id).toMatch(/^ss-[a-z0-9]{16}$/);
    expect(created.body.name).toBe(name);
    cleanup.push(() => api('DELETE', `/api/secret-stores/${created.body.id}`));

    expectError(await api('POST', '/api/secret-stores', { body: { name } }), 409, 'conflict');

    const set = await api('PUT', `/api/secret-stores/${created.body.id}/secrets/API_TOKEN`, { body: { value: VALUE } });
    expect(set.status).toBe(200);
    expect(set.body).toEqual({
      storeId: created.body.id,
      name: 'API_TOKEN',
      allowedHosts: [],
      // Where the value would go if it were sealed: the default (docs/sealed-secrets.md).
      injectInto: [...DEFAULT_INJECT_INTO],
      createdAt: expect.any(String),
      updatedAt: expect.any(String),
    });
    // Replacing keeps the secret's creation time. By name as well as by id.
    const again = await api('PUT', `/api/secret-stores/${name}/secrets/API_TOKEN`, { body: { value: OTHER_VALUE } });
    expect([again.status, again.body.createdAt]).toEqual([200, set.body.createdAt]);
    expect((await api('PUT', `/api/secret-stores/${name}/secrets/SECOND`, { body: { value: 'two' } })).status).toBe(200);

    const byId = await api('GET', `/api/secret-stores/${created.body.id}`);
    const byName = await api('GET', `/api/secret-stores/${name}`);
    expect([byId.status, byId.body.id, byName.status, byName.body.id]).toEqual([200, created.body.id, 200, created.body.id]);
    const list = await api('GET', '/api/secret-stores');
    expect(list.status).toBe(200);
    expect(list.body.filter((s: { id: string }) => s.id === created.body.id)).toEqual([byId.body]);
    const secrets = await api('GET', `/api/secret-stores/${created.body.id}/secrets`);
    expect(secrets.status).toBe(200);
    expect(secrets.body.map((s: Record<string, unknown>) => [s.name, Object.keys(s).sort()])).toEqual([
      ['API_TOKEN', ['allowedHosts', 'createdAt', 'injectInto', 'name', 'storeId', 'updatedAt']],
      ['SECOND', ['allowedHosts', 'createdAt', 'injectInto', 'name', 'storeId', 'updatedAt']],
    ]);

    const del = await api('DELETE', `/api/secret-stores/${created.body.id}/secrets/SECOND`);
    expect([del.status, del.body.name]).toEqual([200, 'SECOND']);
    expectError(await api('DELETE', `/api/secret-stores/${created.body.id}/secrets/SECOND`), 404, 'not_found');
    expect((await api('GET', `/api/secret-stores/${created.body.id}/secrets`)).body.map((s: { name: string }) => s.name)).toEqual(['API_TOKEN']);

    const gone = await api('DELETE', `/api/secret-stores/${name}`);
    expect([gone.status, gone.body.id]).toEqual([200, created.body.id]);
    expectError(await api('GET', `/api/secret-stores/${created.body.id}`), 404, 'not_found');
    expectError(await api('GET', `/api/secret-stores/${created.body.id}/secrets`), 404, 'not_found');
    expectError(await api('PUT', `/api/secret-stores/${created.body.id}/secrets/API_TOKEN`, { body: { value: 'x' } }), 404, 'not_found');
  });

  it('refuses bad names, bad values and unsupported fields with the error body, without echoing the value', async () => {
    for (const name of ['', '-lead', 'has space', 'ss-looks-like-an-id', 'x'.repeat(101)]) {
      expectError(await api('POST', '/api/secret-stores', { body: { name } }), 400, 'invalid_request');
    }
    expectError(await api('POST', '/api/secret-stores', { body: {} }), 400, 'invalid_request');
    // Sealing lists (docs/sealed-secrets.md) hold host names and *.wildcards only.
    expectError(await api('POST', '/api/secret-stores', { body: { name: unique('store'), egressAllowlist: ['10.0.0.1'] } }), 400, 'invalid_request');
    const store = await newStore();
    const put = (n: string, body: unknown) => api('PUT', `/api/secret-stores/${store.id}/secrets/${n}`, { body });
    for (const n of ['1LEADING_DIGIT', 'HAS-DASH']) expectError(await put(n, { value: VALUE }), 400, 'invalid_request');
    expectError(await put('OK_NAME', {}), 400, 'invalid_request');
    expectError(await put('OK_NAME', { value: '' }), 400, 'invalid_request');
    expectError(await put('OK_NAME', { value: 42 }), 400, 'invalid_request');
    expectError(await put('OK_NAME', { value: `${VALUE}\u0000` }), 400, 'invalid_request');
    expectError(await put('OK_NAME', { value: VALUE, allowedHosts: ['*'] }), 400, 'invalid_request');
    // Malformed JSON around a value: Node's parse error quotes the body; the answer must not.
    const bad = await api('PUT', `/api/secret-stores/${store.id}/secrets/OK_NAME`, {
      raw: `{"value": ${VALUE}}`,
      headers: { 'content-type': 'application/json' },
    });
    expectError(bad, 400, 'invalid_request');
    expect(bad.body.error.message).toMatch(/malformed JSON/);
    // Node quotes about ten characters around the error: none of the value's may come back.
    expect(bad.body.error.message).not.toContain(VALUE.slice(0, 6));
    const cut = await api('PUT', `/api/secret-stores/${store.id}/secrets/OK_NAME`, {
      raw: `{"value": "${VALUE}" x}`,
      headers: { 'content-type': 'application/json' },
    });
    expectError(cut, 400, 'invalid_request');
    expect(cut.body.error.message).not.toMatch(new RegExp(VALUE.slice(-6)));
    // None of these stored anything.
    expect((await api('GET', `/api/secret-stores/${store.id}/secrets`)).body).toEqual([]);
  });

  it('refuses an agent naming a missing store (400) and a store delete while an agent names it (409)', async () => {
    expectError(
      await api('POST', '/v1/agents', { body: { id: unique('sec-agent'), core: 'bash', entrypoint: ['true'], secret_store: unique('nope') } }),
      400,
      'invalid_request',
    );
    const store = await newStore();
    const agent = await newAgent({ entrypoint: ['true'] });
    expectError(await api('PATCH', `/v1/agents/${agent}`, { body: { secret_store: unique('nope') } }), 400, 'invalid_request');
    // The implicit `default` store needs not exist (it is every agent's default).
    expect((await api('PATCH', `/v1/agents/${agent}`, { body: { secret_store: 'default' } })).status).toBe(200);
    const patched = await api('PATCH', `/v1/agents/${agent}`, { body: { secret_store: store.name } });
    expect([patched.status, patched.body.secret_store]).toEqual([200, store.name]);
    const refused = await api('DELETE', `/api/secret-stores/${store.id}`);
    expectError(refused, 409, 'conflict');
    expect(refused.body.error.message).toContain(agent);
    expect((await api('DELETE', `/v1/agents/${agent}`)).status).toBe(200);
    expect((await api('DELETE', `/api/secret-stores/${store.id}`)).status).toBe(200);
  });

  it("deletes a sandbox's store with the sandbox (kill({ deleteSecretStore: true })), but not while an agent names it", async () => {
    const store = await newStore({ TOKEN_A: 'value-a' });
    const agent = await newAgent({ entrypoint: ['true'], secret_store: store.name });
    const sb = await api('POST', '/api/sandboxes', { body: { secretStore: store.name } });
    expect(sb.status).toBe(201);
    cleanup.push(() => api('DELETE', `/api/sandboxes/${sb.body.sandboxID}`));
    const refused = await api('DELETE', `/api/sandboxes/${sb.body.sandboxID}?deleteSecretStore=true`);
    expectError(refused, 409, 'conflict');
    expect((await api('GET', `/api/sandboxes/${sb.body.sandboxID}`)).body.status).toBe('running'); // nothing killed
    expect((await api('DELETE', `/v1/agents/${agent}`)).status).toBe(200);
    const killed = await api('DELETE', `/api/sandboxes/${sb.body.sandboxID}?deleteSecretStore=true`);
    expect([killed.status, killed.body.status]).toEqual([200, 'stopped']);
    expect((await api('GET', `/api/secret-stores/${store.id}`)).status).toBe(404);
  });

  it("puts a store's secrets into the environment of sessions, instances and sandboxes (the caller's env wins)", async () => {
    const store = await newStore({ API_TOKEN: VALUE, CLASH: 'from-store', ONLY_STORE: 'store-only' });
    // The entrypoint writes hashes, never the value, so results do not carry it.
    const script = [
      'h=$(printf %s "$API_TOKEN" | sha256sum | cut -d" " -f1)',
      'printf \'{"sha":"%s","clash":"%s","only":"%s","len":%d}\' "$h" "$CLASH" "$ONLY_STORE" "${#API_TOKEN}" > /tmp/agent_result.json',
    ].join('; ');
    const agent = await newAgent({ entrypoint: ['bash', '-c', script], secret_store: store.name, env: { CLASH: 'from-agent' } });
    const s = await api('POST', `/v1/agents/${agent}/sessions`, { body: { input: {} } });
    expect(s.status).toBe(201);
    const done = await eventually(async () => {
      const r = await api('GET', `/v1/agents/${agent}/sessions/${s.body.id}`);
      return ['completed', 'failed'].includes(r.body.status) ? r.body : undefined;
    }, 60_000);
    expect(done.status).toBe('completed');
    const result = await api('GET', `/v1/agents/${agent}/sessions/${s.body.id}/result`);
    expect(result.status).toBe(200);
    expect(JSON.stringify(result.body)).toContain(sha256(VALUE));
    expect(JSON.stringify(result.body)).toContain('"clash":"from-agent"');
    expect(JSON.stringify(result.body)).toContain('"only":"store-only"');

    // An instance of the agent: its sandbox has the secrets too.
    const inst = await api('POST', `/v1/agents/${agent}/instances`, { body: {} });
    expect(inst.status).toBe(201);
    cleanup.push(() => api('DELETE', `/v1/agents/${agent}/instances/${inst.body.id}`));
    const running = await eventually(async () => {
      const r = await api('GET', `/v1/agents/${agent}/instances/${inst.body.id}`);
      if (r.body.status === 'failed') throw new Error(`instance failed: ${JSON.stringify(r.body)}`);
      return r.body.status === 'running' && r.body.sandbox_id ? r.body : undefined;
    }, 60_000);
    const hashCmd = { cmd: 'bash', args: ['-c', 'printf %s "$API_TOKEN" | sha256sum | cut -d" " -f1; echo "$CLASH"'] };
    const inInstance = await api('POST', `/api/sandboxes/${running.sandbox_id}/exec/run`, { body: hashCmd });
    expect([inInstance.status, inInstance.body.stdout]).toEqual([200, `${sha256(VALUE)}\nfrom-agent\n`]);

    // A sandbox created with secretStore (OpenComputer's option), by the store's name; its envs win.
    const sb = await api('POST', '/api/sandboxes', { body: { secretStore: store.name, envs: { CLASH: 'from-envs' } } });
    expect(sb.status).toBe(201);
    cleanup.push(() => api('DELETE', `/api/sandboxes/${sb.body.sandboxID}`));
    const inSandbox = await api('POST', `/api/sandboxes/${sb.body.sandboxID}/exec/run`, { body: hashCmd });
    expect([inSandbox.status, inSandbox.body.stdout]).toEqual([200, `${sha256(VALUE)}\nfrom-envs\n`]);
    expectError(await api('POST', '/api/sandboxes', { body: { secretStore: unique('nope') } }), 400, 'invalid_request');

    // From a checkpoint: the store is named again (nothing of the source sandbox's env is inherited).
    const cp = await api('POST', `/api/sandboxes/${sb.body.sandboxID}/checkpoints`, { body: {} });
    expect(cp.status).toBe(201);
    cleanup.push(() => api('DELETE', `/api/sandboxes/${sb.body.sandboxID}/checkpoints/${cp.body.id}`));
    const envCheck = { cmd: 'bash', args: ['-c', 'printf %s "${API_TOKEN-unset}" | sha256sum | cut -d" " -f1'] };
    for (const [body, expected] of [
      [{ secretStore: store.name }, sha256(VALUE)],
      [{}, sha256('unset')],
    ] as const) {
      const fork = await api('POST', `/api/sandboxes/from-checkpoint/${cp.body.id}`, { body });
      expect(fork.status).toBe(201);
      cleanup.push(() => api('DELETE', `/api/sandboxes/${fork.body.sandboxID}`));
      const run = await api('POST', `/api/sandboxes/${fork.body.sandboxID}/exec/run`, { body: envCheck });
      expect([JSON.stringify(body), run.body.stdout]).toEqual([JSON.stringify(body), `${expected}\n`]);
    }

    // A secret deleted now reaches new sandboxes only: the running one keeps it.
    expect((await api('DELETE', `/api/secret-stores/${store.id}/secrets/API_TOKEN`)).status).toBe(200);
    const later = await api('POST', '/api/sandboxes', { body: { secretStore: store.name } });
    expect(later.status).toBe(201);
    cleanup.push(() => api('DELETE', `/api/sandboxes/${later.body.sandboxID}`));
    const laterRun = await api('POST', `/api/sandboxes/${later.body.sandboxID}/exec/run`, {
      body: { cmd: 'bash', args: ['-c', 'echo "[${API_TOKEN-unset}]"'] },
    });
    expect(laterRun.body.stdout).toBe('[unset]\n');
    const oldRun = await api('POST', `/api/sandboxes/${sb.body.sandboxID}/exec/run`, { body: hashCmd });
    expect(oldRun.body.stdout).toBe(`${sha256(VALUE)}\nfrom-envs\n`);
  }, 180_000);

  it('hides stores from other organisations (404, as for stores that exist nowhere) and refuses them in bodies', async () => {
    const store = await newStore({ API_TOKEN: VALUE });
    const keyB = await otherOrgKey(unique('sec-b'));
    for (const ref of [store.id, store.name]) {
      for (const [method, p, body] of [
        ['GET', `/api/secret-stores/${ref}`, undefined],
        ['GET', `/api/secret-stores/${ref}/secrets`, undefined],
        ['PUT', `/api/secret-stores/${ref}/secrets/API_TOKEN`, { value: 'stolen' }],
        ['DELETE', `/api/secret-stores/${ref}/secrets/API_TOKEN`, undefined],
        ['DELETE', `/api/secret-stores/${ref}`, undefined],
      ] as const) {
        const r = await api(method, p, { key: keyB, body });
        expect([method, p, r.status, r.body?.error?.type]).toEqual([method, p, 404, 'not_found']);
      }
    }
    const listB = await api('GET', '/api/secret-stores', { key: keyB });
    expect([listB.status, JSON.stringify(listB.body).includes(store.id), JSON.stringify(listB.body).includes(store.name)]).toEqual([200, false, false]);
    expectError(
      await api('POST', '/v1/agents', { key: keyB, body: { id: unique('sec-agent'), core: 'bash', entrypoint: ['true'], secret_store: store.name } }),
      400,
      'invalid_request',
    );
    expectError(await api('POST', '/api/sandboxes', { key: keyB, body: { secretStore: store.name } }), 400, 'invalid_request');
    // B may have a store of the same name: names are per organisation.
    const same = await api('POST', '/api/secret-stores', { key: keyB, body: { name: store.name } });
    expect(same.status).toBe(201);
    cleanup.push(() => api('DELETE', `/api/secret-stores/${same.body.id}`, { key: keyB }));
    // The secret is still A's, unchanged.
    expect((await api('GET', `/api/secret-stores/${store.id}/secrets`)).body.map((s: { name: string }) => s.name)).toEqual(['API_TOKEN']);
  });

  it('fails clearly, without retrying for ever, when a secret does not open with the key (SECRETS_KEY changed)', async () => {
    const store = await newStore();
    const client = new MongoClient(T.mongo());
    try {
      await client.connect();
      const doc = await client.db().collection<SecretStoreDoc>('secret_stores').findOne({ id: store.id });
      const now = new Date();
      // Sealed with another key, in the right context: as if SECRETS_KEY had changed since.
      const value = new SecretBox(randomBytes(32)).seal(OTHER_VALUE, `${doc!.orgId}/${store.id}/BROKEN`);
      await client
        .db()
        .collection<SecretEntryDoc>('secret_entries')
        .insertOne({ _id: `${store.id}/BROKEN`, orgId: doc!.orgId, storeId: store.id, name: 'BROKEN', value, createdAt: now, updatedAt: now });
    } finally {
      await client.close();
    }
    const sb = await api('POST', '/api/sandboxes', { body: { secretStore: store.name } });
    expectError(sb, 500, 'internal');
    expect(sb.body.error.message).toMatch(/BROKEN.*does not open with this SECRETS_KEY/);
    const agent = await newAgent({ entrypoint: ['bash', '-c', 'echo {} > /tmp/agent_result.json'], secret_store: store.name });
    const s = await api('POST', `/v1/agents/${agent}/sessions`, { body: { input: {} } });
    expect(s.status).toBe(201);
    const done = await eventually(async () => {
      const r = await api('GET', `/v1/agents/${agent}/sessions/${s.body.id}`);
      return ['completed', 'failed'].includes(r.body.status) ? r.body : undefined;
    }, 60_000);
    expect([done.status, done.outcome?.reason]).toEqual(['failed', 'provisioning_failed']);
    expect(done.outcome.message).toMatch(/does not open with this SECRETS_KEY/);
    // The agent can go once Temporal's visibility has the session ended; then the store can.
    await eventually(async () => (await api('DELETE', `/v1/agents/${agent}`)).status === 200, 30_000, 500);
    expect((await api('DELETE', `/api/secret-stores/${store.id}`)).status).toBe(200);
  }, 120_000);

  it('keeps values out of every answer above, every log line and MongoDB (sealed at rest)', async () => {
    expect(answers.length).toBeGreaterThan(40);
    for (const v of [VALUE, OTHER_VALUE]) {
      expect(answers.filter((a) => a.includes(v))).toEqual([]);
    }
    // The logs are written (each request is logged with its path), and none has a value.
    const logs = ['api.log', 'worker.log', 'host.log'].map((f) => path.join(T.logDir(), f));
    await eventually(async () => fs.readFileSync(logs[0]!, 'utf8').includes('/api/secret-stores/'), 10_000);
    for (const file of logs) {
      const text = fs.readFileSync(file, 'utf8');
      expect([file, text.length > 0, text.includes(VALUE), text.includes(OTHER_VALUE)]).toEqual([file, true, false, false]);
    }
    const client = new MongoClient(T.mongo());
    try {
      await client.connect();
      const entries = await client.db().collection('secret_entries').find({}).toArray();
      expect(entries.length).toBeGreaterThan(0);
      const text = JSON.stringify(entries);
      expect([text.includes(VALUE), text.includes(OTHER_VALUE), text.includes(Buffer.from(VALUE).toString('base64'))]).toEqual([false, false, false]);
      for (const e of entries) expect(e.value).toMatch(/^v1:[A-Za-z0-9+/]+=*$/);
    } finally {
      await client.close();
    }
  });
});
