/**
 * Conversations' turn checkpoints against the real stack: garbage collection (a rewind frees the
 * checkpoints of the turns it left that nothing stands on; a fork's base and the layers under it
 * stay) and the storage quota (a turn at the quota is refused with 507 before anything is stored,
 * after garbage collection). A bash runner (test/fixtures/conversation-runner.sh) stands in for a
 * model. Everything runs in an organisation of its own: its storage use is read exactly, and its
 * quota lowered without touching other tests'.
 */
import fs from 'node:fs';
import path from 'node:path';
import { api, eventually, T, unique, withMongo } from '../../helpers/env';
import { hostSh, newSandbox } from '../../helpers/sandboxes';
import { otherOrgKey } from '../../helpers/checkpoints';

jest.setTimeout(300_000);

const RUNNER = fs.readFileSync(path.join(__dirname, '..', '..', 'fixtures', 'conversation-runner.sh'), 'utf8');

type Turn = { turn: number; status: string; left: boolean; checkpointId: string | null; checkpointFreed: boolean };

describe('conversation checkpoints: garbage collection and the storage quota', () => {
  const MIB = 1024 * 1024;
  const org = unique('conv-gc');
  let key: string;
  let agent: string;
  const mine: string[] = [];
  const sandboxes: string[] = [];
  const as = (method: string, p: string, body?: unknown, headers: Record<string, string> = {}) => api(method, p, { key, body, headers });
  const setQuota = (mb: number | null) =>
    withMongo((c) =>
      c
        .db()
        .collection('orgs')
        .updateOne({ _id: org as never }, mb === null ? { $unset: { 'settings.storageQuotaMB': '' } } : { $set: { 'settings.storageQuotaMB': mb } }),
    );
  const usedBytes = async (): Promise<number> => (await as('GET', '/api/usage')).body.storage.usedBytes as number;
  const turnsOf = async (id: string): Promise<Turn[]> => (await as('GET', `/v1/conversations/${id}/turns`)).body.turns;
  const done = (id: string, n: number) =>
    eventually(
      async () => {
        const t = (await turnsOf(id)).find((x) => x.turn === n);
        return t && t.status !== 'running' && t.checkpointId && (await as('GET', `/v1/conversations/${id}`)).body.headTurn >= n ? t : undefined;
      },
      60_000,
      100,
    );
  const start = async (input: string): Promise<string> => {
    const r = await as('POST', `/v1/agents/${agent}/conversations`, { runner: ['bash', '/opt/runner.sh'], idleSeconds: 3600, input });
    expect(r.status).toBe(201);
    mine.push(r.body.id);
    return r.body.id as string;
  };
  const memory = async (id: string) => (await readFileAs(key, (await as('GET', `/v1/conversations/${id}`)).body.sandboxId, '/root/.claude/memory.txt')).text;

  beforeAll(async () => {
    key = await otherOrgKey(org);
    agent = unique('conv-gc-agent');
    const r = await as('POST', '/v1/agents', { id: agent, core: 'bash', entrypoint: ['true'], files: { '/opt/runner.sh': RUNNER }, user: 'root' });
    expect(r.status).toBe(201);
  });

  afterAll(async () => {
    await setQuota(null).catch(() => undefined);
    // Forks first (a conversation with forks is not deleted), then their parents.
    for (const id of [...mine].reverse()) {
      await as('POST', `/v1/conversations/${id}/archive`).catch(() => undefined);
      await as('DELETE', `/v1/conversations/${id}`).catch(() => undefined);
    }
    for (const sb of sandboxes) {
      const cps = await as('GET', `/api/sandboxes/${sb}/checkpoints`).catch(() => null);
      for (const cp of Array.isArray(cps?.body) ? (cps.body as { id: string }[]) : [])
        await as('DELETE', `/api/sandboxes/${sb}/checkpoints/${cp.id}`).catch(() => undefined);
      await as('DELETE', `/api/sandboxes/${sb}`).catch(() => undefined);
    }
    await as('DELETE', `/v1/agents/${agent}`).catch(() => undefined);
  });

  test('a rewind frees the checkpoints of the turns it left that nothing stands on; a fork made from a left turn keeps its base (and the layers under it)', async () => {
    const id = await start('a');
    await done(id, 1);
    for (const [n, text] of [
      [2, 'b'],
      [3, 'c'],
      [4, 'd'],
    ] as const) {
      expect((await as('POST', `/v1/conversations/${id}/messages`, { text })).status).toBe(202);
      await done(id, n);
    }
    // A fork at turn 3, made before the rewind that leaves turn 3.
    const f = await as('POST', `/v1/conversations/${id}/fork`, { turn: 3 });
    expect(f.status).toBe(201);
    const fid: string = f.body.forks[0].id;
    mine.push(fid);
    const sandboxId: string = (await as('GET', `/v1/conversations/${id}`)).body.sandboxId;
    const before = await turnsOf(id);
    const cp4 = before.find((t) => t.turn === 4)!.checkpointId!;
    // A turn's checkpoint is read by id like any other; it is freed by its conversation only (409 to a delete).
    expect((await as('GET', `/api/sandboxes/${sandboxId}/checkpoints/${cp4}`)).body).toMatchObject({ id: cp4, status: 'ready' });
    const del = await as('DELETE', `/api/sandboxes/${sandboxId}/checkpoints/${cp4}`);
    expect(del.status).toBe(409);
    expect(del.body.error.message).toContain(`turn 4 of conversation ${id}`);
    const listed = async () => (await as('GET', `/api/sandboxes/${sandboxId}/checkpoints`)).body as { id: string; sizeBytes: number }[];
    const size4 = (await listed()).find((c) => c.id === cp4)!.sizeBytes;
    expect(size4).toBeGreaterThan(0);
    const used = await usedBytes();

    const rw = await as('POST', `/v1/conversations/${id}/rewind`, { turn: 1 });
    expect(rw.status).toBe(200);
    expect(rw.body).toEqual({ headTurn: 1, left: [2, 3, 4] });
    // Behind the answer: turn 4's checkpoint is freed; turn 3 (the fork's base) and turn 2 (under it) stay.
    const after = await eventually(async () => {
      const ts = await turnsOf(id);
      return ts.find((t) => t.turn === 4)?.checkpointFreed ? ts : undefined;
    }, 60_000);
    expect(after.map((t) => [t.turn, t.left, t.checkpointFreed])).toEqual([
      [1, false, false],
      [2, true, false],
      [3, true, false],
      [4, true, true],
    ]);
    const cps = (await listed()).map((c) => c.id);
    expect(cps).not.toContain(cp4);
    for (const t of after.filter((x) => x.turn < 4)) expect(cps).toContain(t.checkpointId);
    // On the host: turn 4's layer is removed (nothing stands on it); turn 3's, under the fork, and turn 2's, under turn 3's, stay.
    const onHost = (cpId: string) => fs.existsSync(path.join(T.dataDir(), 'layers', cpId, 'layer.json'));
    await eventually(async () => !onHost(cp4), 30_000);
    for (const t of after.filter((x) => x.turn === 2 || x.turn === 3)) expect(onHost(t.checkpointId!)).toBe(true);
    expect(await usedBytes()).toBe(used - size4);

    // A freed turn is refused, with the reason; a kept left turn still forks.
    for (const [p, body] of [
      [`/v1/conversations/${id}/fork`, { turn: 4 }],
      [`/v1/conversations/${id}/rewind`, { turn: 4 }],
    ] as const) {
      const r = await as('POST', p, body);
      expect(r.status).toBe(409);
      expect(r.body.error.type).toBe('conflict');
      expect(r.body.error.message).toMatch(/turn 4 .* has no checkpoint any more/);
    }
    // The fork stands on turn 3: its next turn continues from there.
    expect((await as('POST', `/v1/conversations/${fid}/messages`, { text: 'x' })).status).toBe(202);
    await done(fid, 4);
    expect(await memory(fid)).toBe('a\nb\nc\nx\n');
    // A rewind to the kept left turn 3 puts it (and turn 2) back on the line.
    expect((await as('POST', `/v1/conversations/${id}/rewind`, { turn: 3 })).status).toBe(200);
    expect((await turnsOf(id)).map((t) => [t.turn, t.left])).toEqual([
      [1, false],
      [2, false],
      [3, false],
      [4, true],
    ]);
    expect(await memory(id)).toBe('a\nb\nc\n');
  });

  test('at the storage quota a message is refused with 507 and nothing is stored, a repeated create or message is answered as before; once space is freed it is accepted', async () => {
    const createKey = unique('create');
    const created = await as(
      'POST',
      `/v1/agents/${agent}/conversations`,
      { runner: ['bash', '/opt/runner.sh'], idleSeconds: 3600, input: 'one' },
      { 'idempotency-key': createKey },
    );
    expect(created.status).toBe(201);
    const id: string = created.body.id;
    mine.push(id);
    await done(id, 1);
    const messageKey = unique('two');
    const two = await as('POST', `/v1/conversations/${id}/messages`, { text: 'two' }, { 'idempotency-key': messageKey });
    expect(two.status).toBe(202);
    expect(two.body.turn).toBe(2);
    await done(id, 2);
    // Fill the organisation: a sandbox checkpoint of 3 MB, then a quota just above what the conversations use.
    const sb = await newSandbox({}, { key, created: sandboxes });
    await hostSh(sb, 'mkdir -p /workspace && head -c 3000000 /dev/urandom > /workspace/blob');
    const cp = await as('POST', `/api/sandboxes/${sb}/checkpoints`, { name: 'filler' });
    expect(cp.status).toBe(201);
    const conversationsUse = (await usedBytes()) - (cp.body.sizeBytes as number);
    await setQuota(Math.floor(conversationsUse / MIB) + 1);
    const t0 = await turnsOf(id);
    const c0 = (await as('GET', `/v1/conversations/${id}`)).body;
    const e0 = (await as('GET', `/v1/conversations/${id}/events?after=0&level=internal&limit=500`)).body.events.length;

    // Repeats store nothing: they are answered as the first time.
    const again = await as(
      'POST',
      `/v1/agents/${agent}/conversations`,
      { runner: ['bash', '/opt/runner.sh'], idleSeconds: 3600, input: 'one' },
      { 'idempotency-key': createKey },
    );
    expect(again.status).toBe(200);
    expect(again.body.id).toBe(id);
    const twoAgain = await as('POST', `/v1/conversations/${id}/messages`, { text: 'two' }, { 'idempotency-key': messageKey });
    expect(twoAgain.status).toBe(202);
    expect(twoAgain.body).toEqual(two.body);

    const refused = await as('POST', `/v1/conversations/${id}/messages`, { text: 'three' }, { 'idempotency-key': unique('full') });
    expect(refused.status).toBe(507);
    expect(refused.body.error.type).toBe('insufficient_storage');
    expect(refused.body.error.message).toMatch(/storage quota reached/);
    // Nothing of it was stored: no turn, no event, the conversation as it was.
    expect(await turnsOf(id)).toEqual(t0);
    expect((await as('GET', `/v1/conversations/${id}/events?after=0&level=internal&limit=500`)).body.events.length).toBe(e0);
    expect((await as('GET', `/v1/conversations/${id}`)).body).toMatchObject({ turns: c0.turns, headTurn: c0.headTurn, status: 'idle' });
    // A fork would store checkpoints too.
    expect((await as('POST', `/v1/conversations/${id}/fork`, { turn: 1 })).status).toBe(507);

    // Space freed: the message is a turn again.
    expect((await as('DELETE', `/api/sandboxes/${sb}/checkpoints/${cp.body.id}`)).status).toBe(200);
    const ok = await as('POST', `/v1/conversations/${id}/messages`, { text: 'three' });
    expect(ok.status).toBe(202);
    expect(ok.body.turn).toBe(3);
    await done(id, 3);
    expect(await memory(id)).toBe('one\ntwo\nthree\n');
    await setQuota(null);
  });

  test('at the quota, garbage collection frees what only a deleted fork kept, and the message is admitted; while the fork stands it is not', async () => {
    await setQuota(null);
    const id = await start('p');
    await done(id, 1);
    const sandboxId: string = (await as('GET', `/v1/conversations/${id}`)).body.sandboxId;
    // Turn 2's checkpoint holds 3 MB.
    await hostSh(sandboxId, 'head -c 3000000 /dev/urandom > /workspace/big');
    expect((await as('POST', `/v1/conversations/${id}/messages`, { text: 'q' })).status).toBe(202);
    await done(id, 2);
    expect((await as('POST', `/v1/conversations/${id}/messages`, { text: 'r' })).status).toBe(202);
    await done(id, 3);
    const f = await as('POST', `/v1/conversations/${id}/fork`, { turn: 3 });
    expect(f.status).toBe(201);
    const fid: string = f.body.forks[0].id;
    mine.push(fid);
    await eventually(async () => (await as('GET', `/v1/conversations/${fid}`)).body.status === 'idle', 60_000);
    // Turns 2 and 3 are left, but the fork stands on turn 3 (and so on turn 2): nothing is freed.
    expect((await as('POST', `/v1/conversations/${id}/rewind`, { turn: 1 })).status).toBe(200);
    const t2 = (await turnsOf(id)).find((t) => t.turn === 2)!;
    const size2 = ((await as('GET', `/api/sandboxes/${sandboxId}/checkpoints`)).body as { id: string; sizeBytes: number }[]).find(
      (c) => c.id === t2.checkpointId,
    )!.sizeBytes;
    expect(size2).toBeGreaterThan(2 * MIB);
    // A quota that what is stored reaches, and that freeing turn 2's checkpoint gets under.
    const used = await usedBytes();
    await setQuota(Math.floor((used - size2) / MIB) + 1);
    expect((await as('POST', `/v1/conversations/${id}/messages`, { text: 's' })).status).toBe(507);
    expect((await turnsOf(id)).map((t) => [t.turn, t.left, t.checkpointFreed])).toEqual([
      [1, false, false],
      [2, true, false],
      [3, true, false],
    ]);
    // The fork deleted, nothing stands on turns 2 and 3: the next message frees them first, then is a turn.
    await as('POST', `/v1/conversations/${fid}/archive`);
    expect((await as('DELETE', `/v1/conversations/${fid}`)).status).toBe(200);
    const ok = await as('POST', `/v1/conversations/${id}/messages`, { text: 's' });
    expect(ok.status).toBe(202);
    expect(ok.body.turn).toBe(4);
    expect((await turnsOf(id)).filter((t) => t.checkpointFreed).map((t) => t.turn)).toEqual([2, 3]);
    expect(await usedBytes()).toBeLessThan(used - size2);
    await done(id, 4);
    expect(await memory(id)).toBe('p\ns\n');
    await setQuota(null);
  });
});

async function readFileAs(key: string, sandboxId: string, p: string): Promise<{ status: number; text: string }> {
  const res = await fetch(`${T.api()}/api/sandboxes/${sandboxId}/files?path=${encodeURIComponent(p)}`, { headers: { 'x-api-key': key } });
  return { status: res.status, text: await res.text() };
}
