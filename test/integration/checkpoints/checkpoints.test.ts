import { api } from '../../helpers/env';
import { runSdk } from '../../helpers/sdk';
import { hostClient, hostSh, newSandbox } from '../../helpers/sandboxes';
import { otherOrgKey } from '../../helpers/checkpoints';

jest.setTimeout(120_000);

describe('checkpoints and patches', () => {
  it('spawns copy-on-write from a checkpoint: its files plus the patches in order; writes never reach the checkpoint', async () => {
    const a = await newSandbox({ user: 'root' });
    await hostSh(a, 'mkdir -p /workspace/data && echo one > /workspace/data/a.txt && echo kept > /etc/from-checkpoint');
    const cp = await api('POST', `/api/sandboxes/${a}/checkpoints`, { body: { name: 'first' } });
    expect(cp.status).toBe(201);
    expect(cp.body).toMatchObject({ sandboxId: a, name: 'first', status: 'ready' });
    const cpId = cp.body.id as string;
    expect(cpId).toMatch(/^cp-[a-z0-9]+$/);
    // Written after the checkpoint: not part of it.
    await hostSh(a, 'echo later > /workspace/data/later.txt');

    const p1 = await api('POST', `/api/sandboxes/checkpoints/${cpId}/patches`, { body: { script: 'echo p1 >> /workspace/order', description: 'first' } });
    expect(p1.status).toBe(201);
    expect(p1.body.patch).toMatchObject({ checkpointId: cpId, sequence: 1, strategy: 'on_wake', description: 'first', script: 'echo p1 >> /workspace/order' });
    expect(p1.body.patch.id).toMatch(/^pa-/);
    const p2 = await api('POST', `/api/sandboxes/checkpoints/${cpId}/patches`, {
      body: { script: 'echo p2 >> /workspace/order; cat /workspace/data/a.txt > /workspace/seen' },
    });
    expect(p2.body.patch).toMatchObject({ sequence: 2, description: '' });

    const b = await api('POST', `/api/sandboxes/from-checkpoint/${cpId}`, { body: { metadata: { spawned: 'yes' }, user: 'root' } });
    expect(b.status).toBe(201);
    expect(b.body).toMatchObject({ status: 'running', fromCheckpoint: cpId, metadata: { spawned: 'yes' } });
    const bId = b.body.sandboxID as string;
    expect(await hostSh(bId, 'cat /workspace/data/a.txt /etc/from-checkpoint /workspace/order /workspace/seen')).toBe('one\nkept\np1\np2\none\n');
    expect(await hostSh(bId, 'test -e /workspace/data/later.txt && echo yes || echo no')).toBe('no\n');
    const info = await hostClient().getSandbox(bId);
    expect(info?.patches.map((p) => [p.id, p.exitCode])).toEqual([
      [p1.body.patch.id, 0],
      [p2.body.patch.id, 0],
    ]);

    // Writes in the spawned sandbox do not change the checkpoint.
    await hostSh(bId, 'echo two > /workspace/data/a.txt && rm /etc/from-checkpoint');
    const c = (await api('POST', `/api/sandboxes/from-checkpoint/${cpId}`, { body: {} })).body.sandboxID as string;
    expect(await hostSh(c, 'cat /workspace/data/a.txt /etc/from-checkpoint')).toBe('one\nkept\n');

    const list = await api('GET', `/api/sandboxes/${a}/checkpoints`);
    expect(list.body.map((x: { id: string }) => x.id)).toEqual([cpId]);

    // Deleted while spawned sandboxes run from it: gone from the API at once; its layer stays until they are gone.
    const del = await api('DELETE', `/api/sandboxes/${a}/checkpoints/${cpId}`);
    expect(del.status).toBe(200);
    expect((await api('GET', `/api/sandboxes/${a}/checkpoints`)).body).toEqual([]);
    expect((await api('GET', `/api/sandboxes/checkpoints/${cpId}/patches`)).status).toBe(404);
    expect((await api('POST', `/api/sandboxes/from-checkpoint/${cpId}`, { body: {} })).status).toBe(404);
    expect(await hostClient().layerHash(cpId)).toMatch(/^[0-9a-f]{64}$/);
    expect(await hostSh(c, 'cat /workspace/data/a.txt')).toBe('one\n');
    for (const id of [a, bId, c]) await api('DELETE', `/api/sandboxes/${id}`);
    await expect(hostClient().layerHash(cpId)).rejects.toMatchObject({ type: 'not_found' });
  });

  it('numbers 50 concurrent patches 1..50 without gaps or repeats, lists them in order, and deletes one', async () => {
    const a = await newSandbox({ user: 'root' });
    const cpId = (await api('POST', `/api/sandboxes/${a}/checkpoints`, { body: {} })).body.id as string;
    const made = await Promise.all(
      Array.from({ length: 50 }, (_, i) =>
        api('POST', `/api/sandboxes/checkpoints/${cpId}/patches`, { body: { script: `echo ${i} >> /workspace/log`, description: `n${i}` } }),
      ),
    );
    expect(made.map((r) => r.status)).toEqual(Array(50).fill(201));
    const seqs = made.map((r) => r.body.patch.sequence as number).sort((x, y) => x - y);
    expect(seqs).toEqual(Array.from({ length: 50 }, (_, i) => i + 1));
    const list = await api('GET', `/api/sandboxes/checkpoints/${cpId}/patches`);
    expect(list.body.map((p: { sequence: number }) => p.sequence)).toEqual(seqs);

    const victim = list.body[9];
    expect((await api('DELETE', `/api/sandboxes/checkpoints/${cpId}/patches/${victim.id}`)).status).toBe(200);
    expect((await api('DELETE', `/api/sandboxes/checkpoints/${cpId}/patches/${victim.id}`)).status).toBe(404);
    const after = await api('GET', `/api/sandboxes/checkpoints/${cpId}/patches`);
    expect(after.body).toHaveLength(49);
    expect(after.body.map((p: { id: string }) => p.id)).not.toContain(victim.id);
    const next = await api('POST', `/api/sandboxes/checkpoints/${cpId}/patches`, { body: { script: 'true' } });
    expect(next.body.patch.sequence).toBe(51);

    // A spawn runs the 49 + 1 patches in sequence order.
    const b = (await api('POST', `/api/sandboxes/from-checkpoint/${cpId}`, { body: {} })).body.sandboxID as string;
    const expected = after.body.map((p: { description: string }) => p.description.slice(1)).join('\n') + '\n';
    expect(await hostSh(b, 'cat /workspace/log')).toBe(expected);
    for (const id of [a, b]) await api('DELETE', `/api/sandboxes/${id}`);
  });

  it('stops the chain at a failing patch: the sandbox runs with the patches before it, says which failed, and a wake after its deletion applies the rest once', async () => {
    const a = await newSandbox({ user: 'root' });
    const cpId = (await api('POST', `/api/sandboxes/${a}/checkpoints`, { body: {} })).body.id as string;
    const add = async (script: string) => (await api('POST', `/api/sandboxes/checkpoints/${cpId}/patches`, { body: { script } })).body.patch;
    const p1 = await add('echo p1 >> /workspace/order');
    // Its output is larger than what is kept: only the tail is reported.
    const bad = await add("head -c 200000 /dev/zero | tr '\\0' x; echo; echo broken >&2; exit 3");
    const p3 = await add('echo p3 >> /workspace/order');
    const r = await api('POST', `/api/sandboxes/from-checkpoint/${cpId}`, { body: {} });
    expect(r.status).toBe(201);
    const b = r.body.sandboxID as string;
    try {
      expect(r.body).toMatchObject({ status: 'running', fromCheckpoint: cpId });
      expect(r.body.patchError).toContain(bad.id);
      expect(r.body.patchError).toMatch(/exit code 3/);
      expect(r.body.patchError).toContain('broken');
      expect(r.body.patches).toMatchObject({
        applied: [{ id: p1.id, sequence: 1 }],
        failed: { id: bad.id, sequence: 2, exitCode: 3, outputTail: expect.stringContaining('broken') },
      });
      expect(r.body.patches.failed.outputTail.length).toBeLessThanOrEqual(4096);
      expect(await hostSh(b, 'cat /workspace/order')).toBe('p1\n');
      expect((await api('GET', `/api/sandboxes/${b}`)).body.patches.failed.id).toBe(bad.id);

      const cycle = async () => {
        expect((await api('POST', `/api/sandboxes/${b}/hibernate`)).status).toBe(200);
        const w = await api('POST', `/api/sandboxes/${b}/wake`, { body: {} });
        expect([w.status, w.body.status]).toEqual([200, 'running']);
        return w.body;
      };
      // Still there: a wake tries it again (it fails again), and p1 does not run twice.
      const again = await cycle();
      expect(again.patches).toMatchObject({ applied: [{ id: p1.id }], failed: { id: bad.id, exitCode: 3 } });
      expect(await hostSh(b, 'cat /workspace/order')).toBe('p1\n');

      expect((await api('DELETE', `/api/sandboxes/checkpoints/${cpId}/patches/${bad.id}`)).status).toBe(200);
      const fixed = await cycle();
      expect(fixed.patchError).toBeUndefined();
      expect(fixed.patches).toEqual({
        applied: [
          { id: p1.id, sequence: 1 },
          { id: p3.id, sequence: 3 },
        ],
        failed: null,
      });
      expect(await hostSh(b, 'cat /workspace/order')).toBe('p1\np3\n');
      // Once each: another wake runs nothing again; a patch added later runs at the next wake.
      await cycle();
      expect(await hostSh(b, 'cat /workspace/order')).toBe('p1\np3\n');
      const p4 = await add('echo p4 >> /workspace/order');
      expect((await cycle()).patches.applied.map((p: { id: string }) => p.id)).toEqual([p1.id, p3.id, p4.id]);
      expect(await hostSh(b, 'cat /workspace/order')).toBe('p1\np3\np4\n');
      // A new spawn gets the chain as it is now.
      const c = (await api('POST', `/api/sandboxes/from-checkpoint/${cpId}`, { body: {} })).body;
      expect(c.patchError).toBeUndefined();
      expect(await hostSh(c.sandboxID, 'cat /workspace/order')).toBe('p1\np3\np4\n');
      await api('DELETE', `/api/sandboxes/${c.sandboxID}`);
    } finally {
      for (const id of [a, b]) await api('DELETE', `/api/sandboxes/${id}`);
    }
  }, 240_000);

  it("answers 404 for another organisation's checkpoints and 400 for bad input", async () => {
    const a = await newSandbox({ user: 'root' });
    const cpId = (await api('POST', `/api/sandboxes/${a}/checkpoints`, { body: {} })).body.id as string;
    const patch = (await api('POST', `/api/sandboxes/checkpoints/${cpId}/patches`, { body: { script: 'true' } })).body.patch;
    const key = await otherOrgKey();
    const other = [
      await api('POST', `/api/sandboxes/${a}/checkpoints`, { body: {}, key }),
      await api('GET', `/api/sandboxes/${a}/checkpoints`, { key }),
      await api('DELETE', `/api/sandboxes/${a}/checkpoints/${cpId}`, { key }),
      await api('POST', `/api/sandboxes/from-checkpoint/${cpId}`, { body: {}, key }),
      await api('POST', `/api/sandboxes/checkpoints/${cpId}/patches`, { body: { script: 'true' }, key }),
      await api('GET', `/api/sandboxes/checkpoints/${cpId}/patches`, { key }),
      await api('DELETE', `/api/sandboxes/checkpoints/${cpId}/patches/${patch.id}`, { key }),
    ];
    expect(other.map((r) => r.status)).toEqual(Array(7).fill(404));
    expect((await api('GET', `/api/sandboxes/checkpoints/${cpId}/patches`)).body).toHaveLength(1);

    const bad = [
      await api('POST', `/api/sandboxes/checkpoints/${cpId}/patches`, { body: {} }),
      await api('POST', `/api/sandboxes/checkpoints/${cpId}/patches`, { body: { script: '' } }),
      await api('POST', `/api/sandboxes/checkpoints/${cpId}/patches`, { body: { script: 'true', description: 5 } }),
      await api('POST', '/api/sandboxes/checkpoints/nope/patches', { body: { script: 'true' } }),
      await api('GET', '/api/sandboxes/checkpoints/cp-../patches'),
      await api('DELETE', `/api/sandboxes/checkpoints/${cpId}/patches/not-a-patch`),
      await api('POST', '/api/sandboxes/from-checkpoint/xyz', { body: {} }),
      await api('POST', `/api/sandboxes/from-checkpoint/${cpId}`, { body: { timeout: -1 } }),
      await api('POST', `/api/sandboxes/${a}/checkpoints`, { body: { name: 7 } }),
    ];
    expect(bad.map((r) => [r.status, r.body?.error?.type])).toEqual(Array(bad.length).fill([400, 'invalid_request']));
    expect(bad[0]!.body.error.message).toContain('body.script');
    expect((await api('POST', '/api/sandboxes/checkpoints/cp-doesnotexist/patches', { body: { script: 'true' } })).status).toBe(404);
    expect((await api('GET', '/api/sandboxes/checkpoints/cp-doesnotexist/patches')).status).toBe(404);
    await api('DELETE', `/api/sandboxes/${a}`);
  });

  it('works with the published OpenComputer client', async () => {
    const r = await runSdk(`
      const sb = await sdk.Sandbox.create(opts);
      const cp = await sb.createCheckpoint('sdk-cp');
      const listed = await sb.listCheckpoints();
      const p1 = await sdk.Sandbox.createCheckpointPatch(cp.id, { ...opts, script: 'echo from-patch > /workspace/p.txt', description: 'writes p' });
      const p2 = await sdk.Sandbox.createCheckpointPatch(cp.id, { ...opts, script: 'echo second >> /workspace/p.txt' });
      const before = await sdk.Sandbox.listCheckpointPatches(cp.id, opts);
      await sdk.Sandbox.deleteCheckpointPatch(cp.id, p2.patch.id, opts);
      const afterDelete = await sdk.Sandbox.listCheckpointPatches(cp.id, opts);
      const child = await sdk.Sandbox.createFromCheckpoint(cp.id, opts);
      const running = await child.isRunning();
      const spare = await sb.createCheckpoint('spare');
      await sb.deleteCheckpoint(spare.id);
      const left = (await sb.listCheckpoints()).map((c) => c.name);
      // In use by the spawned sandbox: deleted all the same (the child keeps running on its layer).
      await sb.deleteCheckpoint(cp.id);
      const leftAfter = (await sb.listCheckpoints()).map((c) => c.name);
      const childStill = (await child.exec.run('cat /workspace/p.txt')).stdout;
      await sb.kill();
      out({ cp, listed: listed.map((c) => c.id), p1: p1.patch, before: before.map((p) => p.sequence), afterDelete: afterDelete.map((p) => p.id), child: child.sandboxId, running, left, leftAfter, childStill });
    `);
    expect(r.left).toEqual(['sdk-cp']);
    expect(r.leftAfter).toEqual([]);
    expect(r.childStill).toBe('from-patch\n');
    expect(r.cp.sizeBytes).toEqual(expect.any(Number));
    expect(r.cp).toMatchObject({ name: 'sdk-cp', status: 'ready' });
    expect(r.listed).toEqual([r.cp.id]);
    expect(r.p1).toMatchObject({ checkpointId: r.cp.id, sequence: 1, strategy: 'on_wake', description: 'writes p' });
    expect(r.before).toEqual([1, 2]);
    expect(r.afterDelete).toEqual([r.p1.id]);
    expect(r.child).toMatch(/^sb-/);
    expect(r.running).toBe(true);
    expect(await hostSh(r.child, 'cat /workspace/p.txt')).toBe('from-patch\n');
    await api('DELETE', `/api/sandboxes/${r.child}`);
  });

  it("keeps OpenComputer's rules, through its client: a duplicate name is 409, a sandbox takes at most 10 checkpoints (400 for the 11th)", async () => {
    // As OpenComputer's own example (test-checkpoints.ts) checks them: the client's error carries the status.
    const r = await runSdk(`
      const sb = await sdk.Sandbox.create(opts);
      const res = {};
      const fails = async (f) => { try { await f(); return null; } catch (e) { return e.message; } };
      try {
        const first = await sb.createCheckpoint('v1-baseline');
        res.duplicate = await fails(() => sb.createCheckpoint('v1-baseline'));
        for (let i = 2; i <= 10; i++) await sb.createCheckpoint('limit-test-' + i);
        res.count = (await sb.listCheckpoints()).length;
        res.eleventh = await fails(() => sb.createCheckpoint('one-too-many'));
        // Deleting one makes room, and frees its name.
        await sb.deleteCheckpoint(first.id);
        res.again = (await sb.createCheckpoint('v1-baseline')).name;
        res.countAfter = (await sb.listCheckpoints()).length;
        for (const c of await sb.listCheckpoints()) await sb.deleteCheckpoint(c.id);
      } finally {
        await sb.kill();
      }
      out(res);
    `);
    expect(r.duplicate).toMatch(/409/);
    expect(r.duplicate).toMatch(/already exists/);
    expect(r.count).toBe(10);
    expect(r.eleventh).toMatch(/400/);
    expect(r.eleventh).toMatch(/maximum 10 checkpoints per sandbox/);
    expect(r.again).toBe('v1-baseline');
    expect(r.countAfter).toBe(10);
  }, 240_000);

  it('answers the error body for a duplicate name and the 11th checkpoint, and refuses one of two creates of one name at once', async () => {
    const a = await newSandbox({ user: 'root' });
    try {
      const both = await Promise.all([0, 1].map(() => api('POST', `/api/sandboxes/${a}/checkpoints`, { body: { name: 'same' } })));
      expect(both.map((x) => x.status).sort()).toEqual([201, 409]);
      const refused = both.find((x) => x.status === 409)!;
      expect(refused.body.error).toEqual({ type: 'conflict', message: 'checkpoint name already exists for this sandbox: same' });
      // Unnamed checkpoints (named by their id) count too.
      for (let i = 0; i < 9; i++) expect((await api('POST', `/api/sandboxes/${a}/checkpoints`, { body: {} })).status).toBe(201);
      const eleventh = await api('POST', `/api/sandboxes/${a}/checkpoints`, { body: { name: 'eleventh' } });
      expect([eleventh.status, eleventh.body.error.type]).toEqual([400, 'invalid_request']);
      expect(eleventh.body.error.message).toContain('maximum 10 checkpoints per sandbox');
      // The refused one was not recorded.
      expect((await api('GET', `/api/sandboxes/${a}/checkpoints`)).body).toHaveLength(10);
    } finally {
      for (const c of (await api('GET', `/api/sandboxes/${a}/checkpoints`)).body) await api('DELETE', `/api/sandboxes/${a}/checkpoints/${c.id}`);
      await api('DELETE', `/api/sandboxes/${a}`);
    }
  }, 240_000);
});
