/**
 * A sandbox's metrics (GET /api/sandboxes/{id}/metrics, and the worker's per-sandbox Prometheus
 * gauges) and live resizes (POST /api/sandboxes/{id}/scale, the published client's Sandbox.scale),
 * against real sandboxes: a process that allocates memory, a file written, bytes sent and received
 * through its link; a resize that lets a process allocate what it could not, that refuses what is above
 * the maxima or the host's room, and that survives hibernate and wake.
 */
import fs from 'node:fs';
import os from 'node:os';
import { api, eventually } from '../../helpers/env';
import { otherOrgKey } from '../../helpers/checkpoints';
import { hostClient, newSandbox, run, sh } from '../../helpers/sandboxes';
import { runSdk } from '../../helpers/sdk';

jest.setTimeout(180_000);

const MiB = 1024 * 1024;
const made: string[] = [];
afterAll(async () => {
  await Promise.all(made.map((id) => api('DELETE', `/api/sandboxes/${id}`).catch(() => undefined)));
});

const sandbox = (body: Record<string, unknown> = {}) => newSandbox(body, { created: made });
const metrics = async (id: string) => {
  const r = await api('GET', `/api/sandboxes/${id}/metrics`);
  if (r.status !== 200) throw new Error(`metrics of ${id}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
};
const cgroupFile = (controller: string, id: string, file: string) => fs.readFileSync(`/sys/fs/cgroup/${controller}/sap/${id}/${file}`, 'utf8').trim();
/** Allocates (and touches) `mb` MB in Python, then prints ok. */
const allocate = (mb: number) => `python3 -c "b = b'x' * (${mb} << 20); print('ok')"`;

describe('GET /api/sandboxes/{id}/metrics', () => {
  it('reflects memory allocated, a file written, processes, CPU used and bytes through the link', async () => {
    const id = await sandbox({ memoryMB: 512, cpuCount: 1 });
    const asked = Date.now();
    const m0 = await metrics(id);
    const answered = Date.now();
    expect(m0).toMatchObject({
      sandboxID: id,
      cpu: { count: 1 },
      memory: { limitBytes: 512 * MiB },
      processes: { limit: 512 },
      cpuCount: 1,
      memTotal: 512 * MiB,
    });
    // Read while the request was served (the host runs on this machine's clock).
    expect(Date.parse(m0.timestamp)).toBeGreaterThanOrEqual(asked);
    expect(Date.parse(m0.timestamp)).toBeLessThanOrEqual(answered);
    for (const v of [m0.cpu.usageSeconds, m0.memory.usedBytes, m0.disk.usedBytes, m0.disk.limitBytes, m0.network.rxBytes, m0.network.txBytes]) {
      expect(typeof v).toBe('number');
      expect(v).toBeGreaterThanOrEqual(0);
    }
    expect(m0.disk.limitBytes).toBeGreaterThan(0);

    // A process holding 96 MB, a 40 MB file, a second of CPU.
    await sh(id, `setsid nohup python3 -c "b = b'x' * (96 << 20); import time; time.sleep(600)" > /dev/null 2>&1 < /dev/null &`);
    await sh(id, 'head -c 40M /dev/urandom > /workspace/blob && sync');
    await sh(id, 'timeout 1 sh -c "while :; do :; done" || true');
    const m1 = await eventually(
      async () => {
        const m = await metrics(id);
        return m.memory.usedBytes >= 96 * MiB ? m : undefined;
      },
      30_000,
      200,
    );
    expect(m1.memory.peakBytes).toBeGreaterThanOrEqual(m1.memory.usedBytes - MiB);
    expect(m1.disk.usedBytes - m0.disk.usedBytes).toBeGreaterThanOrEqual(39 * MiB);
    expect(m1.processes.current).toBeGreaterThanOrEqual(2);
    expect(m1.cpu.usageSeconds - m0.cpu.usageSeconds).toBeGreaterThanOrEqual(0.3);
    expect(m1.memUsed).toBe(m1.memory.usedBytes);
    expect(m1.diskUsed).toBe(m1.disk.usedBytes);

    // Bytes through the link, sent to no outside address: 300 datagrams of 1400 bytes to the sandbox's
    // gateway (the host, whose services the table refuses: they cross the link all the same), and
    // name lookups answered by the host's resolver (bytes in).
    const before = await metrics(id);
    const sent = await sh(
      id,
      `python3 -c "
import socket, struct
gw = next(socket.inet_ntoa(struct.pack('<L', int(l.split()[2], 16))) for l in open('/proc/net/route').read().splitlines()[1:] if l.split()[1] == '00000000')
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(300): s.sendto(b'x' * 1400, (gw, 9))
print('sent')"; timeout 5 getent hosts name.metrics.test > /dev/null; true`,
    );
    expect(sent.trim()).toBe('sent');
    const after = await metrics(id);
    expect(after.network.txBytes - before.network.txBytes).toBeGreaterThanOrEqual(300 * 1400);
    expect(after.network.txPackets - before.network.txPackets).toBeGreaterThanOrEqual(300);
    expect(after.network.rxBytes - before.network.rxBytes).toBeGreaterThan(0);
    // Counters only grow.
    expect(after.cpu.usageSeconds).toBeGreaterThanOrEqual(before.cpu.usageSeconds);
    expect(after.network.rxPackets).toBeGreaterThanOrEqual(before.network.rxPackets);
  });

  it('is 401 without a key, 404 for another organisation or an unknown sandbox, 409 when hibernated', async () => {
    const id = await sandbox({ memoryMB: 128 });
    const other = await otherOrgKey();
    expect((await api('GET', `/api/sandboxes/${id}/metrics`, { key: null })).status).toBe(401);
    const foreign = await api('GET', `/api/sandboxes/${id}/metrics`, { key: other });
    expect([foreign.status, foreign.body.error.type]).toEqual([404, 'not_found']);
    const foreignScale = await api('POST', `/api/sandboxes/${id}/scale`, { key: other, body: { memoryMB: 256 } });
    expect([foreignScale.status, foreignScale.body.error.type]).toEqual([404, 'not_found']);
    expect((await api('GET', `/api/sandboxes/sb-0000000000000000/metrics`)).status).toBe(404);
    // The other organisation's attempt changed nothing.
    expect(cgroupFile('memory', id, 'memory.limit_in_bytes')).toBe(String(128 * MiB));
    expect((await api('POST', `/api/sandboxes/${id}/hibernate`)).status).toBe(200);
    const asleep = await api('GET', `/api/sandboxes/${id}/metrics`);
    expect([asleep.status, asleep.body.error.type]).toEqual([409, 'conflict']);
  });
});

