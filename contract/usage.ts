/**
 * An organisation's usage (/api/usage): the view.
 */
import { z } from './zod'; // zod with .openapi()

export const Usage = z
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
