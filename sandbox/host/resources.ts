/**
 * The host's routes for sandboxes' resources: one sandbox's metrics, live resizes within the
 * operator's maxima, and the metrics of the busiest sandboxes (by memory) for Prometheus.
 */
import { overMaximum, type SandboxLimits } from '../../config/limits';
import { isSandboxError, SandboxError } from '../../contract/errors';
import type { SandboxProvider } from '../driver';
import { SandboxCgroups } from '../proc-refs-and-cgroups';
import type { SandboxMetricsEntry } from '../host-contract/types';
import { hostRoutes } from '../host-contract/wire';
import type { Serve } from './serve';

/** Memory a sandbox's cgroup uses now (0 when unknown): what GET /metrics/sandboxes ranks by. */
function memoryUsed(id: string): number {
  return Number(SandboxCgroups.of(id).readCounter('memory', 'memory.usage_in_bytes') ?? 0) || 0;
}

/** Registers the resource routes on the host's app. */
export function resourceRoutes(serve: Serve, provider: SandboxProvider, limits: SandboxLimits): void {
  serve(hostRoutes.sandboxMetrics, async ({ params }, res) => {
    res.json(await provider.resources.metrics(params.id));
  });

  serve(hostRoutes.scaleSandbox, async ({ params, body }, res) => {
    const over = overMaximum(limits, body, 'body.');
    if (over) throw new SandboxError('invalid_request', over);
    res.json(await provider.resources.scale(params.id, body));
  });

  // At most `limit` running sandboxes, the largest memory users first (bounded label cardinality for
  // the worker's gauges); `total` says how many there are.
  serve(hostRoutes.busiestSandboxes, async ({ query }, res) => {
    const running = provider.list().filter((s) => s.status === 'running');
    const top = running
      .map((s) => ({ s, used: memoryUsed(s.id) }))
      .sort((a, b) => b.used - a.used)
      .slice(0, query.limit);
    const entries: SandboxMetricsEntry[] = [];
    for (const { s } of top) {
      try {
        entries.push({ id: s.id, orgId: s.orgId, owner: s.owner?.kind ?? 'none', metrics: await provider.resources.metrics(s.id, { sample: false }) });
      } catch (err) {
        // Gone or stopped between the list and the reading.
        if (!isSandboxError(err)) throw err;
      }
    }
    res.json({ total: running.length, sandboxes: entries });
  });
}
