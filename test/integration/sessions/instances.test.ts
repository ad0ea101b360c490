import { api, control, eventually, unique } from '../../helpers/env';
import { bashAgent, runSession, startSession, waitForStatus } from '../../helpers/sessions';
import { hostClient, hostSh } from '../../helpers/sandboxes';
import { otherOrgKey } from '../../helpers/checkpoints';

jest.setTimeout(180_000);

async function waitInstance(agentId: string, id: string, statuses: string[], timeoutMs = 60_000) {
  return eventually(
    async () => {
      const r = await api('GET', `/v1/agents/${agentId}/instances/${id}`);
      return statuses.includes(r.body.status) ? r.body : undefined;
    },
    timeoutMs,
    200,
  );
}

/** Builds a snapshot (JSON answer, then polls until ready) and returns it. */
async function buildSnapshot(steps: unknown[]): Promise<{ id: string; name: string; checkpointId: string; lastUsedAt: string }> {
  const name = unique('isnap');
  const r = await api('POST', '/api/snapshots', { body: { name, image: { steps } } });
  expect(r.status).toBe(202);
  return eventually(
    async () => {
      const g = await api('GET', `/api/snapshots/${name}`);
      if (g.body.status === 'failed') throw new Error(g.body.error);
      return g.body.status === 'ready' ? g.body : undefined;
    },
    60_000,
    200,
  );
}

const hostHas = async (id: string) => (await hostClient().getSandbox(id)) !== null;

/** The stack's worker's completed reaper sweeps (a new worker process starts from 0). */
async function reaperSweeps(): Promise<number> {
  const text = await (await fetch(process.env.SAP_TEST_WORKER_METRICS_URL!)).text();
  return Number(/^sap_reaper_sweeps_total\{outcome="ok"\} (\d+)$/m.exec(text)?.[1] ?? 0);
}

