import { assertWebhookTarget, sealWebhook, webhookSpec, webhookView } from '../../lib/webhooks';
import { readSession } from '../../store/sessions';
import { batchSummary } from '../../workflows/summary';
import { createHash } from 'node:crypto';
import { z } from 'zod';
import { WorkflowExecutionAlreadyStartedError, WorkflowNotFoundError } from '@temporalio/client';
import { WorkflowIdReusePolicy } from '@temporalio/common';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import { AgentParams, Cursor, Limit } from '../../contract/schemas';
import { Batch, BATCH_LIMITS, BatchParams, BatchResult, BatchResultLine, BatchResultsQuery, BatchStatusEnum, CreateBatchBody, CreateBatchQuery } from '../../contract/batch-schemas';
import { ApiError, conflict, invalid, notFound } from '../../lib/errors';
import { derivedId, randomId } from '../../lib/ids';
import { batchSessionId } from '../../lib/batch-ids';
import { AgentDoc, fromJsonText, isDuplicateKey, runSpecOf, SessionDoc } from '../../store';
import { BATCH_CHUNK_SIZE, batchChunkId, BatchDoc, batchesOf, BatchItemsDoc, ensureBatchIndexes } from '../../store/batches';
import { getAgent } from './agents';
import { pageOf } from '../cursor';
import type { BatchWorkflowArgs } from '../../workflows/batch';
import { AGENT_ID, BATCH_ID, ORG_ID } from '../../workflows/search-attributes';

const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,255}$/;
/** Session documents read in parallel by the results stream. */
const READ_PARALLEL = 32;

/** The public form of a batch. */
export function batchView(b: BatchDoc): z.infer<typeof Batch> {
  return {
    id: b._id,
    agent_id: b.agent_id,
    status: b.status,
    total: b.total,
    concurrency: b.concurrency,
    max_attempts: b.max_attempts,
    counts: b.counts,
    created_at: b.created_at.toISOString(),
    updated_at: b.updated_at.toISOString(),
    completed_at: b.completed_at ? b.completed_at.toISOString() : null,
    webhook: webhookView(b.webhook),
  };
}

/** Reads a batch of the caller's organisation (and agent, unless null), or throws 404. */
async function getBatch(deps: ApiDeps, orgId: string, agentId: string | null, id: string): Promise<BatchDoc> {
  const b = await batchesOf(deps.store).batches.findOne({ _id: id });
  if (!b || b.orgId !== orgId || (agentId !== null && b.agent_id !== agentId)) throw notFound(`batch ${id}`);
  return b;
}

/**
 * Cancels a running batch's workflow and waits (up to 15 s) for it to end its running sessions.
 * The workflow writes `cancelled` with its final counts; if it has not yet, this writes the status.
 */
async function cancelBatch(deps: ApiDeps, b: BatchDoc): Promise<BatchDoc> {
  if (b.status !== 'running') return b;
  const { batches } = batchesOf(deps.store);
  const handle = deps.temporal.workflow.getHandle(b._id);
  try {
    await handle.cancel();
    await Promise.race([handle.result().catch(() => undefined), new Promise((r) => setTimeout(r, 15_000).unref())]);
  } catch (err) {
    if (!(err instanceof WorkflowNotFoundError)) throw err;
  }
  const after = (await batches.findOne({ _id: b._id })) ?? b;
  if (after.status === 'running') {
    const now = new Date();
    await batches.updateOne({ _id: b._id }, { $set: { status: 'cancelled', updated_at: now, completed_at: now } });
    Object.assign(after, { status: 'cancelled', updated_at: now, completed_at: now });
  }
  return after;
}

/** Starts the batch's workflow; starting one that already exists is not an error. */
async function startBatchWorkflow(deps: ApiDeps, b: BatchDoc, agent: AgentDoc): Promise<void> {
  const args: BatchWorkflowArgs = {
    batchId: b._id,
    orgId: b.orgId,
    agentId: b.agent_id,
    run: { ...runSpecOf(agent, deps.secrets), ...(agent.webhook ? { webhook: webhookSpec(agent.webhook, deps.cfg) } : {}) },
    total: b.total,
    concurrency: b.concurrency,
    maxAttempts: b.max_attempts,
    ...(b.webhook ? { webhook: webhookSpec(b.webhook, deps.cfg) } : {}),
  };
  try {
    await deps.temporal.workflow.start('batchWorkflow', {
      taskQueue: deps.cfg.TASK_QUEUE,
      workflowId: b._id,
      staticSummary: batchSummary(b.agent_id, b._id, args.total),
      args: [args],
      workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
      typedSearchAttributes: [
        { key: AGENT_ID, value: b.agent_id },
        { key: ORG_ID, value: b.orgId },
        { key: BATCH_ID, value: b._id },
      ],
    });
  } catch (err) {
    if (err instanceof WorkflowExecutionAlreadyStartedError) return;
    throw err;
  }
}

