import { WebSocket } from 'ws';
import { api, Res, T, unique } from '../../helpers/env';
import { conversationWithForkGroup } from '../../helpers/conversations';
import { otherOrgKey } from '../../helpers/checkpoints';
import { Attached } from '../../helpers/exec';

/*
 * Walks /openapi.json and calls every operation (path × method) without a key, with a wrong key, and
 * with a key of another organisation on the first organisation's resources. A route added later is
 * walked too: its path parameters must be fillable from FILL below, or the walk fails naming it.
 */

/** Routes answered without a key on purpose (none of them is in /openapi.json), and why. */
const PUBLIC: Record<string, string> = {
  '/healthz': 'liveness probe for orchestrators: answers {status: "ok"} and nothing else',
  '/readyz': 'readiness probe for orchestrators: names the state of MongoDB and Temporal, no data of anyone',
  '/metrics': 'Prometheus scrape: labels hold route patterns and counters, never ids; loopback peers only without METRICS_TOKEN (operator.test.ts)',
  '/openapi.json': 'the description of the API itself',
  // Signed file URLs (/api/files/<token>) carry their own authorisation, an HMAC over the organisation, sandbox,
  // path, method and expiry; files.test.ts covers forged, expired and wrong-method tokens (403).
  // Previews served by host name (<sandbox id>-p<port>.<domain>, any path) are public unless created with a
  // bearer token, by design (a browser opens them); previews.test.ts covers their tokens and 404s.
};

/** The operator's routes (every organisation's fleet): a tenant's key gets 403 (operator.test.ts covers an operator's). */
const OPERATOR_ONLY = new Set(['GET /api/hosts']);

/** WebSocket routes (express-ws): /openapi.json does not describe them. */
const WS_ROUTES = ['/api/sandboxes/{id}/exec/{sessionID}'];

/** The resources of one organisation that path parameters name. */
interface Ids {
  agent: string;
  session: string;
  batch: string;
  instance: string;
  sandbox: string;
  checkpoint: string;
  patch: string;
  snapshot: string;
  port: string;
  exec: string;
  agentSession: string;
  /** A secret store, by its name (paths take an id or a name; agents' secret_store takes the name). */
  secretStore: string;
  secretName: string;
  conversation: string;
  forkGroup: string;
}

/**
 * How to fill a path parameter, by the path segment before it and its name (`id` means a different
 * resource under sessions, batches, instances and sandboxes). A new parameter needs a line here.
 */
const FILL: Record<string, keyof Ids> = {
  'agents/{agentId}': 'agent',
  'sessions/{id}': 'session',
  'batches/{id}': 'batch',
  'instances/{id}': 'instance',
  'sandboxes/{id}': 'sandbox',
  'checkpoints/{checkpointId}': 'checkpoint',
  'from-checkpoint/{checkpointId}': 'checkpoint',
  'patches/{patchId}': 'patch',
  'snapshots/{idOrName}': 'snapshot',
  'preview/{port}': 'port',
  'exec/{sessionID}': 'exec',
  'agent/{sessionID}': 'agentSession',
  'secret-stores/{id}': 'secretStore',
  'secrets/{name}': 'secretName',
  'conversations/{conversationId}': 'conversation',
  'forks/{group}': 'forkGroup',
};

/** Ids of the same shapes that exist nowhere: another organisation must not tell them from real ones. */
const z16 = '0'.repeat(16);
const GHOST: Ids = {
  agent: 'ghost-agent-0',
  session: `sess_${z16}`,
  batch: `batch_${z16}`,
  instance: `inst_${z16}`,
  sandbox: `sb-${z16}`,
  checkpoint: `cp-${z16}`,
  patch: `pa-${z16}-9`,
  snapshot: 'ghost-snapshot-0',
  port: '47999',
  exec: `es-${z16}`,
  agentSession: `as-${z16}`,
  secretStore: 'ghost-store-0',
  secretName: 'GHOST_SECRET_0',
  conversation: `conv_${z16}`,
  forkGroup: `fg_${z16}`,
};

