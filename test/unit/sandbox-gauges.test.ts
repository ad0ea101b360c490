/**
 * The worker's per-sandbox gauges (worker/sandbox-gauges.ts) over a fake host: one series per
 * sandbox the host answers, at most SANDBOX_METRICS_MAX asked for, the rest counted as omitted; and
 * the host-room reading of a resize (MemAvailable).
 */
import client from 'prom-client';
import { registerSandboxGauges } from '../../worker/sandbox-gauges';
import { availableMemoryMB } from '../../sandbox/base/resources';
import type { SandboxMetricsEntry } from '../../sandbox';

const entry = (id: string, usedBytes: number): SandboxMetricsEntry => ({
  id,
  orgId: 'org-a',
  owner: 'api',
  metrics: {
    timestamp: new Date().toISOString(),
    cpu: { count: 1, usageSeconds: 2.5, percent: null, windowMs: null, throttledSeconds: 0 },
    memory: { usedBytes, limitBytes: 1 << 30, peakBytes: usedBytes, cacheBytes: 0, oomKills: 0 },
    disk: { usedBytes: 4096, limitBytes: 1 << 20 },
    network: { rxBytes: 10, txBytes: null, rxPackets: 1, txPackets: null },
    processes: { current: 3, limit: 512 },
  },
});

describe('per-sandbox gauges', () => {
  it('export what the host answers for at most `max` sandboxes, and count the others as omitted', async () => {
    const asked: number[] = [];
    const host = {
      busiestSandboxes: async (limit: number) => {
        asked.push(limit);
        return { total: 5, sandboxes: [entry('sb-a', 300), entry('sb-b', 200)].slice(0, limit) };
      },
    };
    const registry = new client.Registry();
    registerSandboxGauges(registry, host, 2);
    const text = await registry.metrics();
    expect(asked.every((n) => n === 2)).toBe(true);
    expect(asked.length).toBeGreaterThanOrEqual(1);
    expect(text).toContain('sap_sandbox_memory_bytes{sandbox="sb-a",org="org-a"} 300');
    expect(text).toContain('sap_sandbox_memory_bytes{sandbox="sb-b",org="org-a"} 200');
    expect(text).toContain('sap_sandbox_cpu_seconds{sandbox="sb-a",org="org-a"} 2.5');
    expect(text).toMatch(/^sap_sandbox_metrics_omitted 3$/m);
    // A reading the host has no source for is no series at all (not a zero).
    expect(text).not.toContain('sap_sandbox_network_transmit_bytes{');
    expect(text).toContain('sap_sandbox_network_receive_bytes{sandbox="sb-a",org="org-a"} 10');
  });

  it('are not registered with max 0, and a host that fails yields no series', async () => {
    const off = new client.Registry();
    registerSandboxGauges(off, { busiestSandboxes: async () => ({ total: 1, sandboxes: [entry('sb-a', 1)] }) }, 0);
    expect(await off.metrics()).not.toContain('sap_sandbox_');
    const failing = new client.Registry();
    registerSandboxGauges(failing, { busiestSandboxes: async () => Promise.reject(new Error('down')) }, 10);
    expect(await failing.metrics()).not.toMatch(/sap_sandbox_memory_bytes\{/);
  });
});

describe('availableMemoryMB', () => {
  it('reads MemAvailable in MB, null without it', () => {
    expect(availableMemoryMB('MemTotal:       24683520 kB\nMemAvailable:   22020096 kB\n')).toBe(21504);
    expect(availableMemoryMB('MemTotal: 1 kB\n')).toBeNull();
    expect(availableMemoryMB()).toBeGreaterThan(0);
  });
});