/** Stores the items once, in chunks of BATCH_CHUNK_SIZE; chunks stored by an earlier try are kept. */
async function storeItems(deps: ApiDeps, batchId: string, items: { input: unknown; metadata: unknown }[]): Promise<void> {
  const docs: BatchItemsDoc[] = [];
  for (let c = 0; c * BATCH_CHUNK_SIZE < items.length; c++) {
    const slice = items.slice(c * BATCH_CHUNK_SIZE, (c + 1) * BATCH_CHUNK_SIZE);
    docs.push({ _id: batchChunkId(batchId, c), batch_id: batchId, inputs: slice.map((i) => JSON.stringify(i.input)), metadatas: slice.map((i) => JSON.stringify(i.metadata)) });
  }
  const { batchItems } = batchesOf(deps.store);
  // A few chunks at a time: FerretDB serialises writes, and one huge insertMany holds the whole body twice.
  for (let i = 0; i < docs.length; i += 10) {
    try {
      await batchItems.insertMany(docs.slice(i, i + 10), { ordered: false });
    } catch (err) {
      const errors = (err as { writeErrors?: unknown }).writeErrors;
      const dupOnly = errors !== undefined && [errors].flat().every((e) => (e as { code?: number }).code === 11000);
      if (!dupOnly && !isDuplicateKey(err)) throw err;
    }
  }
}

/**
 * The line of item `index`: its last attempt's session once it is final, null while the item
 * is unfinished (running, or failed with attempts left while the batch runs). An item that
 * never started in a batch that is over is `cancelled`.
 */
async function finalAttempt(deps: ApiDeps, b: BatchDoc, index: number): Promise<BatchResult | null> {
  const batchOver = b.status !== 'running';
  let last: SessionDoc | null = null;
  let attempts = 0;
  for (let a = 1; a <= b.max_attempts; a++) {
    const s = await readSession(deps.store, batchSessionId(b._id, index, a));
    if (!s) break;
    last = s;
    attempts = a;
    if (s.status !== 'failed') break;
  }
  if (!last) return batchOver ? { index, session_id: null, status: 'cancelled', data: null, attempts: 0 } : null;
  if (last.status !== 'completed' && last.status !== 'failed') return null;
  if (last.status === 'failed' && attempts < b.max_attempts && !batchOver) return null;
  const line: BatchResult = { index, session_id: last._id, status: last.status, data: fromJsonText(last.result), attempts };
  if (last.status === 'failed') line.error = { reason: last.outcome?.reason ?? null, exit_code: last.outcome?.exit_code ?? null, message: last.outcome?.message ?? null };
  return line;
}

