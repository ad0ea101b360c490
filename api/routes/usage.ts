import type { RouteTable } from '../http';
import type { UsageService } from '../../services/orgs/usage';
import { Usage } from '../../contract/usage';

/** GET /api/usage: what the caller's organisation stores, against its quota. */
export function registerUsageRoutes(t: RouteTable, usage: UsageService): void {
  t.add({
    method: 'get',
    path: '/api/usage',
    tag: 'usage',
    summary: "The organisation's storage use (checkpoints and snapshots) and its quota; over the quota, new ones are refused with 507",
    responses: { 200: { description: 'Usage', schema: Usage } },
    handler: async ({ org, res }) => {
      res.json({ storage: await usage.storage(org.id) });
    },
  });
}
