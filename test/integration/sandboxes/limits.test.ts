/**
 * Limits on by default (isolation issue, item 6): every sandbox gets the operator's default limits
 * unless a sandbox or an agent sets its own, and nothing may ask for more than the maxima.
 * The stack inherits this process's environment, so loadLimits(process.env) is what it uses.
 */
import { loadLimits } from '../../../config/limits';
import { api, eventually, T, unique } from '../../helpers/env';
import { hostClient } from '../../helpers/sandboxes';
import { bashAgent, createAgent, runSession } from '../../helpers/sessions';

jest.setTimeout(120_000);

const limits = loadLimits(process.env);

const hostFetch = (method: string, path: string, body?: unknown) =>
  fetch(`${T.hostUrl()}${path}`, {
    method,
    headers: { authorization: `Bearer ${T.hostToken()}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });

/** The organisation's running sandboxes' ids, from the API, and every sandbox id on the host. */
async function sandboxIds(): Promise<{ api: string[]; host: string[] }> {
  const listed = await api('GET', '/api/sandboxes');
  const onHost = (await hostClient().listSandboxes()).map((s) => s.id);
  return { api: listed.body.map((s: { sandboxID: string }) => s.sandboxID).sort(), host: onHost.sort() };
}

/** The three over-maximum bodies, and what the message must name. */
const overMax = () => [
  { body: { memoryMB: limits.maxMemoryMB + 1 }, field: 'memoryMB', max: `${limits.maxMemoryMB} MB` },
  { body: { diskMB: limits.maxDiskMB + 1 }, field: 'diskMB', max: `${limits.maxDiskMB} MB` },
  { body: { cpuCount: limits.maxCpuCount + 1 }, field: 'cpuCount', max: `${limits.maxCpuCount}` },
];

function expectOverMax(r: { status: number; body: any }, field: string, max: string): void {
  expect(r.status).toBe(400);
  expect(r.body).toEqual({ error: { type: 'invalid_request', message: expect.stringContaining(`body.${field}: `) } });
  expect(r.body.error.message).toContain(`maximum of ${max}`);
}

describe('sandbox limits', () => {
  it("shows a sandbox's effective limits: the defaults, or what it asked for", async () => {
    const d = await api('POST', '/api/sandboxes', { body: {} });
    expect(d.status).toBe(201);
    expect(d.body).toMatchObject({ memoryMB: limits.memoryMB, diskMB: limits.diskMB, cpuCount: limits.cpuCount });
    expect((await api('GET', `/api/sandboxes/${d.body.sandboxID}`)).body).toMatchObject({
      memoryMB: limits.memoryMB,
      diskMB: limits.diskMB,
      cpuCount: limits.cpuCount,
    });

    const own = await api('POST', '/api/sandboxes', { body: { memoryMB: 256, diskMB: 128, cpuCount: 1 } });
    expect(own.status).toBe(201);
    expect(own.body).toMatchObject({ memoryMB: 256, diskMB: 128, cpuCount: 1 });
    // The sandbox works with them.
    const ran = await api('POST', `/api/sandboxes/${own.body.sandboxID}/exec/run`, { body: { cmd: 'sh', args: ['-c', 'echo ok'] } });
    expect(ran.body).toMatchObject({ exitCode: 0, stdout: 'ok\n' });
    await api('DELETE', `/api/sandboxes/${d.body.sandboxID}`);
    await api('DELETE', `/api/sandboxes/${own.body.sandboxID}`);
  });

  it('refuses memoryMB, diskMB or cpuCount over the maximum with 400 naming the field, and creates nothing', async () => {
    const before = await sandboxIds();
    for (const { body, field, max } of overMax()) expectOverMax(await api('POST', '/api/sandboxes', { body }), field, max);
    expect(await sandboxIds()).toEqual(before);
  });

  it('refuses them when spawning from a checkpoint or a snapshot too, and accepts limits there', async () => {
    const src = (await api('POST', '/api/sandboxes', { body: {} })).body.sandboxID as string;
    const cp = await api('POST', `/api/sandboxes/${src}/checkpoints`, { body: { name: 'limits' } });
    expect(cp.status).toBe(201);
    const snapName = unique('limsnap');
    expect((await api('POST', '/api/snapshots', { body: { name: snapName, checkpointId: cp.body.id } })).status).toBe(201);

    const before = await sandboxIds();
    for (const { body, field, max } of overMax()) {
      expectOverMax(await api('POST', `/api/sandboxes/from-checkpoint/${cp.body.id}`, { body }), field, max);
      expectOverMax(await api('POST', '/api/sandboxes', { body: { ...body, snapshot: snapName } }), field, max);
    }
    expect(await sandboxIds()).toEqual(before);

    const spawned = await api('POST', `/api/sandboxes/from-checkpoint/${cp.body.id}`, { body: { diskMB: 100 } });
    expect(spawned.status).toBe(201);
    expect(spawned.body).toMatchObject({ memoryMB: limits.memoryMB, diskMB: 100, cpuCount: limits.cpuCount, fromCheckpoint: cp.body.id });
    const fromSnap = await api('POST', '/api/sandboxes', { body: { snapshot: snapName, memoryMB: 300 } });
    expect(fromSnap.status).toBe(201);
    expect(fromSnap.body).toMatchObject({ memoryMB: 300, diskMB: limits.diskMB, snapshot: expect.stringMatching(/^snap-/) });

    for (const id of [spawned.body.sandboxID, fromSnap.body.sandboxID, src]) await api('DELETE', `/api/sandboxes/${id}`);
    await api('DELETE', `/api/snapshots/${snapName}`);
    await api('DELETE', `/api/sandboxes/${src}/checkpoints/${cp.body.id}`);
  });

  it('the host refuses values over its maxima (400, nothing created) and takes cpuCount 0 (no quota)', async () => {
    const id = `sb-lim${Date.now().toString(36)}`;
    for (const { body, field, max } of overMax()) {
      const r = await hostFetch('POST', '/sandboxes', { id, orgId: 'o', ...body });
      expect(r.status).toBe(400);
      const e = (await r.json()) as { error: { type: string; message: string } };
      expect(e.error.type).toBe('invalid_request');
      expect(e.error.message).toContain(`body.${field}: `);
      expect(e.error.message).toContain(`maximum of ${max}`);
    }
    expect((await hostFetch('GET', `/sandboxes/${id}`)).status).toBe(404);
    // Zero CPUs is the host's "no quota" and a valid value.
    const ok = await hostFetch('POST', '/sandboxes', { id, orgId: 'o', cpuCount: 0, diskMB: 64 });
    expect(ok.status).toBe(201);
    expect(await hostClient().destroySandbox(id)).toBe(true);
  });

  it("stores and returns an agent's limits, refuses them over the maxima, and runs its sessions and instances with them", async () => {
    for (const { body, field, max } of overMax()) {
      const id = unique('limagent');
      expectOverMax(await api('POST', '/v1/agents', { body: { id, core: 'bash', entrypoint: ['true'], ...body } }), field, max);
      expect((await api('GET', `/v1/agents/${id}`)).status).toBe(404);
    }
    const plain = await bashAgent('true');
    expect((await api('GET', `/v1/agents/${plain}`)).body).toMatchObject({ memoryMB: null, cpuCount: null, diskMB: null });

    const agentId = await createAgent(['bash', '-c', 'echo "{\\"ok\\":true}" > /tmp/agent_result.json'], { memoryMB: 256, cpuCount: 1, diskMB: 300 });
    expect((await api('GET', `/v1/agents/${agentId}`)).body).toMatchObject({ memoryMB: 256, cpuCount: 1, diskMB: 300 });
    for (const { body, field, max } of overMax()) expectOverMax(await api('PATCH', `/v1/agents/${agentId}`, { body }), field, max);
    expect((await api('GET', `/v1/agents/${agentId}`)).body).toMatchObject({ memoryMB: 256, cpuCount: 1, diskMB: 300 });

    const { session, result } = await runSession(agentId);
    expect(session.status).toBe('completed');
    expect(result.data).toEqual({ ok: true });

    const inst = await api('POST', `/v1/agents/${agentId}/instances`, { body: {} });
    expect(inst.status).toBe(201);
    const running = await eventually(
      async () => {
        const r = await api('GET', `/v1/agents/${agentId}/instances/${inst.body.id}`);
        if (r.body.status === 'failed') throw new Error(`instance failed: ${r.body.error}`);
        return r.body.status === 'running' ? r.body : undefined;
      },
      60_000,
      200,
    );
    expect((await api('GET', `/api/sandboxes/${running.sandbox_id}`)).body).toMatchObject({ memoryMB: 256, cpuCount: 1, diskMB: 300 });
    await api('DELETE', `/v1/agents/${agentId}/instances/${inst.body.id}`);

    const cleared = await api('PATCH', `/v1/agents/${agentId}`, { body: { memoryMB: null, diskMB: 1024 } });
    expect(cleared.status).toBe(200);
    expect(cleared.body).toMatchObject({ memoryMB: null, cpuCount: 1, diskMB: 1024 });
  });

  // Needs the new sandbox runtime (memory limit enforced, oomKilled reported by the host).
  it('a memory hog ends the session failed with reason oom', async () => {
    const agentId = await createAgent(['python3', '-c', "b = b'x' * (512 * 1024 * 1024)"], { core: 'python', memoryMB: 64 });
    const { session, result } = await runSession(agentId);
    expect(session.status).toBe('failed');
    expect(session.outcome).toMatchObject({ reason: 'oom', message: expect.stringContaining('memory limit (64 MB)') });
    expect(result).toMatchObject({ status: 'failed', reason: 'oom' });
    // Only the sandbox was hit: the API answers and another sandbox works.
    const sb = await api('POST', '/api/sandboxes', { body: {} });
    expect(sb.status).toBe(201);
    expect((await api('POST', `/api/sandboxes/${sb.body.sandboxID}/exec/run`, { body: { cmd: 'sh', args: ['-c', 'echo alive'] } })).body.stdout).toBe(
      'alive\n',
    );
    await api('DELETE', `/api/sandboxes/${sb.body.sandboxID}`);
  });
});