/** /v1/agents/{agentId}/batches: create, list, read, results, cancel. */
export function registerBatchRoutes(t: RouteTable, deps: ApiDeps): void {
  ensureBatchIndexes(deps.store).catch((err) => deps.logger.warn({ err: String(err) }, 'could not create the batches index'));

  t.add({
    method: 'post',
    path: '/v1/agents/:agentId/batches',
    tag: 'batches',
    summary: `Start a batch: one session per item, at most \`concurrency\` at once (default ${BATCH_LIMITS.defaultConcurrency}, max ${BATCH_LIMITS.maxConcurrency}; 1-${BATCH_LIMITS.maxItems} items; maxAttempts 1-${BATCH_LIMITS.maxAttempts}). Items as JSON or application/x-ndjson (then concurrency/maxAttempts in the query). Send Idempotency-Key to make retries safe.`,
    params: AgentParams,
    query: CreateBatchQuery,
    body: CreateBatchBody,
    responses: { 201: { description: 'The batch, status running', schema: Batch }, 200: { description: 'The batch an earlier request with the same Idempotency-Key created', schema: Batch } },
    errors: [409, 413, 415],
    handler: async ({ params, query, body, org, req, res }) => {
      const key = req.header('idempotency-key');
      if (key !== undefined && !IDEMPOTENCY_KEY.test(key)) throw invalid('header Idempotency-Key: must be 1-255 printable ASCII characters');
      if (body.webhook) await assertWebhookTarget(deps.cfg, body.webhook.url, 'body.webhook.url');
      const agent = await getAgent(deps, org.id, params.agentId);
      const concurrency = query.concurrency ?? body.concurrency;
      const maxAttempts = query.maxAttempts ?? body.maxAttempts;
      const itemsHash = createHash('sha256').update(JSON.stringify(body.items)).digest('hex');
      const now = new Date();
      const doc: BatchDoc = {
        _id: key ? `batch_${derivedId(org.id, 'batch', key)}` : `batch_${randomId()}`,
        orgId: org.id,
        agent_id: agent.id,
        status: 'running',
        total: body.items.length,
        concurrency,
        max_attempts: maxAttempts,
        counts: { pending: body.items.length, running: 0, completed: 0, failed: 0 },
        items_hash: itemsHash,
        idempotency_key: key ?? null,
        ...(body.webhook ? { webhook: sealWebhook(deps.secrets, org.id, body.webhook) } : {}),
        created_at: now,
        updated_at: now,
        completed_at: null,
      };
      req.log = req.log?.child({ batchId: doc._id, agentId: agent.id }) ?? req.log;
      const { batches } = batchesOf(deps.store);
      if (key) {
        const existing = await batches.findOne({ _id: doc._id });
        if (existing) {
          await answerExisting(existing);
          return;
        }
      }
      await storeItems(deps, doc._id, body.items);
      try {
        await batches.insertOne(doc);
      } catch (err) {
        if (!key || !isDuplicateKey(err)) throw err;
        const existing = await batches.findOne({ _id: doc._id });
        if (!existing) throw err;
        await answerExisting(existing);
        return;
      }
      try {
        await startBatchWorkflow(deps, doc, agent);
      } catch (err) {
        await batches.deleteOne({ _id: doc._id });
        throw new ApiError('unavailable', `could not start the batch workflow: ${(err as Error).message}`);
      }
      res.locals.batchTotal = doc.total;
      res.status(201).json(batchView(doc));

      async function answerExisting(existing: BatchDoc): Promise<void> {
        if (existing.orgId !== org.id || existing.agent_id !== agent.id) throw conflict('Idempotency-Key was already used for a batch of another agent');
        if (existing.items_hash !== itemsHash) throw conflict('Idempotency-Key was already used for a batch with other items');
        // The first request may have died between storing and starting: make sure it runs.
        if (existing.status === 'running') await startBatchWorkflow(deps, existing, agent);
        res.status(200).json(batchView(existing));
      }
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
      await getAgent(deps, org.id, params.agentId);
      const filter: Record<string, unknown> = { orgId: org.id, agent_id: params.agentId };
      if (query.status) filter.status = query.status;
      const { page, next_cursor } = await pageOf(batchesOf(deps.store).batches, filter, query.limit, query.cursor);
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
      res.json(batchView(await getBatch(deps, org.id, params.agentId, params.id)));
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
      const b = await getBatch(deps, org.id, params.agentId, params.id);
      const end = Math.min(b.total, query.after + 1 + query.limit);
      // Read ahead in parallel; write in index order; stop at the first unfinished item.
      const lines: string[] = [];
      let nextAfter = query.after;
      outer: for (let from = query.after + 1; from < end; from += READ_PARALLEL) {
        const idx = Array.from({ length: Math.min(READ_PARALLEL, end - from) }, (_, k) => from + k);
        const found = await Promise.all(idx.map((i) => finalAttempt(deps, b, i)));
        for (const line of found) {
          if (!line) break outer;
          lines.push(JSON.stringify(line));
          nextAfter = line.index;
        }
      }
      res.status(200);
      res.setHeader('content-type', 'application/x-ndjson; charset=utf-8');
      res.setHeader('x-batch-status', b.status);
      res.setHeader('x-next-after', String(nextAfter));
      res.setHeader('x-batch-total', String(b.total));
      res.end(lines.length ? `${lines.join('\n')}\n` : '');
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
      res.json(batchView(await cancelBatch(deps, await getBatch(deps, org.id, params.agentId, params.id))));
    },
  });

  const ById = z.object({ id: BatchParams.shape.id });
  t.add({
    method: 'get',
    path: '/v1/batches/:id',
    tag: 'batches',
    summary: "Get a batch of the caller's organisation by id alone (same answer as …/agents/{agentId}/batches/{id})",
    params: ById,
    responses: { 200: { description: 'The batch', schema: Batch } },
    handler: async ({ params, org, res }) => {
      res.json(batchView(await getBatch(deps, org.id, null, params.id)));
    },
  });
  t.add({
    method: 'delete',
    path: '/v1/batches/:id',
    tag: 'batches',
    summary: 'Cancel a batch by id alone',
    params: ById,
    responses: { 200: { description: 'The batch after cancelling', schema: Batch } },
    handler: async ({ params, org, res }) => {
      res.json(batchView(await cancelBatch(deps, await getBatch(deps, org.id, null, params.id))));
    },
  });
}
