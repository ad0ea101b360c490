import { api, T } from '../../helpers/env';
import { otherOrgKey } from '../../helpers/checkpoints';
import { connectStore, type AgentDoc, type SessionDoc, type Store } from '../../../store';
import { agentKey, deleteAgent, findAgent, insertAgent } from '../../../store/agents';
import { batchesOf, deleteBatch, insertBatch, type BatchDoc, type BatchStatus } from '../../../store/batches';
import { listedAfter, listName } from '../../../store/listing';
import { deleteUnstartedSessions, insertSessionsOnce, newSessionDoc } from '../../../store/sessions';
import { orgOfKeyHash } from '../../../store/orgs';
import { insertSandbox, markSandboxStopped, sandboxesOf, updateSandbox, type SandboxDoc } from '../../../store/sandboxes';
import { hashSecret } from '../../../lib/ids';

/**
 * Paging the agents and batches lists with their cursors (store/listing.ts: a page is an `_id`
 * range of listing keys): every item once, newest first by (created_at, id), ties included,
 * whatever the page size; a batch status filter; another organisation sees none of it; every
 * delete path takes its listing keys with it, and a key left behind is dropped when met.
 */
describe('agents and batches list paging', () => {
  let store: Store;
  let key: string;
  let orgId: string;
  let agent: AgentDoc;
  const agents: AgentDoc[] = [];
  const batches: BatchDoc[] = [];
  const tag = Date.now().toString(36);
  const STATUSES: BatchStatus[] = ['completed', 'cancelled', 'completed'];

  beforeAll(async () => {
    store = await connectStore(T.mongo(), { ensureIndexes: false });
    // A fresh organisation: its lists hold only what this test puts there.
    key = await otherOrgKey(`paging-${tag}`);
    const found = await orgOfKeyHash(store, hashSecret(key));
    if (!found) throw new Error('the new key has no organisation');
    orgId = found;
    const r = await api('POST', '/v1/agents', { key, body: { id: `pg-${tag}`, core: 'bash', entrypoint: ['bash', '-c', 'exit 0'] } });
    expect(r.status).toBe(201);
    agent = (await findAgent(store, orgId, `pg-${tag}`))!;
    const t0 = Date.now() - 3_600_000;
    // 120 more agents and 150 batches, three per creation time (ties), ids not in creation order.
    for (let i = 0; i < 120; i++) {
      const id = `pg-${tag}-${((i * 7919) % 120).toString(36).padStart(2, '0')}`;
      const doc: AgentDoc = { ...agent, _id: agentKey(orgId, id), id, display_name: id, created_at: new Date(t0 + Math.floor(i / 3) * 1000) };
      await insertAgent(store, doc);
      agents.push(doc);
    }
    agents.push(agent);
    for (let i = 0; i < 150; i++) {
      const at = new Date(t0 + Math.floor(i / 3) * 1000);
      const status = STATUSES[i % 3]!;
      const doc: BatchDoc = {
        _id: `batch_pg${tag}${((i * 7919) % 150).toString(36).padStart(3, '0')}`,
        orgId,
        agent_id: agent.id,
        status,
        total: 1,
        concurrency: 1,
        max_attempts: 1,
        counts: { pending: 0, running: 0, completed: 1, failed: 0 },
        items_hash: 'x',
        idempotency_key: null,
        created_at: at,
        updated_at: at,
        completed_at: at,
      };
      await insertBatch(store, doc);
      batches.push(doc);
    }
  });

  afterAll(async () => {
    if (!store) return;
    await sandboxesOf(store).deleteMany({ orgId });
    for (const b of batches) await deleteBatch(store, b).catch(() => undefined);
    for (const a of agents) await deleteAgent(store, a).catch(() => undefined);
    await store.close();
  });

  const newestFirst = <D extends { created_at: Date }>(docs: D[], id: (d: D) => string) =>
    [...docs].sort((a, b) => b.created_at.getTime() - a.created_at.getTime() || (id(a) < id(b) ? 1 : id(a) > id(b) ? -1 : 0)).map(id);

  async function pageAll(path: string, field: 'agents' | 'batches', limit: number, as = key): Promise<string[]> {
    const seen: string[] = [];
    let cursor: string | null = null;
    for (let n = 0; n < 1000; n++) {
      const r: { status: number; body: any } = await api('GET', `${path}${path.includes('?') ? '&' : '?'}limit=${limit}${cursor ? `&cursor=${cursor}` : ''}`, {
        key: as,
      });
      expect(r.status).toBe(200);
      expect(r.body[field].length).toBeLessThanOrEqual(limit);
      seen.push(...r.body[field].map((x: { id: string }) => x.id));
      cursor = r.body.next_cursor;
      if (!cursor) return seen;
    }
    throw new Error('the cursor never ended');
  }

  it('pages through every agent of the organisation once, newest first, ties by id', async () => {
    const want = newestFirst(agents, (a) => a.id);
    expect(want[0]).toBe(agent.id); // made through the API, now: the newest
    expect(await pageAll('/v1/agents', 'agents', 50)).toEqual(want);
    expect(await pageAll('/v1/agents', 'agents', 7)).toEqual(want);
    expect(await pageAll('/v1/agents', 'agents', 121)).toEqual(want); // the last page is full
  });

  it('pages through every batch of the agent once, with and without a status filter', async () => {
    const path = `/v1/agents/${agent.id}/batches`;
    const want = newestFirst(batches, (b) => b._id);
    expect(await pageAll(path, 'batches', 50)).toEqual(want);
    expect(await pageAll(path, 'batches', 9)).toEqual(want);
    for (const status of ['completed', 'cancelled'] as const) {
      const only = newestFirst(
        batches.filter((b) => b.status === status),
        (b) => b._id,
      );
      expect(await pageAll(`${path}?status=${status}`, 'batches', 20)).toEqual(only);
    }
    expect(await pageAll(`${path}?status=running`, 'batches', 20)).toEqual([]);
  });

  it('shows nothing to another organisation and refuses a forged cursor', async () => {
    const mine = await api('GET', '/v1/agents?limit=200');
    expect(mine.status).toBe(200);
    expect(mine.body.agents.map((a: { id: string }) => a.id)).not.toContain(agent.id);
    expect((await api('GET', `/v1/agents/${agent.id}/batches`)).status).toBe(404);
    const forged = Buffer.from(JSON.stringify({ t: 'x', id: 'y' })).toString('base64url');
    for (const path of ['/v1/agents', `/v1/agents/${agent.id}/batches`]) {
      const r = await api('GET', `${path}?cursor=${forged}`, { key });
      expect(r.status).toBe(400);
      expect(r.body.error.type).toBe('invalid_request');
    }
  });

  it('takes listing keys away with every delete, and drops a key left behind when it meets it', async () => {
    const batchKeys = () => listedAfter(store, listName('batches', orgId, agent.id), undefined, 1000);
    const gone = batches.splice(0, 1)[0]!;
    await deleteBatch(store, gone);
    expect((await batchKeys()).map((l) => l.id)).not.toContain(gone._id);
    // A batch removed behind the store's back: its key stays until a page meets it.
    const orphan = batches.splice(0, 1)[0]!;
    await batchesOf(store).batches.deleteOne({ _id: orphan._id });
    expect((await batchKeys()).map((l) => l.id)).toContain(orphan._id);
    expect(await pageAll(`/v1/agents/${agent.id}/batches`, 'batches', 100)).toEqual(newestFirst(batches, (b) => b._id));
    expect((await batchKeys()).map((l) => l.id)).not.toContain(orphan._id);

    // An agent deleted through the API.
    const a = agents.splice(0, 1)[0]!;
    expect((await api('DELETE', `/v1/agents/${a.id}`, { key })).status).toBe(200);
    expect((await listedAfter(store, listName('agents', orgId), undefined, 1000)).map((l) => l.id)).not.toContain(a.id);

    // A cancelled batch's unstarted sessions.
    const sessions: SessionDoc[] = Array.from({ length: 20 }, (_, i) =>
      newSessionDoc({ _id: `sess_pg${tag}${i}`, orgId, agent_id: agent.id, input: '{}', metadata: '{}', created_at: new Date(Date.now() - i) }),
    );
    await insertSessionsOnce(store, sessions);
    const sessionKeys = () => listedAfter(store, listName('sessions', orgId, agent.id), undefined, 1000);
    expect((await sessionKeys()).length).toBe(20);
    expect(
      await deleteUnstartedSessions(
        store,
        sessions.map((s) => s._id),
      ),
    ).toBe(20);
    expect(await sessionKeys()).toEqual([]);
  });

  it('lists an organisation’s live sandboxes from its list, dropping the stopped ones it meets', async () => {
    // Records only (no host runs them): the list route reads records, and marks them lost.
    const t0 = Date.now() - 60_000;
    const sbs: SandboxDoc[] = Array.from({ length: 8 }, (_, i) => ({
      _id: `sb-pg${tag}${i}`,
      orgId,
      hostId: `nohost-${tag}`,
      status: i < 6 ? 'running' : 'stopped',
      templateID: 'base',
      metadata: '{}',
      fromCheckpoint: null,
      snapshot: null,
      timeout: 0,
      memoryMB: 512,
      cpuCount: 1,
      instanceId: null,
      createdAt: new Date(t0 + Math.floor(i / 2) * 1000),
      updatedAt: new Date(t0),
    }));
    for (const sb of sbs) await insertSandbox(store, sb);
    const listed = async () => {
      const r = await api('GET', '/api/sandboxes', { key });
      expect(r.status).toBe(200);
      return r.body.map((s: { sandboxID: string }) => s.sandboxID);
    };
    const live = (docs: SandboxDoc[]) =>
      newestFirst(
        docs.filter((d) => d.status === 'running' || d.status === 'hibernated').map((d) => ({ ...d, created_at: d.createdAt })),
        (d) => d._id,
      );
    expect(await listed()).toEqual(live(sbs));
    const keys = () => listedAfter(store, listName('sandboxes', orgId), undefined, 1000);
    expect((await keys()).length).toBe(6);
    // Stopped (a state it never leaves): left out, and its key dropped once the list meets it.
    await markSandboxStopped(store, sbs[1]!._id);
    sbs[1]!.status = 'stopped';
    await updateSandbox(store, sbs[2]!._id, { status: 'hibernated' });
    sbs[2]!.status = 'hibernated';
    expect(await listed()).toEqual(live(sbs));
    expect((await keys()).map((l) => l.id)).not.toContain(sbs[1]!._id);
    expect((await keys()).length).toBe(5);
    // Recorded live again with its organisation and creation time given (no read back): listed in its place.
    await updateSandbox(store, sbs[7]!._id, { status: 'hibernated' }, sbs[7]!);
    sbs[7]!.status = 'hibernated';
    expect(await listed()).toEqual(live(sbs));
    expect((await keys()).length).toBe(6);
    // Another organisation sees none of them.
    const theirs = await api('GET', '/api/sandboxes');
    expect(theirs.status).toBe(200);
    for (const sb of sbs) expect(theirs.body.map((s: { sandboxID: string }) => s.sandboxID)).not.toContain(sb._id);
  });
});
