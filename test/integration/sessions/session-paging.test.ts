import { api, T } from '../../helpers/env';
import { otherOrgKey } from '../../helpers/checkpoints';
import { createAgent } from '../../helpers/sessions';
import { connectStore, type SessionDoc, type Store } from '../../../store';
import { deleteSession, insertSessionsOnce, newSessionDoc } from '../../../store/sessions';

/**
 * Paging an agent's session list with its cursor (store/listing.ts: a page is an `_id` range of
 * listing keys): every session once, in (created_at desc, id desc) order, ties on created_at
 * included, whatever the page size; another organisation sees none of it.
 */
describe('session list paging', () => {
  let store: Store;
  let agent: string;
  let orgId: string;
  const docs: SessionDoc[] = [];

  beforeAll(async () => {
    store = await connectStore(T.mongo(), { ensureIndexes: false });
    agent = await createAgent(['bash', '-c', 'exit 0']);
    const a = (await store.agents.find({}).toArray()).find((d) => d._id.endsWith(`/${agent}`));
    if (!a) throw new Error('agent not stored');
    orgId = a.orgId;
    const t0 = Date.now() - 3_600_000;
    const tag = Date.now().toString(36);
    // 300 sessions, three per creation time (ties), ids not in creation order.
    for (let i = 0; i < 300; i++) {
      const at = new Date(t0 + Math.floor(i / 3) * 1000);
      const id = `sess_page${tag}${((i * 7919) % 300).toString(36).padStart(3, '0')}`;
      docs.push(newSessionDoc({ _id: id, orgId, agent_id: agent, input: '{}', metadata: JSON.stringify({ i }), created_at: at }));
    }
    await insertSessionsOnce(store, docs.slice(0, 150));
    await insertSessionsOnce(store, docs.slice(100)); // overlapping: inserted once, listed once
  });

  afterAll(async () => {
    await store?.sessions.deleteMany({ agent_id: agent });
    await store?.close();
  });

  const expected = () =>
    [...docs].sort((a, b) => b.created_at.getTime() - a.created_at.getTime() || (a._id < b._id ? 1 : a._id > b._id ? -1 : 0)).map((d) => d._id);

  async function pageAll(limit: number, key?: string): Promise<string[]> {
    const seen: string[] = [];
    let cursor: string | null = null;
    for (let n = 0; n < 1000; n++) {
      const q: string = `/v1/agents/${agent}/sessions?limit=${limit}${cursor ? `&cursor=${cursor}` : ''}`;
      const r = await api('GET', q, key ? { key } : {});
      expect(r.status).toBe(200);
      expect(r.body.sessions.length).toBeLessThanOrEqual(limit);
      seen.push(...r.body.sessions.map((s: { id: string }) => s.id));
      cursor = r.body.next_cursor;
      if (!cursor) return seen;
      expect(r.body.sessions.length).toBe(limit);
    }
    throw new Error('the cursor never ended');
  }

  it('pages through every session once, newest first, ties by id', async () => {
    const want = expected();
    expect(await pageAll(50)).toEqual(want);
    expect(await pageAll(7)).toEqual(want);
    expect(await pageAll(100)).toEqual(want); // the last page is full: next_cursor then null
    expect(await pageAll(200)).toEqual(want);
  });

  it('leaves out a deleted session and goes on past it', async () => {
    const gone = docs[150]!;
    await deleteSession(store, gone);
    await store.sessions.deleteOne({ _id: docs[151]!._id }); // its listing key stays behind
    const want = expected().filter((id) => id !== gone._id && id !== docs[151]!._id);
    expect(await pageAll(10)).toEqual(want);
  });

  it('shows nothing to another organisation and refuses a forged cursor', async () => {
    const other = await api('GET', `/v1/agents/${agent}/sessions?limit=50`, { key: await otherOrgKey() });
    expect(other.status).toBe(404);
    const forged = Buffer.from(JSON.stringify({ t: 'x', id: 'y' })).toString('base64url');
    const r = await api('GET', `/v1/agents/${agent}/sessions?cursor=${forged}`);
    expect(r.status).toBe(400);
    expect(r.body.error.type).toBe('invalid_request');
  });
});
