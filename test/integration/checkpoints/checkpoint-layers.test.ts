/**
 * Deleting a checkpoint that sandboxes stand on: allowed (as OpenComputer allows it); the checkpoint
 * goes from the API at once, its layer stays on the host until its last user (a running or
 * hibernated sandbox, a checkpoint taken over it) is gone. Real sandboxes, the layers read on disk.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { api, T } from '../../helpers/env';
import { hostSh, newSandbox, sh } from '../../helpers/sandboxes';
import { otherOrgKey } from '../../helpers/checkpoints';

jest.setTimeout(240_000);

const layerDir = (id: string) => path.join(T.dataDir(), 'layers', id);
const onDisk = (id: string) => fs.existsSync(path.join(layerDir(id), 'layer.json'));
const released = () => fs.readdirSync(path.join(T.dataDir(), 'layers', '.released'), { withFileTypes: false }).map(String);

describe('deleting a checkpoint in use', () => {
  it('keeps its layer while spawned sandboxes (running, hibernated) and a checkpoint over it use it, and removes it with the last', async () => {
    const made: string[] = [];
    try {
      const a = await newSandbox();
      made.push(a);
      await hostSh(a, 'echo base > /workspace/base.txt');
      const cp = (await api('POST', `/api/sandboxes/${a}/checkpoints`, { body: { name: 'shared' } })).body.id as string;
      const spawn = async () => {
        const r = await api('POST', `/api/sandboxes/from-checkpoint/${cp}`, { body: {} });
        expect(r.status).toBe(201);
        made.push(r.body.sandboxID);
        return r.body.sandboxID as string;
      };
      const b = await spawn();
      const c = await spawn();
      await hostSh(c, 'echo c-own > /workspace/c.txt');
      expect((await api('POST', `/api/sandboxes/${c}/hibernate`)).status).toBe(200);
      // A checkpoint taken over it (of b): its layer names cp's as a parent.
      await hostSh(b, 'echo b-own > /workspace/b.txt');
      const child = (await api('POST', `/api/sandboxes/${b}/checkpoints`, { body: { name: 'child' } })).body.id as string;

      // Another organisation cannot delete it; the owner can, with sandboxes on it.
      expect((await api('DELETE', `/api/sandboxes/${a}/checkpoints/${cp}`, { key: await otherOrgKey() })).status).toBe(404);
      const del = await api('DELETE', `/api/sandboxes/${a}/checkpoints/${cp}`);
      expect(del.status).toBe(200);
      expect(del.body).toMatchObject({ id: cp, name: 'shared' });
      expect((await api('GET', `/api/sandboxes/${a}/checkpoints/${cp}`)).status).toBe(404);
      expect((await api('GET', `/api/sandboxes/${a}/checkpoints`)).body).toEqual([]);
      expect((await api('POST', `/api/sandboxes/from-checkpoint/${cp}`, { body: {} })).status).toBe(404);
      expect((await api('DELETE', `/api/sandboxes/${a}/checkpoints/${cp}`)).status).toBe(404);
      expect(onDisk(cp)).toBe(true);
      expect(released()).toContain(cp);

      // The sandboxes on it keep working: exec, hibernate and wake, the hibernated one wakes.
      expect(await sh(b, 'cat /workspace/base.txt /workspace/b.txt')).toBe('base\nb-own\n');
      expect((await api('POST', `/api/sandboxes/${b}/hibernate`)).status).toBe(200);
      expect((await api('POST', `/api/sandboxes/${b}/wake`, { body: {} })).body.status).toBe('running');
      expect(await sh(b, 'cat /workspace/base.txt /workspace/b.txt')).toBe('base\nb-own\n');
      expect((await api('POST', `/api/sandboxes/${c}/wake`, { body: {} })).body.status).toBe('running');
      expect(await sh(c, 'cat /workspace/base.txt /workspace/c.txt')).toBe('base\nc-own\n');
      // A sandbox spawned from the checkpoint over it still has cp's files.
      const d = (await api('POST', `/api/sandboxes/from-checkpoint/${child}`, { body: {} })).body.sandboxID as string;
      made.push(d);
      expect(await sh(d, 'cat /workspace/base.txt /workspace/b.txt')).toBe('base\nb-own\n');

      // One user after another goes; the layer stays while any is left.
      for (const id of [a, b, c, d]) {
        expect((await api('DELETE', `/api/sandboxes/${id}`)).status).toBe(200);
        expect(onDisk(cp)).toBe(true);
      }
      // The last: the checkpoint taken over it (of b, now killed).
      expect((await api('DELETE', `/api/sandboxes/${b}/checkpoints/${child}`)).status).toBe(200);
      expect(onDisk(child)).toBe(false);
      expect(onDisk(cp)).toBe(false);
      expect(released()).not.toContain(cp);
      expect(fs.readdirSync(path.join(T.dataDir(), 'layers')).filter((n) => n.startsWith(cp) || n.startsWith(child))).toEqual([]);
    } finally {
      for (const id of made) await api('DELETE', `/api/sandboxes/${id}`);
    }
  });

  it('still answers 409 for a checkpoint a snapshot is made of', async () => {
    const a = await newSandbox();
    try {
      const cp = (await api('POST', `/api/sandboxes/${a}/checkpoints`, { body: {} })).body.id as string;
      const snap = await api('POST', '/api/snapshots', { body: { name: `of-${cp}`, checkpointId: cp } });
      expect(snap.status).toBeLessThan(300);
      const del = await api('DELETE', `/api/sandboxes/${a}/checkpoints/${cp}`);
      expect([del.status, del.body.error.type]).toEqual([409, 'conflict']);
      expect(del.body.error.message).toMatch(/snapshot/);
      await api('DELETE', `/api/snapshots/of-${cp}`);
    } finally {
      await api('DELETE', `/api/sandboxes/${a}`);
    }
  });
});
