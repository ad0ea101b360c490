import client from 'prom-client';
import type { HostClient, SandboxMetricsEntry } from '../sandbox';

/** How long one scrape's reading of the host serves the other gauges of the same scrape (ms). */
const READING_TTL_MS = 1000;

/**
 * Per-sandbox gauges of the running sandboxes of this worker's host, read from the host at scrape
 * time: CPU seconds, memory used/limit, disk used/limit, network bytes in/out, processes. Labels are
 * `sandbox` (id) and `org`, for at most `max` sandboxes (SANDBOX_METRICS_MAX), the largest memory
 * users first, so that the series per host stay bounded; `sap_sandbox_metrics_omitted` says how many
 * running sandboxes were left out. max 0: no per-sandbox gauges.
 */
export function registerSandboxGauges(registry: client.Registry, host: Pick<HostClient, 'busiestSandboxes'>, max: number): void {
  if (max <= 0) return;
  let reading: { at: number; p: Promise<{ total: number; sandboxes: SandboxMetricsEntry[] }> } | undefined;
  const read = () => {
    if (!reading || Date.now() - reading.at > READING_TTL_MS) reading = { at: Date.now(), p: host.busiestSandboxes(max) };
    return reading.p;
  };
  const labelNames = ['sandbox', 'org'] as const;
  const gauge = (name: string, help: string, value: (e: SandboxMetricsEntry) => number | null) =>
    new client.Gauge({
      name,
      help,
      labelNames,
      registers: [registry],
      async collect() {
        this.reset();
        const r = await read().catch(() => null);
        for (const e of r?.sandboxes ?? []) {
          const v = value(e);
          if (v !== null) this.set({ sandbox: e.id, org: e.orgId }, v);
        }
      },
    });
  gauge('sap_sandbox_cpu_seconds', 'CPU time used by the sandbox since it started (cpuacct)', (e) => e.metrics.cpu.usageSeconds);
  gauge('sap_sandbox_cpu_quota', 'CPUs of CFS quota (0: none)', (e) => e.metrics.cpu.count);
  gauge('sap_sandbox_memory_bytes', 'Memory the sandbox uses (its cgroup, page cache and tmpfs included)', (e) => e.metrics.memory.usedBytes);
  gauge('sap_sandbox_memory_limit_bytes', 'Memory limit of the sandbox', (e) => e.metrics.memory.limitBytes);
  gauge('sap_sandbox_memory_peak_bytes', 'Most memory the sandbox has used', (e) => e.metrics.memory.peakBytes);
  gauge('sap_sandbox_disk_bytes', "Bytes written in the sandbox's writable layer", (e) => e.metrics.disk.usedBytes);
  gauge('sap_sandbox_disk_limit_bytes', "Size of the sandbox's writable layer", (e) => e.metrics.disk.limitBytes);
  gauge('sap_sandbox_network_receive_bytes', 'Bytes into the sandbox through its link', (e) => e.metrics.network.rxBytes);
  gauge('sap_sandbox_network_transmit_bytes', 'Bytes out of the sandbox through its link', (e) => e.metrics.network.txBytes);
  gauge('sap_sandbox_processes', 'Processes in the sandbox', (e) => e.metrics.processes.current);
  new client.Gauge({
    name: 'sap_sandbox_metrics_omitted',
    help: 'Running sandboxes of this host left out of the sap_sandbox_* gauges (beyond SANDBOX_METRICS_MAX)',
    registers: [registry],
    async collect() {
      const r = await read().catch(() => null);
      if (r) this.set(Math.max(0, r.total - r.sandboxes.length));
    },
  });
}