const PORT = 47311;
const Q = 15 * 60 * 1000;
/** An aligned reservation start far enough ahead, on a day of its own. */
const reservationStart = Math.ceil((Date.now() + 200 * 86_400_000) / 86_400_000) * 86_400_000 + 7 * 3600_000;

/** Valid bodies (and queries), so that a call reaches the route's ownership check rather than a 400. */
const BODIES: Record<string, (r: Ids) => unknown> = {
  'POST /v1/agents': () => ({ core: 'bash', entrypoint: ['true'] }),
  'PATCH /v1/agents/{agentId}': () => ({ display_name: 'renamed' }),
  'POST /v1/agents/{agentId}/sessions': () => ({ input: {} }),
  'POST /v1/agents/{agentId}/batches': () => ({ items: [{ input: {} }] }),
  'POST /v1/agents/{agentId}/instances': () => ({}),
  'POST /v1/agents/{agentId}/conversations': () => ({}),
  'POST /v1/conversations/{conversationId}/messages': () => ({ text: 'hi' }),
  'POST /v1/conversations/{conversationId}/rewind': () => ({ turn: 0 }),
  'POST /v1/conversations/{conversationId}/fork': () => ({ turn: 0 }),
  'POST /api/sandboxes': () => ({}),
  'POST /api/sandboxes/{id}/checkpoints': () => ({}),
  'POST /api/sandboxes/from-checkpoint/{checkpointId}': () => ({}),
  'POST /api/sandboxes/checkpoints/{checkpointId}/patches': () => ({ script: 'true' }),
  'POST /api/snapshots': () => ({ name: unique('walk-snap'), image: { steps: [] } }),
  'POST /api/capacity/reservations': () => ({
    startsAt: new Date(reservationStart + 8 * Q).toISOString(),
    endsAt: new Date(reservationStart + 9 * Q).toISOString(),
    capacityGb: 4,
  }),
  'POST /api/sandboxes/{id}/preview': () => ({ port: PORT + 1 }),
  'POST /api/sandboxes/{id}/exec': () => ({ cmd: 'true' }),
  'POST /api/sandboxes/{id}/exec/run': () => ({ cmd: 'true' }),
  'POST /api/sandboxes/{id}/exec/run-async': () => ({ cmd: 'true' }),
  'POST /api/sandboxes/{id}/exec/{sessionID}/kill': () => ({}),
  'POST /api/sandboxes/{id}/agent': () => ({ runner: ['true'] }),
  'POST /api/sandboxes/{id}/agent/{sessionID}/kill': () => ({}),
  'POST /api/secret-stores': () => ({ name: unique('walk-store') }),
  'PUT /api/secret-stores/{id}/secrets/{name}': () => ({ value: 'walk-value' }),
  'POST /api/sandboxes/{id}/timeout': () => ({ timeout: 3600 }),
  'POST /api/sandboxes/{id}/files/rename': () => ({ from: '/tmp/walk-a', to: '/tmp/walk-b' }),
  'POST /api/sandboxes/{id}/files/download-url': () => ({ path: '/etc/passwd' }),
  'POST /api/sandboxes/{id}/files/upload-url': () => ({ path: '/tmp/walk.txt' }),
};
const QUERIES: Record<string, string> = {
  'GET /api/capacity/calendar': `?from=${new Date(reservationStart).toISOString()}&to=${new Date(reservationStart + 4 * Q).toISOString()}`,
  'GET /api/sandboxes/{id}/files': '?path=/etc/passwd',
  'GET /api/sandboxes/{id}/files/stat': '?path=/etc/passwd',
  'PUT /api/sandboxes/{id}/files': '?path=/tmp/walk.txt',
  'DELETE /api/sandboxes/{id}/files': '?path=/tmp/walk.txt',
  'POST /api/sandboxes/{id}/files/mkdir': '?path=/tmp/walk-dir',
};

