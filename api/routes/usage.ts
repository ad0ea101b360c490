import { z } from 'zod';
import type { RouteTable } from '../http';
import type { UsageService } from '../../services/usage';

const Usage = z
  .object({
    storage: z.object({
      usedBytes: z.number().int().describe("Bytes of the organisation's checkpoint layers (snapshot builds make checkpoints too)"),
      reservedBytes: z
        .number()
        .int()
        .describe('Bytes reserved by captures under way (checkpoints, snapshot builds): what each will add, held until its size is recorded'),
      quotaBytes: z.number().int().nullable().describe('Its storage quota (ORG_STORAGE_QUOTA_MB, or its own setting); null: unlimited'),
      checkpoints: z.number().int(),
      snapshots: z.number().int(),
    }),
  })
  .openapi('Usage');

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
