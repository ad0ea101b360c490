/**
 * Temporal payloads encrypted per organisation (PAYLOAD_ENCRYPTION=on; docs/threat-model.md,
 * "Payloads per organisation"), on a stack of this file's own: sessions and batches still run end to
 * end; the raw history (read with a Temporal client without the codec) holds no input; search
 * attributes and summaries stay readable; the codec endpoint opens a payload for its organisation's
 * key only (and its signed link, for the Temporal UI, likewise), with CORS for the UI's origin only.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { Client, Connection } from '@temporalio/client';
import { freePort, startStack, type Stack } from '../../../scripts/launcher';
import { PROJECT_ROOT } from '../../../config';
import { eventually } from '../../helpers/env';
import { ownStackEnv } from '../../helpers/own-stack-env';

jest.setTimeout(240_000);

const BOOT_KEY = 'payload-encryption-boot-key';
const TOKEN = 'payload-encryption-token-0123456789';
const UI = 'http://temporal-ui.test.invalid:8233';
const CANARY = `canary-${randomBytes(8).toString('hex')}`;

let stack: Stack;
let dataDir: string;
let connection: Connection | undefined;
let keyA = '';
let keyB = '';
let operator = '';
let agent = '';

async function call<T = any>(method: string, p: string, body?: unknown, key: string | null = keyA, headers: Record<string, string> = {}) {
  const res = await fetch(p.startsWith('http') ? p : `${stack.apiUrl}${p}`, {
    method,
    headers: { ...(key ? { 'x-api-key': key } : {}), ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, body: (text ? JSON.parse(text) : null) as T };
}

const keysCli = async (args: string[]) =>
  JSON.parse(
    (
      await promisify(execFile)(process.execPath, [path.join(PROJECT_ROOT, 'dist/scripts/keys.js'), ...args], {
        env: { ...process.env, MONGO_URL: stack.mongoUrl },
      })
    ).stdout,
  );

beforeAll(async () => {
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sap-payload-enc-'));
  stack = await startStack({
    dataDir,
    apiPort: await freePort(),
    temporalPort: await freePort(),
    mongoPort: await freePort(),
    hostPort: await freePort(),
    apiKey: BOOT_KEY,
    hostToken: TOKEN,
    env: await ownStackEnv({
      PAYLOAD_ENCRYPTION: 'on',
      TEMPORAL_UI_URL: UI,
    }),
  });
  connection = await Connection.connect({ address: stack.temporalAddress });
  keyA = (await keysCli(['create', '--org', 'enc-a'])).key;
  keyB = (await keysCli(['create', '--org', 'enc-b'])).key;
  operator = (await keysCli(['create', '--org', 'enc-ops', '--role', 'operator'])).key;
  agent = `enc-${Date.now().toString(36)}`;
  const r = await call('POST', '/v1/agents', { id: agent, core: 'bash', entrypoint: ['bash', '-c', 'cat "$AGENT_INPUT_PATH" > /tmp/agent_result.json'] });
  expect(r.status).toBe(201);
}, 200_000);

afterAll(async () => {
  await connection?.close().catch(() => undefined);
  await stack?.stop({ destroySandboxes: true });
  const keep = path.join(os.tmpdir(), 'sap-payload-enc-last-logs');
  fs.rmSync(keep, { recursive: true, force: true });
  if (dataDir && fs.existsSync(path.join(dataDir, 'logs'))) fs.cpSync(path.join(dataDir, 'logs'), keep, { recursive: true });
  if (dataDir) fs.rmSync(dataDir, { recursive: true, force: true });
});

/**
 * A history as text with every payload's metadata and data as raw bytes (what someone reading
 * Temporal's database sees), not base64: walks the message's fields itself (the protobuf classes'
 * toJSON would write bytes as base64, which no plain canary could ever match).
 */
function historyText(history: unknown): string {
  const out: string[] = [];
  const walk = (v: unknown): void => {
    if (v instanceof Uint8Array) out.push(Buffer.from(v).toString('latin1'));
    else if (Array.isArray(v)) v.forEach(walk);
    else if (v && typeof v === 'object')
      for (const [k, x] of Object.entries(v)) {
        out.push(k);
        walk(x);
      }
    else if (v !== null && v !== undefined) out.push(String(v));
  };
  walk(history);
  return out.join(' ');
}
const b64 = (u: Uint8Array | null | undefined) => Buffer.from(u ?? new Uint8Array()).toString('base64');
const asJson = (p: { metadata?: Record<string, Uint8Array> | null; data?: Uint8Array | null }) => ({
  metadata: Object.fromEntries(Object.entries(p.metadata ?? {}).map(([k, v]) => [k, b64(v)])),
  data: b64(p.data),
});
const dataText = (payloads: { data?: string }[]) => payloads.map((p) => Buffer.from(p.data ?? '', 'base64').toString('utf8')).join('\n');