/**
 * Operations without path parameters act on the caller's own organisation. GETs among them are lists,
 * checked for the other organisation's ids; the others create, and either name another resource in
 * their body (then the other organisation's resource is refused: CROSS_BODIES) or name none (NO_REFERENCE).
 */
const CROSS_BODIES: Record<string, (a: Ids) => unknown> = {
  'POST /api/sandboxes': (a) => ({ snapshot: a.snapshot }),
  'POST /api/snapshots': (a) => ({ name: unique('walk-steal'), checkpointId: a.checkpoint }),
  // An agent's snapshot is looked up in the caller's organisation when a session starts; its secret store at once.
  'POST /v1/agents': (a) => ({ core: 'bash', entrypoint: ['true'], secret_store: a.secretStore }),
};
const NO_REFERENCE: Record<string, string> = {
  'POST /api/secret-stores': 'a store names only itself',
  'POST /api/capacity/reservations': 'a reservation names only times and a size',
  'POST /codec/decode':
    "payloads name their organisation in their metadata: another organisation's come back as sent (payload-encryption.test.ts, with PAYLOAD_ENCRYPTION=on)",
  'POST /api/codec/link': "no body: the link is the caller's key's",
};

interface Op {
  method: string;
  template: string;
  params: string[];
  hasBody: boolean;
  name: string;
}

/** `segment/{param}` keys of a path's parameters, in order. */
function paramKeys(template: string): string[] {
  const parts = template.split('/');
  return parts.flatMap((p, i) => (/^\{\w+\}$/.test(p) ? [`${parts[i - 1]}/${p}`] : []));
}

function fill(op: Op, ids: Ids): string {
  let path = op.template;
  for (const key of paramKeys(op.template)) {
    const kind = FILL[key];
    if (!kind) throw new Error(`no FILL entry for ${key} (${op.name})`);
    path = path.replace(key.slice(key.indexOf('/') + 1), encodeURIComponent(ids[kind]));
  }
  return path + (QUERIES[op.name] ?? '');
}

function call(op: Op, ids: Ids, key: string | null, extra: { query?: string; body?: unknown } = {}): Promise<Res> {
  const body = extra.body ?? (op.hasBody ? (BODIES[op.name]?.(ids) ?? {}) : undefined);
  const path = fill(op, ids);
  return api(op.method, path + (extra.query ? (path.includes('?') ? '&' : '?') + extra.query : ''), { key, body });
}

/** Every value of `ids` that must not show in the other organisation's answers. */
function secretsOf(ids: Ids, except: (keyof Ids)[] = []): string[] {
  return (Object.keys(ids) as (keyof Ids)[]).filter((k) => k !== 'port' && !except.includes(k)).map((k) => ids[k]);
}

/** The answer with A's ids swapped for the ghost ids, to compare with the answer about the ghosts. */
function normalised(r: Res, ids: Ids): string {
  let s = JSON.stringify({ status: r.status, body: r.body });
  for (const k of Object.keys(ids) as (keyof Ids)[]) s = s.split(ids[k]).join(GHOST[k]);
  return s;
}

interface WsOutcome {
  opened: boolean;
  httpStatus?: number;
  close?: number;
  texts: string[];
  binaryFrames: number;
}

/** Opens a WebSocket and records what happens until it closes (or is refused at the HTTP level). */
function wsProbe(path: string, headers: Record<string, string> = {}): Promise<WsOutcome> {
  return new Promise((resolve) => {
    const out: WsOutcome = { opened: false, texts: [], binaryFrames: 0 };
    const ws = new WebSocket(T.api().replace(/^http/, 'ws') + path, { headers });
    ws.on('unexpected-response', (_req, res) => {
      out.httpStatus = res.statusCode;
      res.resume();
      res.on('end', () => resolve(out));
      res.on('error', () => resolve(out));
    });
    ws.on('open', () => (out.opened = true));
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      if (isBinary) out.binaryFrames++;
      else out.texts.push(data.toString());
    });
    ws.on('close', (code) => {
      out.close = code;
      resolve(out);
    });
    ws.on('error', () => undefined);
  });
}

