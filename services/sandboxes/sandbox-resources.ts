/**
 * A sandbox's resources through the API: its metrics now (GET /api/sandboxes/{id}/metrics) and live
 * resizes of its memory and CPU limits (POST /api/sandboxes/{id}/scale, OpenComputer's route), both
 * answered by its host; a resize is also written to the sandbox's record.
 */
import { overMaximum } from '../../config/limits';
import { ApiError, invalid } from '../../contract/errors';
import type { SandboxMetrics } from '../../sandbox';
import { updateSandbox, type SandboxDoc } from '../../store/sandboxes';
import type { SandboxDeps } from '../deps';
import { fromHostError } from '../hosts/host-errors';
import { getOrgSandbox } from './sandboxes';

/** GET /api/sandboxes/{id}/metrics: the host's reading, with E2B's flat fields (`getMetrics`) beside it. */
export type SandboxMetricsView = SandboxMetrics & {
  sandboxID: string;
  cpuCount: number;
  cpuUsedPct: number | null;
  memUsed: number | null;
  memTotal: number | null;
  diskUsed: number | null;
  diskTotal: number | null;
};

/** The answer of a resize: OpenComputer's ScaleResult (`cpuPercent`: 100 per CPU of quota, 0 for none), and `cpuCount`. */
export interface ScaleView {
  sandboxID: string;
  memoryMB: number | null;
  cpuCount: number;
  cpuPercent: number;
}

/** 409 unless the sandbox runs (a hibernated sandbox has no cgroups to read or resize). */
function assertRunning(doc: SandboxDoc): void {
  if (doc.status !== 'running') throw new ApiError('conflict', `sandbox ${doc._id} is ${doc.status}; only a running sandbox has metrics and can be resized`);
}

/** The resource operations of the API (see the module comment). */
export function createResourceService(deps: Pick<SandboxDeps, 'cfg' | 'store' | 'hosts'>) {
  return {
    /** The organisation's running sandbox's metrics; 404 for another organisation's, 409 when not running. */
    async metrics(orgId: string, id: string): Promise<SandboxMetricsView> {
      const doc = await getOrgSandbox(deps, orgId, id);
      assertRunning(doc);
      const host = await deps.hosts.get(doc.hostId);
      let m: SandboxMetrics;
      try {
        m = await host.sandboxMetrics(doc._id);
      } catch (err) {
        throw fromHostError(err, `sandbox ${doc._id}`);
      }
      return {
        sandboxID: doc._id,
        ...m,
        cpuCount: m.cpu.count,
        cpuUsedPct: m.cpu.percent,
        memUsed: m.memory.usedBytes,
        memTotal: m.memory.limitBytes,
        diskUsed: m.disk.usedBytes,
        diskTotal: m.disk.limitBytes,
      };
    },

    /**
     * Resizes the organisation's running sandbox at once: 400 above the operator's maxima
     * (SANDBOX_MAX_MEMORY_MB, SANDBOX_MAX_CPU_COUNT), 503 when its host has no room for more memory,
     * 409 when the memory it uses cannot be reclaimed below a lower limit (nothing changes) or it does not run.
     */
    async scale(orgId: string, id: string, body: { memoryMB?: number; cpuCount?: number }): Promise<ScaleView> {
      // The sandbox first: another organisation's is a 404 whatever the body.
      const doc = await getOrgSandbox(deps, orgId, id);
      if (body.memoryMB === undefined && body.cpuCount === undefined) throw invalid('body: give memoryMB, cpuCount or both');
      const over = overMaximum(deps.cfg.limits, body, 'body.');
      if (over) throw invalid(over);
      assertRunning(doc);
      const host = await deps.hosts.get(doc.hostId);
      let r;
      try {
        r = await host.scaleSandbox(doc._id, body);
      } catch (err) {
        throw fromHostError(err, `sandbox ${doc._id}`);
      }
      await updateSandbox(deps.store, doc._id, { memoryMB: r.memoryMB, cpuCount: r.cpuCount, updatedAt: new Date() });
      return { sandboxID: doc._id, memoryMB: r.memoryMB, cpuCount: r.cpuCount, cpuPercent: Math.round(r.cpuCount * 100) };
    },
  };
}

/** The resource operations (see createResourceService). */
export type ResourceService = ReturnType<typeof createResourceService>;