describe('instances', () => {
  it('provisions in the background, is addressable by its sandbox, filters by metadata, and is destroyed by DELETE', async () => {
    const agentId = await bashAgent('true', { files: { '/workspace/agent.txt': 'agent file' }, env: { AGENT_SECRET: 's3' } });
    const userId = unique('user');
    const c = await api('POST', `/v1/agents/${agentId}/instances`, { body: { metadata: { userId, plan: 'pro', n: 42 } } });
    expect(c.status).toBe(201);
    expect(c.body).toMatchObject({ agent_id: agentId, status: 'creating', metadata: { userId, plan: 'pro', n: 42 }, sandbox_id: null });
    expect(c.body.id).toMatch(/^inst_[a-z0-9]+$/);
    const inst = await waitInstance(agentId, c.body.id, ['running']);
    expect(inst.sandbox_id).toMatch(/^sb-/);
    expect(await hostHas(inst.sandbox_id)).toBe(true);
    expect(await hostSh(inst.sandbox_id, 'cat /workspace/agent.txt; echo; echo $INSTANCE_ID $AGENT_SECRET')).toBe(`agent file\n${c.body.id} s3\n`);
    const sb = await api('GET', `/api/sandboxes/${inst.sandbox_id}`);
    expect(sb.body).toMatchObject({ sandboxID: inst.sandbox_id, status: 'running' });

    const other = await api('POST', `/v1/agents/${agentId}/instances`, { body: { metadata: { userId: `${userId}-x` } } });
    const byUser = await api('GET', `/v1/agents/${agentId}/instances?metadata.userId=${userId}`);
    expect(byUser.status).toBe(200);
    expect(byUser.body.instances.map((i: { id: string }) => i.id)).toEqual([c.body.id]);
    const both = await api('GET', `/v1/agents/${agentId}/instances?metadata.userId=${userId}&metadata.n=42`);
    expect(both.body.instances).toHaveLength(1);
    expect((await api('GET', `/v1/agents/${agentId}/instances?metadata.userId=${userId}&metadata.plan=free`)).body.instances).toHaveLength(0);
    const all = await api('GET', `/v1/agents/${agentId}/instances`);
    expect(all.body.instances.map((i: { id: string }) => i.id)).toEqual([other.body.id, c.body.id]);

    const del = await api('DELETE', `/v1/agents/${agentId}/instances/${c.body.id}`);
    expect(del.status).toBe(200);
    expect(del.body.status).toBe('stopped');
    expect(await hostHas(inst.sandbox_id)).toBe(false);
    expect((await api('GET', `/api/sandboxes/${inst.sandbox_id}`)).body.status).toBe('stopped');
    expect((await api('GET', `/v1/agents/${agentId}/instances?status=running`)).body.instances.map((i: { id: string }) => i.id)).not.toContain(c.body.id);
    await waitInstance(agentId, other.body.id, ['running']);
    await api('DELETE', `/v1/agents/${agentId}/instances/${other.body.id}`);
  });

  it("starts instances and sessions from the agent's snapshot with the checkpoint's patches; failures name the patch", async () => {
    const snap = await buildSnapshot([
      { type: 'run', args: { commands: ['mkdir -p /opt/tool && echo from-snapshot > /opt/tool/version'] } },
      { type: 'env', args: { vars: { TOOL_HOME: '/opt/tool' } } },
      { type: 'workdir', args: { path: '/opt/tool' } },
    ]);
    await api('POST', `/api/sandboxes/checkpoints/${snap.checkpointId}/patches`, { body: { script: 'echo patch-1 > /opt/tool/patched' } });
    const agentId = await bashAgent(
      'cat version patched > out.txt; printf \'{"v":"%s","p":"%s","home":"%s","cwd":"%s"}\' "$(cat version)" "$(cat patched)" "$TOOL_HOME" "$(pwd)" > /tmp/agent_result.json',
      { snapshot: snap.name },
    );

    const c = await api('POST', `/v1/agents/${agentId}/instances`, { body: {} });
    expect(c.status).toBe(201);
    expect(c.body.snapshot_id).toBe(snap.id);
    const inst = await waitInstance(agentId, c.body.id, ['running', 'failed']);
    expect(inst.status).toBe('running');
    expect(await hostSh(inst.sandbox_id, 'pwd; cat version patched; echo $TOOL_HOME')).toBe('/opt/tool\nfrom-snapshot\npatch-1\n/opt/tool\n');
    expect((await hostClient().getSandbox(inst.sandbox_id))?.patches.map((p) => p.exitCode)).toEqual([0]);

    const { session, result } = await runSession(agentId);
    expect(session.status).toBe('completed');
    expect(result.data).toEqual({ v: 'from-snapshot', p: 'patch-1', home: '/opt/tool', cwd: '/opt/tool' });
    const used = (await api('GET', `/api/snapshots/${snap.id}`)).body;
    expect(Date.parse(used.lastUsedAt)).toBeGreaterThan(Date.parse(snap.lastUsedAt));
    // The agent uses it: the snapshot cannot be deleted.
    const del = await api('DELETE', `/api/snapshots/${snap.id}`);
    expect([del.status, del.body.error.message]).toEqual([409, expect.stringContaining(agentId)]);

    // A failing patch: instances fail with the patch named, sessions fail at provisioning.
    const bad = (await api('POST', `/api/sandboxes/checkpoints/${snap.checkpointId}/patches`, { body: { script: 'echo nope >&2; exit 7' } })).body.patch;
    const failing = await api('POST', `/v1/agents/${agentId}/instances`, { body: {} });
    const failed = await waitInstance(agentId, failing.body.id, ['failed']);
    expect(failed.error).toContain(bad.id);
    expect(failed.error).toMatch(/exit code 7/);
    const s = await startSession(agentId);
    const sf = await waitForStatus(agentId, s.id, ['failed', 'completed']);
    expect(sf.status).toBe('failed');
    expect(sf.outcome).toMatchObject({ reason: 'provisioning_failed', message: expect.stringContaining(bad.id) });
    await api('DELETE', `/v1/agents/${agentId}/instances/${c.body.id}`);
  });

  it('rejects an agent whose snapshot does not exist', async () => {
    const agentId = await bashAgent('true', { snapshot: 'no-such-snapshot' });
    const i = await api('POST', `/v1/agents/${agentId}/instances`, { body: {} });
    expect([i.status, i.body.error.type]).toEqual([400, 'invalid_request']);
    const s = await api('POST', `/v1/agents/${agentId}/sessions`, { body: {} });
    expect([s.status, s.body.error.message]).toEqual([400, expect.stringContaining('no-such-snapshot')]);
  });

  it('keeps running through a worker restart, then is destroyed by the new worker', async () => {
    const agentId = await bashAgent('true');
    const c = await api('POST', `/v1/agents/${agentId}/instances`, { body: { metadata: { k: 'restart' } } });
    const inst = await waitInstance(agentId, c.body.id, ['running']);
    // kill resolves once the worker has exited.
    await control('kill', 'worker', 'SIGKILL');
    expect(await hostHas(inst.sandbox_id)).toBe(true);
    await control('start', 'worker');
    // Past the reaper's first sweep of the new worker (its metrics count it): the instance's sandbox stays.
    await eventually(async () => (await reaperSweeps()) >= 1, 60_000, 100);
    expect(await hostHas(inst.sandbox_id)).toBe(true);
    expect((await api('GET', `/v1/agents/${agentId}/instances/${c.body.id}`)).body.status).toBe('running');
    const del = await api('DELETE', `/v1/agents/${agentId}/instances/${c.body.id}`);
    expect(del.body.status).toBe('stopped');
    expect(await hostHas(inst.sandbox_id)).toBe(false);
  });

  it("answers 404 for another organisation's instances and 400 for bad input", async () => {
    const agentId = await bashAgent('true');
    const c = await api('POST', `/v1/agents/${agentId}/instances`, { body: {} });
    const key = await otherOrgKey();
    expect((await api('GET', `/v1/agents/${agentId}/instances/${c.body.id}`, { key })).status).toBe(404);
    expect((await api('DELETE', `/v1/agents/${agentId}/instances/${c.body.id}`, { key })).status).toBe(404);
    expect((await api('GET', `/v1/agents/${agentId}/instances`, { key })).status).toBe(404);
    expect((await api('POST', `/v1/agents/${agentId}/instances`, { body: {}, key })).status).toBe(404);
    expect((await api('GET', `/v1/agents/${agentId}/instances/inst_doesnotexist`)).status).toBe(404);

    const bad = [
      await api('POST', `/v1/agents/${agentId}/instances`, { body: { metadata: 'x' } }),
      await api('POST', `/v1/agents/${agentId}/instances`, { body: { metadata: [1] } }),
      await api('GET', `/v1/agents/${agentId}/instances?userId=42`),
      await api('GET', `/v1/agents/${agentId}/instances?status=sleeping`),
      await api('GET', `/v1/agents/${agentId}/instances/sess_abc`),
      await api('DELETE', `/v1/agents/${agentId}/instances/nope`),
    ];
    expect(bad.map((r) => [r.status, r.body?.error?.type])).toEqual(Array(bad.length).fill([400, 'invalid_request']));
    expect(bad[2]!.body.error.message).toContain('query.userId');
    await waitInstance(agentId, c.body.id, ['running']);
    await api('DELETE', `/v1/agents/${agentId}/instances/${c.body.id}`);
  });
});
