import { ParentClosePolicy, proxyActivities, startChild, workflowInfo } from '@temporalio/workflow';
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/common';
import type { Activities } from '../activities';
import { nonRetryableFailureTypes } from '../contract/errors';
import type { WebhookWorkflowArgs } from './defs';

export type { WebhookWorkflowArgs } from './defs';

/**
 * One webhook delivery, durable: the activity is retried with backoff (WEBHOOK_RETRY_INITIAL_MS,
 * doubling up to WEBHOOK_RETRY_MAX_INTERVAL_MS) for WEBHOOK_MAX_HOURS, across restarts of any
 * process. Its workflow id (`<subject>-webhook`) is the delivery id the receiver sees on every attempt.
 * A delivery that never succeeds fails this workflow, where the Temporal UI shows it.
 */
export async function webhookWorkflow(args: WebhookWorkflowArgs): Promise<{ status: number }> {
  const { retry } = args.webhook;
  const { deliverWebhook } = proxyActivities<Activities>({
    // The activity ends its exchange within attemptMs (WEBHOOK_TIMEOUT_MS); this only bounds a stuck worker.
    startToCloseTimeout: (retry.attemptMs ?? 10_000) + 5_000,
    scheduleToCloseTimeout: Math.round(retry.maxHours * 3600 * 1000),
    retry: {
      initialInterval: retry.initialMs,
      backoffCoefficient: 2,
      maximumInterval: retry.maxIntervalMs,
      nonRetryableErrorTypes: nonRetryableFailureTypes(),
    },
  });
  return deliverWebhook({ event: args.event, orgId: args.orgId, subjectId: args.subjectId, deliveryId: workflowInfo().workflowId, webhook: args.webhook });
}

/**
 * Starts the delivery of `subjectId`'s webhook as a workflow of its own that outlives its parent
 * (ABANDON): the session or batch ends now; the delivery retries for as long as it needs. Starting
 * it twice (a replayed parent) is not an error.
 */
export async function startWebhook(args: WebhookWorkflowArgs): Promise<void> {
  try {
    await startChild(webhookWorkflow, {
      workflowId: `${args.subjectId}-webhook`,
      args: [args],
      parentClosePolicy: ParentClosePolicy.ABANDON,
      staticSummary: `${args.event} ${args.subjectId} → ${args.webhook.url.replace(/^https?:\/\/([^/?#]*).*$/s, '$1')}`,
    });
  } catch (err) {
    if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
  }
}
