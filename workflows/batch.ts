import {
  CancellationScope,
  condition,
  continueAsNew,
  executeChild,
  isCancellation,
  ParentClosePolicy,
  ChildWorkflowCancellationType,
  proxyActivities,
  setHandler,
} from '@temporalio/workflow';
import { WorkflowIdReusePolicy } from '@temporalio/common';
import type { Activities } from '../activities';
import type { BatchCounts } from '../contract/workflows';
import { batchSessionId } from '../lib/batch-ids';
import { AGENT_ID, BATCH_ID, ORG_ID, SESSION_STATUS } from './search-attributes';
import { sessionWorkflow } from './session';
import { batchSummary } from './summary';
import { startWebhook } from './webhook';
import { batchCountsQuery, type BatchProgress, type BatchWorkflowArgs } from './defs';

export { batchCountsQuery, type BatchProgress, type BatchWorkflowArgs } from './defs';

/** Item starts per workflow run; then the run drains and continues as new, so history stays bounded. */
export const ITEMS_PER_RUN = 500;
/** The batch document's counts are written at most this often. */
const FLUSH_EVERY = '1 second';

const { prepareBatchSessions, recordBatchProgress, discardBatchSessions } = proxyActivities<Activities>({
  startToCloseTimeout: '1 minute',
  retry: { initialInterval: '500 ms', backoffCoefficient: 2, maximumInterval: '10 s' },
});

/**
 * A batch: starts each item as a child session workflow (id derived from the batch id, the item's
 * index and the attempt), never more than `concurrency` at once; re-runs a failed item up to
 * `maxAttempts` times. Session documents are created ahead in bulk windows. Counts go to the batch
 * document at most once a second. After ITEMS_PER_RUN starts the run drains and continues as new.
 * Cancelling the batch cancels its running sessions (which destroy their sandboxes), discards the
 * sessions prepared but never started, and marks the batch `cancelled`.
 */
export async function batchWorkflow(args: BatchWorkflowArgs): Promise<BatchCounts> {
  const { batchId, total, concurrency, maxAttempts } = args;
  const p: BatchProgress = args.progress ?? { next: 0, completed: 0, failed: 0, prepared: 0, retries: [] };
  const window = Math.min(500, Math.max(100, 2 * concurrency));
  let running = 0;
  let startedThisRun = 0;
  let cancelled = false;
  let dirty = false;
  let closed = false;

  const counts = (): BatchCounts => ({
    pending: total - running - p.completed - p.failed,
    running,
    completed: p.completed,
    failed: p.failed,
  });
  setHandler(batchCountsQuery, counts);

  // Session documents of first attempts, created a window ahead of the items that start.
  let preparing: Promise<void> | undefined;
  const prepareAhead = (): Promise<void> => {
    if (!preparing && p.prepared < total) {
      const from = p.prepared;
      const to = Math.min(total, from + window);
      preparing = prepareBatchSessions({ batchId, orgId: args.orgId, agentId: args.agentId, from, to }).then(() => {
        p.prepared = to;
        preparing = undefined;
      });
    }
    return preparing ?? Promise.resolve();
  };

  // Writes the counts when they changed, at most once per FLUSH_EVERY; ends when the run closes
  // (or is cancelled: the cancellation path writes the last counts itself).
  const flusher = (async () => {
    try {
      while (!closed) {
        await condition(() => dirty || closed);
        if (closed) break;
        dirty = false;
        await recordBatchProgress({ batchId, counts: counts() });
        await condition(() => closed, FLUSH_EVERY);
      }
    } catch (err) {
      if (!isCancellation(err)) throw err;
    }
  })();

  async function runItem(index: number, attempt: number): Promise<void> {
    let status: 'completed' | 'failed' = 'failed';
    try {
      if (attempt > 1) await prepareBatchSessions({ batchId, orgId: args.orgId, agentId: args.agentId, from: 0, to: 0, jobs: [{ index, attempt }] });
      else while (p.prepared <= index) await prepareAhead();
      const sessionId = batchSessionId(batchId, index, attempt);
      const r = await executeChild(sessionWorkflow, {
        workflowId: sessionId,
        staticSummary: `${batchSummary(args.agentId, batchId, total, index)} · session ${sessionId}`,
        args: [{ sessionId, orgId: args.orgId, agentId: args.agentId, run: args.run }],
        parentClosePolicy: ParentClosePolicy.REQUEST_CANCEL,
        cancellationType: ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
        workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
        typedSearchAttributes: [
          { key: AGENT_ID, value: args.agentId },
          { key: SESSION_STATUS, value: 'creating' },
          { key: ORG_ID, value: args.orgId },
          { key: BATCH_ID, value: batchId },
        ],
      });
      status = r.status;
    } catch (err) {
      // A failed session fails its workflow (ChildWorkflowFailure): the item failed. A child
      // cancelled on its own (its session deleted) is a failed item too; only the batch's own
      // cancellation stops the retries.
      if (isCancellation(err) && CancellationScope.current().consideredCancelled) cancelled = true;
      status = 'failed';
    } finally {
      running--;
      if (status === 'failed' && attempt < maxAttempts && !cancelled) p.retries.push({ index, attempt: attempt + 1 });
      else if (status === 'completed') p.completed++;
      else p.failed++;
      dirty = true;
    }
  }

  try {
    for (;;) {
      await condition(() => running < concurrency);
      if (startedThisRun >= ITEMS_PER_RUN) break;
      let job = p.retries.shift();
      if (!job && p.next < total) job = { index: p.next++, attempt: 1 };
      if (!job) {
        if (running === 0) break;
        await condition(() => p.retries.length > 0 || running === 0);
        continue;
      }
      startedThisRun++;
      running++;
      dirty = true;
      // Keep the next window of session documents ready before the items reach it.
      if (p.prepared < total && p.next + concurrency >= p.prepared) prepareAhead().catch(() => undefined);
      void runItem(job.index, job.attempt);
    }
    await condition(() => running === 0);
    if (preparing) await preparing;
  } catch (err) {
    if (!isCancellation(err)) throw err;
    cancelled = true;
    await CancellationScope.nonCancellable(async () => {
      // Running sessions were asked to cancel; each ends (sandbox destroyed) before it reports.
      await condition(() => running === 0);
      // Items waiting for another attempt end with the attempt that failed.
      p.failed += p.retries.length;
      p.retries = [];
      if (preparing) await preparing.catch(() => undefined);
      await discardBatchSessions({ batchId, from: p.next, to: p.prepared });
      closed = true;
      await flusher.catch(() => undefined);
      await recordBatchProgress({ batchId, counts: counts(), status: 'cancelled' });
      if (args.webhook) await startWebhook({ event: 'batch.completed', orgId: args.orgId, subjectId: batchId, webhook: args.webhook });
    });
    throw err;
  }

  closed = true;
  await flusher;
  if (p.next < total || p.retries.length > 0) {
    await recordBatchProgress({ batchId, counts: counts() });
    await continueAsNew<typeof batchWorkflow>({ ...args, progress: p });
  }
  await recordBatchProgress({ batchId, counts: counts(), status: 'completed' });
  if (args.webhook) await startWebhook({ event: 'batch.completed', orgId: args.orgId, subjectId: batchId, webhook: args.webhook });
  return counts();
}
