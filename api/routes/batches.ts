import { z } from 'zod';
import type { RouteTable } from '../http';
import { idempotencyKeyOf } from '../idempotency';
import { AgentParams, Cursor, Limit } from '../../contract/schemas';
import {
  Batch,
  BATCH_LIMITS,
  BatchParams,
  BatchResultLine,
  BatchResultsQuery,
  BatchStatusEnum,
  CreateBatchBody,
  CreateBatchQuery,
  BatchById,
} from '../../contract/batch-schemas';
import { batchView } from '../../services/views';
import type { BatchService } from '../../services/sessions/batches';

/** /v1/agents/{agentId}/batches: create, list, read, results, cancel. */
export function registerBatchRoutes(t: RouteTable, batches: BatchService): void {
  t.add({
    method: 'post',
    path: '/v1/agents/:agentId/batches',
    tag: 'batches',
    summary: `Start a batch: one session per item, at most \`concurrency\` at once (default ${BATCH_LIMITS.defaultConcurrency}, max ${BATCH_LIMITS.maxConcurrency}; 1-${BATCH_LIMITS.maxItems} items; maxAttempts 1-${BATCH_LIMITS.maxAttempts}). Items as JSON or application/x-ndjson (then concurrency/maxAttempts in the query). Send Idempotency-Key to make retries safe.`,
    params: AgentParams,
    query: CreateBatchQuery,
    body: CreateBatchBody,
    responses: {
      201: { description: 'The batch, status running', schema: Batch },
      200: { description: 'The batch an earlier request with the same Idempotency-Key created', schema: Batch },
    },
    errors: [409, 413, 415],
    handler: async ({ params, query, body, org, req, res }) => {
      const key = idempotencyKeyOf(req);
      const { batch, created } = await batches.create(org.id, params.agentId, body, {
        concurrency: query.concurrency ?? body.concurrency,
        maxAttempts: query.maxAttempts ?? body.maxAttempts,
        idempotencyKey: key,
        onId: (batchId) => (req.log = req.log?.child({ batchId, agentId: params.agentId }) ?? req.log),
      });
      if (created) res.locals.batchTotal = batch.total;
      res.status(created ? 201 : 200).json(batchView(batch));
    },
  });

  t.add({
    method: 'get',
    path: '/v1/agents/:agentId/batches',
    tag: 'batches',
    summary: 'List batches, newest first',
    params: AgentParams,
    query: z.object({ status: BatchStatusEnum.optional(), limit: Limit, cursor: Cursor.optional() }),
    responses: { 200: { description: 'A page of batches', schema: z.object({ batches: z.array(Batch), next_cursor: z.string().nullable() }) } },
    handler: async ({ params, query, org, res }) => {
      const { page, next_cursor } = await batches.list(org.id, params.agentId, query);
      res.json({ batches: page.map(batchView), next_cursor });
    },
  });

  t.add({
    method: 'get',
    path: '/v1/agents/:agentId/batches/:id',
    tag: 'batches',
    summary: 'Get a batch and its live counts (served from MongoDB: works while every worker is down; counts lag by at most about a second)',
    params: BatchParams,
    responses: { 200: { description: 'The batch', schema: Batch } },
    handler: async ({ params, org, res }) => {
      res.json(batchView(await batches.get(org.id, params.agentId, params.id)));
    },
  });

  t.add({
    method: 'get',
    path: '/v1/agents/:agentId/batches/:id/results',
    tag: 'batches',
    summary:
      'Stream finished items as NDJSON lines { index, session_id, status, data, error?, attempts }, in index order, starting after `after`. The stream stops at the first item not finished yet: pass the last index read as `after` to resume. Headers: X-Batch-Status, X-Next-After (the `after` to send next).',
    params: BatchParams,
    query: BatchResultsQuery,
    responses: { 200: { description: 'One BatchResultLine per line', schema: BatchResultLine, contentType: 'application/x-ndjson' } },
    handler: async ({ params, query, org, res }) => {
      const b = await batches.get(org.id, params.agentId, params.id);
      const { lines, nextAfter } = await batches.results(b, query.after, query.limit);
      res.status(200);
      res.setHeader('content-type', 'application/x-ndjson; charset=utf-8');
      res.setHeader('x-batch-status', b.status);
      res.setHeader('x-next-after', String(nextAfter));
      res.setHeader('x-batch-total', String(b.total));
      res.end(lines.length ? `${lines.map((l) => JSON.stringify(l)).join('\n')}\n` : '');
    },
  });

  t.add({
    method: 'delete',
    path: '/v1/agents/:agentId/batches/:id',
    tag: 'batches',
    summary: 'Cancel a batch: nothing new starts, running sessions end (sandboxes destroyed); status cancelled',
    params: BatchParams,
    responses: { 200: { description: 'The batch after cancelling (unchanged if it had already ended)', schema: Batch } },
    handler: async ({ params, org, res }) => {
      res.json(batchView(await batches.cancel(org.id, params.agentId, params.id)));
    },
  });

  t.add({
    method: 'get',
    path: '/v1/batches/:id',
    tag: 'batches',
    summary: "Get a batch of the caller's organisation by id alone (same answer as …/agents/{agentId}/batches/{id})",
    params: BatchById,
    responses: { 200: { description: 'The batch', schema: Batch } },
    handler: async ({ params, org, res }) => {
      res.json(batchView(await batches.get(org.id, null, params.id)));
    },
  });
  t.add({
    method: 'delete',
    path: '/v1/batches/:id',
    tag: 'batches',
    summary: 'Cancel a batch by id alone',
    params: BatchById,
    responses: { 200: { description: 'The batch after cancelling', schema: Batch } },
    handler: async ({ params, org, res }) => {
      res.json(batchView(await batches.cancel(org.id, null, params.id)));
    },
  });
}
