/**
 * The delete of a sandbox the same API process created: it destroys the sandbox without reading the
 * record first (services/sandboxes/sandboxes.ts, destroyKnown). What that must keep: another
 * organisation's delete is 404 and kills nothing; a sandbox stopped by someone else answers as
 * recorded, its record untouched; a second delete answers the same stopped sandbox.
 */
import { HostClient } from '../../../sandbox/host-contract/client';
import { api, T, withMongo } from '../../helpers/env';
import { otherOrgKey } from '../../helpers/checkpoints';
import { newSandbox } from '../../helpers/sandboxes';

type Rec = { status: string; updatedAt: Date };
const record = (id: string) => withMongo(async (c) => (await c.db().collection<{ _id: string } & Rec>('sandboxes').findOne({ _id: id }))!);
const onHost = async (id: string) => (await new HostClient({ url: T.hostUrl(), token: T.hostToken() }).listSandboxes()).some((s) => s.id === id);

describe('deleting a sandbox this API process created', () => {
  it("refuses another organisation's delete (404) and kills nothing", async () => {
    const sb = await newSandbox();
    const other = await otherOrgKey();
    const refused = await api('DELETE', `/api/sandboxes/${sb}`, { key: other });
    expect(refused.status).toBe(404);
    expect(refused.body).toEqual({ error: { type: 'not_found', message: `sandbox ${sb} not found` } });
    expect((await api('GET', `/api/sandboxes/${sb}`)).body).toMatchObject({ status: 'running' });
    expect(await onHost(sb)).toBe(true);
    expect((await api('DELETE', `/api/sandboxes/${sb}`)).status).toBe(200);
  });

  it('answers a sandbox stopped elsewhere as recorded, and a second delete the same', async () => {
    const sb = await newSandbox();
    // Stopped by someone else (the idle reaper, another API process): host first, then the record.
    await new HostClient({ url: T.hostUrl(), token: T.hostToken() }).destroySandbox(sb);
    const at = new Date(Date.now() - 60_000);
    await withMongo((c) =>
      c
        .db()
        .collection<{ _id: string }>('sandboxes')
        .updateOne({ _id: sb }, { $set: { status: 'stopped', updatedAt: at } }),
    );
    const first = await api('DELETE', `/api/sandboxes/${sb}`);
    expect(first.status).toBe(200);
    expect(first.body).toMatchObject({ sandboxID: sb, status: 'stopped' });
    expect(await record(sb)).toMatchObject({ status: 'stopped', updatedAt: at });

    const live = await newSandbox();
    const killed = await api('DELETE', `/api/sandboxes/${live}`);
    expect(killed.body).toMatchObject({ sandboxID: live, status: 'stopped' });
    expect(await onHost(live)).toBe(false);
    const stoppedAt = (await record(live)).updatedAt;
    const again = await api('DELETE', `/api/sandboxes/${live}`);
    expect(again.status).toBe(200);
    expect(again.body).toEqual(killed.body);
    expect((await record(live)).updatedAt).toEqual(stoppedAt);
  });
});
