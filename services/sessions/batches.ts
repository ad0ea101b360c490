import { createHash } from 'node:crypto';
import type { z } from 'zod';
import type { BatchResult, CreateBatchBody } from '../../contract/batch-schemas';
import { ApiError, conflict, notFound } from '../../contract/errors';
import { derivedId, randomId } from '../../lib/ids';
import { batchSessionId } from '../../lib/batch-ids';
import { assertWebhookTarget, sealWebhook, webhookSpec } from '../webhooks/webhook-rules';
import { fromJsonText, isDuplicateKey, type AgentDoc, type SessionDoc } from '../../store';
import { runSpecOf } from './run-spec';
import {
  deleteBatch,
  ensureBatchIndexes,
  findBatch,
  insertBatch,
  listBatch,
  listBatches,
  markBatchCancelled,
  storeBatchItems,
  type BatchDoc,
  type BatchStatus,
} from '../../store/batches';
import { readSession } from '../../store/sessions';
import { runningBatchCounts } from '../../store/batches';
import type { Store } from '../../store';
import { AGENT_ID, BATCH_ID, ORG_ID, batchSummary, type BatchWorkflowArgs } from '../../workflows/defs';
import type { AgentService } from '../agents/agents';
import type { ServiceDeps } from '../deps';
import { endWorkflowAndWait, startWorkflowOnce } from '../workflow-control';

/** Session documents read in parallel by the results stream. */
const READ_PARALLEL = 32;

/** Batches: one session per item of a list, a bounded number at once, each a child workflow of the batch's. */
export interface BatchService {
  /**
   * Creates a batch (its items stored first) and starts its workflow. With an idempotency key, a
   * second request answers the batch the first created (`created: false`; 409 if it was for another
   * agent or other items).
   */
  create(
    orgId: string,
    agentId: string,
    body: z.infer<typeof CreateBatchBody>,
    opts: { concurrency: number; maxAttempts: number; idempotencyKey: string | undefined; onId?: (batchId: string) => void },
  ): Promise<{ batch: BatchDoc; created: boolean }>;
  list(orgId: string, agentId: string, q: { status?: BatchStatus; limit: number; cursor?: string }): Promise<{ page: BatchDoc[]; next_cursor: string | null }>;
  /** Reads a batch of the organisation (and agent, unless null), or throws 404. */
  get(orgId: string, agentId: string | null, id: string): Promise<BatchDoc>;
  /**
   * The finished items after index `after`, in index order, at most `limit`, stopping at the
   * first one not finished yet; `nextAfter` is the `after` to ask with next.
   */
  results(b: BatchDoc, after: number, limit: number): Promise<{ lines: BatchResult[]; nextAfter: number }>;
  /** Cancels a running batch (waits up to 15 s for its workflow) and returns it as it is then. */
  cancel(orgId: string, agentId: string | null, id: string): Promise<BatchDoc>;
}