describe('POST /api/sandboxes/{id}/scale', () => {
  it('raises memory live so that a process allocates what it could not, and changes the CPU quota', async () => {
    const id = await sandbox({ memoryMB: 96, cpuCount: 1 });
    expect(cgroupFile('cpu', id, 'cpu.cfs_quota_us')).toBe('100000');
    const small = await run(id, allocate(160));
    expect(small.exitCode).not.toBe(0);
    const r = await api('POST', `/api/sandboxes/${id}/scale`, { body: { memoryMB: 320, cpuCount: 0.5 } });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({ sandboxID: id, memoryMB: 320, cpuCount: 0.5, cpuPercent: 50 });
    expect(cgroupFile('memory', id, 'memory.limit_in_bytes')).toBe(String(320 * MiB));
    expect(cgroupFile('cpu', id, 'cpu.cfs_quota_us')).toBe('50000');
    expect((await sh(id, allocate(160))).trim()).toBe('ok');
    expect((await api('GET', `/api/sandboxes/${id}`)).body).toMatchObject({ memoryMB: 320, cpuCount: 0.5 });
    expect((await metrics(id)).memory.limitBytes).toBe(320 * MiB);
    // cpuCount 0 takes the quota away.
    expect((await api('POST', `/api/sandboxes/${id}/scale`, { body: { cpuCount: 0 } })).body).toMatchObject({ memoryMB: 320, cpuCount: 0 });
    expect(cgroupFile('cpu', id, 'cpu.cfs_quota_us')).toBe('-1');
  });

  it('refuses what is above the maxima (400), the host has no room for (503), or cannot be reclaimed (409), changing nothing', async () => {
    const id = await sandbox({ memoryMB: 256, cpuCount: 1 });
    const limit = () => cgroupFile('memory', id, 'memory.limit_in_bytes');
    for (const body of [{ memoryMB: 1024 * 1024 }, { cpuCount: 4000 }, {}, { memoryMB: 'lots' }, { memoryMB: 4 }, { cpuCount: -1 }]) {
      const r = await api('POST', `/api/sandboxes/${id}/scale`, { body });
      expect({ body, status: r.status, type: r.body?.error?.type }).toEqual({ body, status: 400, type: 'invalid_request' });
      expect(typeof r.body.error.message).toBe('string');
    }
    const over = await api('POST', `/api/sandboxes/${id}/scale`, { body: { memoryMB: 1024 * 1024 } });
    expect(over.body.error.message).toMatch(/SANDBOX_MAX_MEMORY_MB/);
    // The whole machine's memory is within the maximum (its default) but not available on the host.
    const whole = await api('POST', `/api/sandboxes/${id}/scale`, { body: { memoryMB: Math.floor(os.totalmem() / MiB) } });
    expect([whole.status, whole.body.error.type]).toEqual([503, 'unavailable']);
    expect(whole.body.error.message).toMatch(/available/);
    expect(limit()).toBe(String(256 * MiB));
    // Below what a process holds (anonymous memory, no swap to put it in): the kernel cannot reclaim it.
    await sh(id, `setsid nohup python3 -c "b = b'x' * (160 << 20); import time; time.sleep(600)" > /dev/null 2>&1 < /dev/null &`);
    await eventually(async () => Number(cgroupFile('memory', id, 'memory.usage_in_bytes')) >= 160 * MiB, 30_000, 200);
    const swap = fs.readFileSync('/proc/meminfo', 'utf8').match(/^SwapTotal:\s+(\d+)/m)?.[1];
    const lower = await api('POST', `/api/sandboxes/${id}/scale`, { body: { memoryMB: 64 } });
    if (swap === '0') {
      expect([lower.status, lower.body.error.type]).toEqual([409, 'conflict']);
      expect(lower.body.error.message).toMatch(/could not reclaim/);
      expect(limit()).toBe(String(256 * MiB));
      expect((await api('GET', `/api/sandboxes/${id}`)).body.memoryMB).toBe(256);
    } else {
      expect(lower.status).toBe(200);
    }
  });

  it('keeps the new limits across hibernate and wake (record, state file, cgroups)', async () => {
    const id = await sandbox({ memoryMB: 128, cpuCount: 1 });
    expect((await api('POST', `/api/sandboxes/${id}/scale`, { body: { memoryMB: 384, cpuCount: 2 } })).status).toBe(200);
    expect((await api('POST', `/api/sandboxes/${id}/hibernate`)).status).toBe(200);
    const woke = await api('POST', `/api/sandboxes/${id}/wake`, { body: {} });
    expect(woke.status).toBe(200);
    expect(woke.body).toMatchObject({ status: 'running', memoryMB: 384, cpuCount: 2 });
    expect(cgroupFile('memory', id, 'memory.limit_in_bytes')).toBe(String(384 * MiB));
    expect(cgroupFile('cpu', id, 'cpu.cfs_quota_us')).toBe('200000');
    expect((await metrics(id)).memory.limitBytes).toBe(384 * MiB);
  });

  it("works through the published client's Sandbox.scale", async () => {
    const id = await sandbox({ memoryMB: 128 });
    const r = await runSdk(
      `
      const sb = await sdk.Sandbox.connect(process.env.SB, opts);
      out(await sb.scale({ memoryMB: 256 }));
    `,
      { SB: id },
    );
    expect(r).toMatchObject({ sandboxID: id, memoryMB: 256 });
    expect(cgroupFile('memory', id, 'memory.limit_in_bytes')).toBe(String(256 * MiB));
  });
});

