/**
 * The host's routes for sandboxes' resources: one sandbox's metrics, live resizes within the
 * operator's maxima, and the metrics of the busiest sandboxes (by memory) for Prometheus.
 */
import type express from 'express';
import type { Request, Response, NextFunction } from 'express';
import type { z } from 'zod';
import { overMaximum, type SandboxLimits } from '../../config/limits';
import { isSandboxError, SandboxError } from '../../contract/errors';
import type { SandboxProvider } from '../driver';
import { SandboxCgroups } from '../proc-refs-and-cgroups';
import type { SandboxMetricsEntry } from '../host-contract/types';
import { schemas } from './server-schemas';

type Wrap = (fn: (req: Request, res: Response) => Promise<void>) => (req: Request, res: Response, next: NextFunction) => void;
type Parse = <S extends z.ZodType>(schema: S, req: Request) => z.infer<S>;

/** Memory a sandbox's cgroup uses now (0 when unknown): what GET /metrics/sandboxes ranks by. */
function memoryUsed(id: string): number {
  return Number(SandboxCgroups.of(id).readCounter('memory', 'memory.usage_in_bytes') ?? 0) || 0;
}

/** Registers the resource routes on the host's app. */
export function resourceRoutes(app: express.Express, provider: SandboxProvider, limits: SandboxLimits, h: Wrap, parse: Parse): void {
  app.get(
    '/sandboxes/:id/metrics',
    h(async (req, res) => {
      const { params } = parse(schemas.byId, req);
      res.json(await provider.resources.metrics(params.id));
    }),
  );

  app.post(
    '/sandboxes/:id/scale',
    h(async (req, res) => {
      const { params, body } = parse(schemas.scale, req);
      const over = overMaximum(limits, body, 'body.');
      if (over) throw new SandboxError('invalid_request', over);
      res.json(await provider.resources.scale(params.id, body));
    }),
  );

  // At most `limit` running sandboxes, the largest memory users first (bounded label cardinality for
  // the worker's gauges); `total` says how many there are.
  app.get(
    '/metrics/sandboxes',
    h(async (req, res) => {
      const { query } = parse(schemas.sandboxMetrics, req);
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
    }),
  );
}