export function createBatchService(deps: ServiceDeps, agents: Pick<AgentService, 'get'>): BatchService {
  ensureBatchIndexes(deps.store).catch((err) => deps.logger.warn({ err: String(err) }, 'could not create the batches index'));

  const get = async (orgId: string, agentId: string | null, id: string): Promise<BatchDoc> => {
    const b = await findBatch(deps.store, id);
    if (!b || b.orgId !== orgId || (agentId !== null && b.agent_id !== agentId)) throw notFound(`batch ${id}`);
    return b;
  };

  /** Starts the batch's workflow; starting one that already exists is not an error. */
  const startBatchWorkflow = async (b: BatchDoc, agent: AgentDoc): Promise<void> => {
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
    await startWorkflowOnce(deps.temporal, 'batchWorkflow', {
      taskQueue: deps.cfg.TASK_QUEUE,
      workflowId: b._id,
      staticSummary: batchSummary(b.agent_id, b._id, args.total),
      args: [args],
      typedSearchAttributes: [
        { key: AGENT_ID, value: b.agent_id },
        { key: ORG_ID, value: b.orgId },
        { key: BATCH_ID, value: b._id },
      ],
    });
  };

  /**
   * The line of item `index`: its last attempt's session once it is final, null while the item
   * is unfinished (running, or failed with attempts left while the batch runs). An item that
   * never started in a batch that is over is `cancelled`.
   */
  const finalAttempt = async (b: BatchDoc, index: number): Promise<BatchResult | null> => {
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
    if (last.status === 'failed')
      line.error = { reason: last.outcome?.reason ?? null, exit_code: last.outcome?.exit_code ?? null, message: last.outcome?.message ?? null };
    return line;
  };

  return {
    async create(orgId, agentId, body, opts) {
      const key = opts.idempotencyKey;
      if (body.webhook) await assertWebhookTarget(deps.cfg, body.webhook.url, 'body.webhook.url');
      const agent = await agents.get(orgId, agentId);
      const itemsHash = createHash('sha256').update(JSON.stringify(body.items)).digest('hex');
      const now = new Date();
      const doc: BatchDoc = {
        _id: key ? `batch_${derivedId(orgId, 'batch', key)}` : `batch_${randomId()}`,
        orgId,
        agent_id: agent.id,
        status: 'running',
        total: body.items.length,
        concurrency: opts.concurrency,
        max_attempts: opts.maxAttempts,
        counts: { pending: body.items.length, running: 0, completed: 0, failed: 0 },
        items_hash: itemsHash,
        idempotency_key: key ?? null,
        ...(body.webhook ? { webhook: sealWebhook(deps.secrets, orgId, body.webhook) } : {}),
        created_at: now,
        updated_at: now,
        completed_at: null,
      };
      opts.onId?.(doc._id);
      const answerExisting = async (existing: BatchDoc): Promise<{ batch: BatchDoc; created: boolean }> => {
        if (existing.orgId !== orgId || existing.agent_id !== agent.id) throw conflict('Idempotency-Key was already used for a batch of another agent');
        if (existing.items_hash !== itemsHash) throw conflict('Idempotency-Key was already used for a batch with other items');
        await listBatch(deps.store, existing);
        // The first request may have died between storing and starting: make sure it runs.
        if (existing.status === 'running') await startBatchWorkflow(existing, agent);
        return { batch: existing, created: false };
      };
      if (key) {
        const existing = await findBatch(deps.store, doc._id);
        if (existing) return answerExisting(existing);
      }
      await storeBatchItems(deps.store, doc._id, body.items);
      try {
        await insertBatch(deps.store, doc);
      } catch (err) {
        if (!key || !isDuplicateKey(err)) throw err;
        const existing = await findBatch(deps.store, doc._id);
        if (!existing) throw err;
        return answerExisting(existing);
      }
      try {
        await startBatchWorkflow(doc, agent);
      } catch (err) {
        await deleteBatch(deps.store, doc);
        throw new ApiError('unavailable', `could not start the batch workflow: ${(err as Error).message}`);
      }
      return { batch: doc, created: true };
    },

    async list(orgId, agentId, q) {
      await agents.get(orgId, agentId);
      return listBatches(deps.store, orgId, agentId, q.status, q.limit, q.cursor);
    },

    get,

    async results(b, after, limit) {
      const end = Math.min(b.total, after + 1 + limit);
      // Read ahead in parallel; answer in index order; stop at the first unfinished item.
      const lines: BatchResult[] = [];
      let nextAfter = after;
      outer: for (let from = after + 1; from < end; from += READ_PARALLEL) {
        const idx = Array.from({ length: Math.min(READ_PARALLEL, end - from) }, (_, k) => from + k);
        const found = await Promise.all(idx.map((i) => finalAttempt(b, i)));
        for (const line of found) {
          if (!line) break outer;
          lines.push(line);
          nextAfter = line.index;
        }
      }
      return { lines, nextAfter };
    },

    /**
     * Cancels a running batch's workflow and waits (up to 15 s) for it to end its running sessions.
     * The workflow writes `cancelled` with its final counts; if it has not yet, this writes the status.
     */
    async cancel(orgId, agentId, id) {
      const b = await get(orgId, agentId, id);
      if (b.status !== 'running') return b;
      await endWorkflowAndWait(deps.temporal, b._id, (h) => h.cancel());
      const after = (await findBatch(deps.store, b._id)) ?? b;
      if (after.status === 'running') {
        const now = new Date();
        await markBatchCancelled(deps.store, b._id, now);
        Object.assign(after, { status: 'cancelled', updated_at: now, completed_at: now });
      }
      return after;
    },
  };
}

/** The items of every running batch by state, summed (the API's sap_batch_items gauge). */
export async function runningBatchItems(store: Store): Promise<Record<'pending' | 'running' | 'completed' | 'failed', number>> {
  const counts = { pending: 0, running: 0, completed: 0, failed: 0 };
  const running = await runningBatchCounts(store);
  for (const c of running) for (const k of Object.keys(counts) as (keyof typeof counts)[]) counts[k] += (c as unknown as Record<string, number>)[k] ?? 0;
  return counts;
}
