import { WebhookInput, WebhookView } from './webhooks';
import { z } from './zod'; // zod with .openapi()
import { AgentId } from './schemas';

const JsonObject = z.record(z.string(), z.unknown());

/** Limits of a batch, documented in the README and enforced by the schemas below. */
export const BATCH_LIMITS = { maxItems: 10_000, maxConcurrency: 100, defaultConcurrency: 10, maxAttempts: 5 } as const;

export const BatchItem = z
  .object({ input: JsonObject.default({}), metadata: JsonObject.default({}) }, { message: 'must be an object { input?, metadata? }' })
  .strict()
  .openapi('BatchItem');

const ConcurrencyNumber = z.coerce.number().int().min(1).max(BATCH_LIMITS.maxConcurrency);
const MaxAttemptsNumber = z.coerce.number().int().min(1).max(BATCH_LIMITS.maxAttempts);

const CreateBatchObject = z
  .object({
    items: z.array(BatchItem).min(1, 'must hold at least one item').max(BATCH_LIMITS.maxItems, `must hold at most ${BATCH_LIMITS.maxItems} items`),
    concurrency: z.number().int().min(1).max(BATCH_LIMITS.maxConcurrency).default(BATCH_LIMITS.defaultConcurrency),
    maxAttempts: z.number().int().min(1).max(BATCH_LIMITS.maxAttempts).default(1),
    webhook: WebhookInput.optional().describe('POSTed to once when the batch completes or is cancelled'),
  })
  .strict();

/**
 * Splits an `application/x-ndjson` body (one `{ input, metadata? }` per line) into `items`;
 * a line that is not JSON is reported as `items.<line index>`.
 */
function ndjsonItems(text: string, ctx: { addIssue: (i: { code: 'custom'; message: string; path: (string | number)[]; input: unknown }) => void }): unknown {
  const items: unknown[] = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!.trim();
    if (!line) continue;
    try {
      items.push(JSON.parse(line));
    } catch {
      ctx.addIssue({ code: 'custom', message: `line ${i + 1} is not JSON`, path: ['items', items.length], input: line });
      return { items: [] };
    }
  }
  return { items };
}

/**
 * POST …/batches body: JSON `{ items, concurrency?, maxAttempts? }`, or NDJSON items (then
 * concurrency and maxAttempts come from the query string).
 */
export const CreateBatchBody = z.preprocess((v, ctx) => (typeof v === 'string' ? ndjsonItems(v, ctx as never) : v), CreateBatchObject).openapi('CreateBatch');

export const BatchStatusEnum = z.enum(['running', 'completed', 'cancelled']);

export const BatchCounts = z
  .object({ pending: z.number().int(), running: z.number().int(), completed: z.number().int(), failed: z.number().int() })
  .openapi('BatchCounts');

export const Batch = z
  .object({
    id: z.string(),
    agent_id: z.string(),
    status: BatchStatusEnum,
    total: z.number().int(),
    concurrency: z.number().int(),
    max_attempts: z.number().int(),
    counts: BatchCounts,
    created_at: z.string(),
    updated_at: z.string(),
    completed_at: z.string().nullable(),
    webhook: WebhookView.describe('null: none; the secret is never shown'),
  })
  .openapi('Batch');

/** One line of GET …/batches/{id}/results. */
export const BatchResultLine = z
  .object({
    index: z.number().int(),
    session_id: z.string().nullable(),
    status: z.enum(['completed', 'failed', 'cancelled']),
    data: JsonObject.nullable(),
    error: z.object({ reason: z.string().nullable(), exit_code: z.number().int().nullable(), message: z.string().nullable() }).optional(),
    attempts: z.number().int(),
  })
  .openapi('BatchResultLine');

export const BatchParams = z.object({ agentId: AgentId, id: z.string().regex(/^batch_[a-z0-9]{1,64}$/, 'must be a batch id (batch_…)') });

export const BatchResultsQuery = z.object({
  after: z.coerce.number().int().min(-1).default(-1).describe('Index of the last line already read; lines start after it'),
  limit: z.coerce.number().int().min(1).max(10_000).default(1000),
});

/** For NDJSON bodies, which carry only items. */
export const CreateBatchQuery = z.object({ concurrency: ConcurrencyNumber.optional(), maxAttempts: MaxAttemptsNumber.optional() });

export type BatchView = z.infer<typeof Batch>;
export type BatchResult = z.infer<typeof BatchResultLine>;
export type CreateBatchInput = z.input<typeof CreateBatchObject>;

/** A batch by its id alone (/v1/batches/{id}). */
export const BatchById = z.object({ id: BatchParams.shape.id });