describe('payloads encrypted per organisation', () => {
  let sessionId = '';
  let startPayloads: { metadata: Record<string, string>; data: string }[] = [];

  it('runs a session end to end with its input and result encrypted in the history, and its search attributes and summary readable', async () => {
    const s = await call('POST', `/v1/agents/${agent}/sessions`, { input: { secret: CANARY } });
    expect(s.status).toBe(201);
    sessionId = s.body.id;
    const done = await call('GET', `/v1/agents/${agent}/sessions/${sessionId}?wait=60`);
    expect(done.status).toBe(200);
    expect(done.body.status).toBe('completed');
    expect(done.body.result).toEqual({ secret: CANARY });

    // A Temporal client without the codec: what the UI (or anyone with Temporal's database) sees.
    const raw = new Client({ connection, namespace: 'default' });
    const handle = raw.workflow.getHandle(sessionId);
    const history = await handle.fetchHistory();
    const text = historyText(history);
    expect(text).toContain('binary/encrypted');
    expect(text).not.toContain(CANARY);
    const started = history.events![0]!.workflowExecutionStartedEventAttributes!;
    startPayloads = started.input!.payloads!.map(asJson);
    expect(Buffer.from(started.input!.payloads![0]!.metadata!['encryption-org']!).toString()).toBe('enc-a');
    const d = await handle.describe();
    expect(d.typedSearchAttributes.getAll().map((a) => [a.key.name, a.value])).toEqual(
      expect.arrayContaining([
        ['OrgId', 'enc-a'],
        ['AgentId', agent],
      ]),
    );
    const summary = await d.staticSummary();
    expect(summary).toContain(`session ${sessionId}`);
    expect(summary).not.toContain(CANARY);
    expect(d.status.name).toBe('COMPLETED');
  });

  it("opens the session's input through the codec endpoint for its organisation's key only (another's, and an operator's, get ciphertext back)", async () => {
    const own = await call('POST', '/codec/decode', { payloads: startPayloads }, keyA);
    expect(own.status).toBe(200);
    expect(dataText(own.body.payloads)).toContain(CANARY);
    const other = await call('POST', '/codec/decode', { payloads: startPayloads }, keyB);
    expect(other.status).toBe(200);
    expect(other.body.payloads).toEqual(startPayloads);
    const op = await call('POST', '/codec/decode', { payloads: startPayloads }, operator);
    expect(op.status).toBe(200);
    expect(dataText(op.body.payloads)).not.toContain(CANARY);
    expect((await call('POST', '/codec/decode', { payloads: startPayloads }, null)).status).toBe(401);
  });

  it("gives each key a signed codec link for the UI's setting: it opens that organisation's payloads only, and stops with its key", async () => {
    const linkA = await call('POST', '/api/codec/link', undefined, keyA);
    expect(linkA.status).toBe(201);
    expect(linkA.body.endpoint).toMatch(/\/codec\/[\w-]+\.[\w-]+$/);
    const viaA = await call('POST', `${linkA.body.endpoint}/decode`, { payloads: startPayloads }, null);
    expect(dataText(viaA.body.payloads)).toContain(CANARY);
    const linkB = await call('POST', '/api/codec/link', undefined, keyB);
    const viaB = await call('POST', `${linkB.body.endpoint}/decode`, { payloads: startPayloads }, null);
    expect(viaB.body.payloads).toEqual(startPayloads);
    // A forged link, and the link of a revoked key.
    const forged = linkA.body.endpoint.replace(/\.[\w-]+$/, '.AAAA');
    expect((await call('POST', `${forged}/decode`, { payloads: startPayloads }, null)).status).toBe(403);
    const spare = (await keysCli(['create', '--org', 'enc-a'])).key;
    const spareLink = (await call('POST', '/api/codec/link', undefined, spare)).body.endpoint;
    expect((await call('POST', `${spareLink}/decode`, { payloads: startPayloads }, null)).status).toBe(200);
    await keysCli(['revoke', '--key', spare]);
    expect((await call('POST', `${spareLink}/decode`, { payloads: startPayloads }, null)).status).toBe(401);
  });

  it("answers the codec endpoint's preflight with CORS headers for the Temporal UI's origin only", async () => {
    const pre = await call('OPTIONS', '/codec/decode', undefined, null, { origin: UI, 'access-control-request-method': 'POST' });
    expect(pre.status).toBe(204);
    expect(pre.headers.get('access-control-allow-origin')).toBe(UI);
    expect(pre.headers.get('access-control-allow-headers')).toContain('x-namespace');
    const evil = await call('OPTIONS', '/codec/decode', undefined, null, { origin: 'http://evil.test.invalid', 'access-control-request-method': 'POST' });
    expect(evil.headers.get('access-control-allow-origin')).toBeNull();
    // No other route answers CORS.
    const api = await call('GET', '/v1/agents', undefined, keyA, { origin: UI });
    expect(api.headers.get('access-control-allow-origin')).toBeNull();
  });

  it("runs a batch end to end with its items' inputs encrypted in their sessions' histories", async () => {
    const b = await call('POST', `/v1/agents/${agent}/batches`, { items: [{ input: { secret: `${CANARY}-1` } }, { input: { secret: `${CANARY}-2` } }] });
    expect(b.status).toBe(201);
    const done = await eventually(
      async () => {
        const r = await call('GET', `/v1/agents/${agent}/batches/${b.body.id}`);
        return r.body.status === 'completed' ? r.body : null;
      },
      120_000,
      500,
    );
    expect(done.counts ?? done).toMatchObject({ completed: 2 });
    const raw = new Client({ connection, namespace: 'default' });
    const text = historyText(await raw.workflow.getHandle(b.body.id).fetchHistory());
    expect(text).toContain('binary/encrypted');
    expect(text).not.toContain(CANARY);
    const items: string[] = [];
    for await (const wf of raw.workflow.list({ query: `BatchId = "${b.body.id}" AND WorkflowType = "sessionWorkflow"` })) items.push(wf.workflowId);
    expect(items).toHaveLength(2);
    for (const id of items) expect(historyText(await raw.workflow.getHandle(id).fetchHistory())).not.toContain(CANARY);
  });
});