describe('Prometheus gauges of running sandboxes', () => {
  it("are on the worker's /metrics per sandbox, for a bounded number of sandboxes per host", async () => {
    const [a, b] = [await sandbox({ memoryMB: 128 }), await sandbox({ memoryMB: 128 })];
    await sh(a, `setsid nohup python3 -c "b = b'x' * (48 << 20); import time; time.sleep(600)" > /dev/null 2>&1 < /dev/null &`);
    const url = process.env.SAP_TEST_WORKER_METRICS_URL!;
    const text = await eventually(
      async () => {
        const t = await (await fetch(url)).text();
        return t.includes(`sap_sandbox_memory_bytes{sandbox="${a}"`) && t.includes(`sap_sandbox_memory_limit_bytes{sandbox="${b}"`) ? t : undefined;
      },
      30_000,
      500,
    );
    expect(text).toMatch(new RegExp(`sap_sandbox_memory_limit_bytes\\{sandbox="${a}",org="[^"]+"\\} ${128 * MiB}`));
    expect(text).toMatch(/^sap_sandbox_metrics_omitted \d+$/m);
    // The host answers at most `limit` sandboxes, the largest memory user first, and how many run.
    const top = await hostClient().busiestSandboxes(1);
    expect(top.sandboxes).toHaveLength(1);
    expect(top.total).toBeGreaterThanOrEqual(2);
    const none = await hostClient().busiestSandboxes(0);
    expect(none.sandboxes).toEqual([]);
  });
});