const errorType = (o: WsOutcome): string | undefined => {
  try {
    return (JSON.parse(o.texts[0] ?? '') as { error?: { type?: string } }).error?.type;
  } catch {
    return undefined;
  }
};

describe('every route authenticates and hides other organisations (walked from /openapi.json)', () => {
  let ops: Op[] = [];
  let keyA = '';
  let keyB = '';
  const a = {} as Ids;
  let sandboxB = '';
  let agentB = false;
  const toDelete: (() => Promise<unknown>)[] = [];

  beforeAll(async () => {
    const doc = (await api('GET', '/openapi.json', { key: null })).body as {
      paths: Record<string, Record<string, { parameters?: { name: string; in: string }[]; requestBody?: unknown }>>;
    };
    for (const [template, methods] of Object.entries(doc.paths)) {
      for (const [method, o] of Object.entries(methods)) {
        const m = method.toUpperCase();
        ops.push({
          method: m,
          template,
          params: (o.parameters ?? []).filter((p) => p.in === 'path').map((p) => p.name),
          hasBody: o.requestBody !== undefined,
          name: `${m} ${template}`,
        });
      }
    }
    // Reads first, then creates, then deletes: a leaking delete must not spoil the other checks.
    const order = ['GET', 'PATCH', 'POST', 'PUT', 'DELETE'];
    ops = ops.sort((x, y) => order.indexOf(x.method) - order.indexOf(y.method));

    keyA = await otherOrgKey(unique('walk-a'));
    keyB = await otherOrgKey(unique('walk-b'));
    const must = async (what: string, p: Promise<Res>, status = 201): Promise<any> => {
      const r = await p;
      if (r.status !== status) throw new Error(`${what}: ${r.status} ${JSON.stringify(r.body)}`);
      return r.body;
    };
    const asA = (method: string, path: string, body?: unknown) => api(method, path, { key: keyA, body });

    a.agent = unique('walk-agent');
    await must('agent', asA('POST', '/v1/agents', { id: a.agent, core: 'bash', entrypoint: ['bash', '-c', 'echo "{}" > /tmp/agent_result.json'] }));
    toDelete.push(() => asA('DELETE', `/v1/agents/${a.agent}`));
    a.session = (await must('session', asA('POST', `/v1/agents/${a.agent}/sessions`, { input: {} }))).id;
    a.batch = (await must('batch', asA('POST', `/v1/agents/${a.agent}/batches`, { items: [{ input: {} }] }))).id;
    a.instance = (await must('instance', asA('POST', `/v1/agents/${a.agent}/instances`, {}))).id;
    toDelete.push(() => asA('DELETE', `/v1/agents/${a.agent}/instances/${a.instance}`));
    const conv = await conversationWithForkGroup(asA, a.agent);
    [a.conversation, a.forkGroup] = [conv.conversation, conv.group];
    toDelete.push(conv.archive);
    a.sandbox = (await must('sandbox', asA('POST', '/api/sandboxes', {}))).sandboxID;
    toDelete.push(() => asA('DELETE', `/api/sandboxes/${a.sandbox}`));
    a.exec = (await must('exec', asA('POST', `/api/sandboxes/${a.sandbox}/exec`, { cmd: 'bash', args: ['-c', 'echo ready; sleep 600'] }))).sessionID;
    a.agentSession = (await must('agent session', asA('POST', `/api/sandboxes/${a.sandbox}/agent`, { runner: ['sleep', '600'] }))).sessionID;
    a.port = String(PORT);
    await must('preview', asA('POST', `/api/sandboxes/${a.sandbox}/preview`, { port: PORT }));
    a.checkpoint = (await must('checkpoint', asA('POST', `/api/sandboxes/${a.sandbox}/checkpoints`, {}))).id;
    toDelete.push(() => asA('DELETE', `/api/sandboxes/${a.sandbox}/checkpoints/${a.checkpoint}`));
    a.patch = (await must('patch', asA('POST', `/api/sandboxes/checkpoints/${a.checkpoint}/patches`, { script: 'true' }))).patch.id;
    a.snapshot = (await must('snapshot', asA('POST', '/api/snapshots', { name: unique('walk-snap'), checkpointId: a.checkpoint }))).name;
    toDelete.push(() => asA('DELETE', `/api/snapshots/${a.snapshot}`));
    a.secretStore = (await must('secret store', asA('POST', '/api/secret-stores', { name: unique('walk-store') }))).name;
    toDelete.push(() => asA('DELETE', `/api/secret-stores/${a.secretStore}`));
    a.secretName = `WALK_SECRET_${Date.now().toString(36).toUpperCase()}`;
    await must('secret', asA('PUT', `/api/secret-stores/${a.secretStore}/secrets/${a.secretName}`, { value: 'walk-value' }), 200);
    await must(
      'reservation',
      asA('POST', '/api/capacity/reservations', {
        startsAt: new Date(reservationStart).toISOString(),
        endsAt: new Date(reservationStart + Q).toISOString(),
        capacityGb: 8,
      }),
    );
    // The session's result is readable once it ended.
    await must('session end', asA('GET', `/v1/agents/${a.agent}/sessions/${a.session}?wait=60`), 200);
  }, 240_000);

  afterAll(async () => {
    // In reverse order of creation: the snapshot before its checkpoint, the checkpoint before its sandbox.
    for (const undo of toDelete.reverse()) await undo().catch(() => undefined);
    if (sandboxB) await api('DELETE', `/api/sandboxes/${sandboxB}`, { key: keyB }).catch(() => undefined);
    if (agentB) await api('DELETE', `/v1/agents/${a.agent}`, { key: keyB }).catch(() => undefined);
  }, 120_000);

  const fillable = (op: Op) => paramKeys(op.template).every((k) => FILL[k]);

  it('can fill every path parameter of every operation, and the document has none of the public routes', () => {
    expect(ops.length).toBeGreaterThan(40);
    const unfillable = ops
      .filter((op) => !fillable(op))
      .map(
        (op) =>
          `${op.name} (${paramKeys(op.template)
            .filter((k) => !FILL[k])
            .join(', ')})`,
      );
    expect(unfillable).toEqual([]);
    // Every parameter the document declares appears in its path, so FILL covers them all.
    for (const op of ops)
      expect(op.params.map((p) => `{${p}}`).sort()).toEqual(
        paramKeys(op.template)
          .map((k) => k.split('/')[1])
          .sort(),
      );
    for (const p of Object.keys(PUBLIC)) expect(ops.filter((op) => op.template === p)).toEqual([]);
  });

  it("fills parameters with the first organisation's real resources (it can read each of them)", async () => {
    const failures: string[] = [];
    for (const op of ops.filter((o) => o.method === 'GET' && o.params.length > 0 && fillable(o))) {
      const r = await call(op, a, keyA);
      if (r.status !== 200) failures.push(`${op.name}: ${r.status} ${JSON.stringify(r.body)}`);
    }
    expect(failures).toEqual([]);
  });

  it('answers 401 with the error body to every operation called without a key or with a wrong key', async () => {
    const failures: string[] = [];
    for (const op of ops.filter(fillable)) {
      const tries: [string, Promise<Res>][] = [
        ['no key', call(op, a, null)],
        ['wrong key (header)', call(op, a, 'sap_not-a-key-of-anyone')],
        ['wrong key (query)', call(op, a, null, { query: 'api_key=sap_not-a-key-of-anyone' })],
      ];
      for (const [how, p] of tries) {
        const r = await p;
        if (r.status !== 401 || r.body?.error?.type !== 'unauthorized' || typeof r.body.error.message !== 'string') {
          failures.push(`${op.name} with ${how}: ${r.status} ${JSON.stringify(r.body)}`);
        }
      }
    }
    expect(failures).toEqual([]);
  });

  it('shows each organisation its own storage use only (GET /api/usage)', async () => {
    const [ua, ub] = await Promise.all([api('GET', '/api/usage', { key: keyA }), api('GET', '/api/usage', { key: keyB })]);
    expect([ua.status, ub.status]).toEqual([200, 200]);
    expect(ua.body.storage.checkpoints).toBeGreaterThanOrEqual(1);
    expect(ua.body.storage.snapshots).toBeGreaterThanOrEqual(1);
    // B has stored nothing yet (its creates come later in this file).
    expect(ub.body.storage).toMatchObject({ usedBytes: 0, checkpoints: 0, snapshots: 0 });
  });

  it("answers 404 to another organisation on the first one's resources, exactly as for ids that exist nowhere", async () => {
    const failures: string[] = [];
    for (const op of ops.filter((o) => o.params.length > 0 && fillable(o))) {
      const ghost = await call(op, GHOST, keyB);
      const real = await call(op, a, keyB);
      if (real.status !== 404 || real.body?.error?.type !== 'not_found') failures.push(`${op.name}: ${real.status} ${JSON.stringify(real.body)}`);
      else if (normalised(real, a) !== normalised(ghost, a))
        failures.push(`${op.name}: answers differ from a missing id: ${JSON.stringify(real.body)} vs ${JSON.stringify(ghost.body)}`);
    }
    expect(failures).toEqual([]);
  });

  it("keeps the first organisation's resources out of the other's lists, and refuses them in bodies", async () => {
    const failures: string[] = [];
    const secrets = secretsOf(a);
    for (const op of ops.filter((o) => o.params.length === 0)) {
      if (op.method === 'GET') {
        const r = await call(op, a, keyB);
        const text = JSON.stringify(r.body);
        const want = OPERATOR_ONLY.has(op.name) ? 403 : 200;
        if (r.status !== want) failures.push(`${op.name}: ${r.status} ${text}`);
        for (const s of secrets) if (text.includes(s)) failures.push(`${op.name} shows ${s}`);
      } else if (CROSS_BODIES[op.name]) {
        const r = await call(op, a, keyB, { body: CROSS_BODIES[op.name]!(a) });
        if (r.status !== 400 || r.body?.error?.type !== 'invalid_request')
          failures.push(`${op.name} with the other organisation's resource in its body: ${r.status} ${JSON.stringify(r.body)}`);
      } else if (!NO_REFERENCE[op.name]) {
        failures.push(`${op.name}: list it in CROSS_BODIES (with a body naming the first organisation's resource) or in NO_REFERENCE (with why)`);
      }
    }
    // The calendar counts only the caller's own reservations.
    const cal = await api('GET', `/api/capacity/calendar${QUERIES['GET /api/capacity/calendar']}`, { key: keyB });
    if (cal.body?.intervals?.some((i: { reservedGb: number }) => i.reservedGb !== 0))
      failures.push(`the calendar shows the other organisation's reservation: ${JSON.stringify(cal.body.intervals)}`);
    const mine = await api('GET', `/api/capacity/calendar${QUERIES['GET /api/capacity/calendar']}`, { key: keyA });
    expect(mine.body.intervals[0].reservedGb).toBe(8);
    expect(failures).toEqual([]);
  });

  it("answers 404 when the other organisation names its own agent (same id) or sandbox over the first one's sessions, execs and more", async () => {
    await api('POST', '/v1/agents', { key: keyB, body: { id: a.agent, core: 'bash', entrypoint: ['true'] } }).then((r) => expect(r.status).toBe(201));
    agentB = true;
    const sb = await api('POST', '/api/sandboxes', { key: keyB, body: {} });
    expect(sb.status).toBe(201);
    sandboxB = sb.body.sandboxID;
    const mixed: Ids = { ...a, sandbox: sandboxB };
    const failures: string[] = [];
    const secrets = secretsOf(a, ['agent']);
    for (const op of ops.filter(fillable)) {
      const keys = paramKeys(op.template);
      const parent = keys[0];
      if (parent !== 'agents/{agentId}' && parent !== 'sandboxes/{id}') continue;
      if (keys.length >= 2) {
        const r = await call(op, mixed, keyB);
        if (r.status !== 404 || r.body?.error?.type !== 'not_found') failures.push(`${op.name} via its own parent: ${r.status} ${JSON.stringify(r.body)}`);
      } else if (op.method === 'GET') {
        const r = await call(op, mixed, keyB);
        const text = JSON.stringify(r.body);
        if (r.status !== 200) failures.push(`${op.name} via its own parent: ${r.status} ${text}`);
        for (const s of secrets) if (text.includes(s)) failures.push(`${op.name} via its own parent shows ${s}`);
      }
    }
    expect(failures).toEqual([]);
  });

  it('answers the public routes without a key, with nothing of any organisation in them', async () => {
    for (const [path, why] of Object.entries(PUBLIC)) {
      const r = await api('GET', path, { key: null });
      expect([path, why, r.status === 200 || (path === '/readyz' && r.status === 503)]).toEqual([path, why, true]);
      const text = typeof r.body === 'string' ? r.body : JSON.stringify(r.body);
      for (const s of [...secretsOf(a), keyA, keyB]) expect([path, text.includes(s)]).toEqual([path, false]);
    }
  });

  it('refuses WebSocket attaches without a key, with a wrong key and from the other organisation; no upgrade on any route opens without a key', async () => {
    for (const template of WS_ROUTES) {
      for (const session of [a.exec, a.agentSession]) {
        const path = (ids: Ids) => template.replace('{id}', ids.sandbox).replace('{sessionID}', session);
        const cases: [string, string, Record<string, string>, string][] = [
          ['no key', path(a), {}, 'unauthorized'],
          ['wrong key (header)', path(a), { 'x-api-key': 'sap_not-a-key-of-anyone' }, 'unauthorized'],
          ['wrong key (query)', `${path(a)}?api_key=sap_not-a-key-of-anyone`, {}, 'unauthorized'],
          ['other organisation', path(a), { 'x-api-key': keyB }, 'not_found'],
          ['other organisation via its own sandbox', path({ ...a, sandbox: sandboxB || GHOST.sandbox }), { 'x-api-key': keyB }, 'not_found'],
        ];
        for (const [how, p, headers, type] of cases) {
          const o = await wsProbe(p, headers);
          expect([template, session, how, o.close, errorType(o), o.binaryFrames]).toEqual([template, session, how, 1008, type, 0]);
        }
        // The first organisation can attach: the refusals above are not a broken route.
        const own = new Attached(new WebSocket(T.api().replace(/^http/, 'ws') + path(a), { headers: { 'x-api-key': keyA } }));
        try {
          await own.until(() => own.scrollbackDone);
        } finally {
          own.ws.terminate();
        }
      }
    }
    // An upgrade on any other path, without a key, gets the error body in one text frame and a 1008 close.
    const paths = [...ops.filter((o) => o.method === 'GET' && fillable(o)).map((op) => fill(op, a)), '/no/such/route', ...Object.keys(PUBLIC)];
    for (const p of paths) {
      const o = await wsProbe(p);
      // Elsewhere express-ws routes the upgrade as GET <path>/.websocket, which a route with a parameter
      // at its end may take (401 first) or none (404).
      const isWs = WS_ROUTES.some((w) => new RegExp(`^${w.replace(/\{\w+\}/g, '[^/]+')}$`).test(p));
      const type = errorType(o);
      expect([p, o.close, isWs ? type === 'unauthorized' : type === 'unauthorized' || type === 'not_found', o.texts.length, o.binaryFrames]).toEqual([
        p,
        1008,
        true,
        1,
        0,
      ]);
    }
  });
});
