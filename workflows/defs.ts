/**
 * The definitions of the workflows that callers outside them need: their arguments, signals,
 * queries, search attributes and summaries. Imports nothing from activities/, so the services
 * (which start, signal and query workflows) depend on this module and not on workflow code.
 */
import { defineQuery, defineSignal } from '@temporalio/workflow';
import type { AgentRunSpec } from '../store';
import type { BatchCounts } from '../store/batches';
import type { WebhookSpec } from '../lib/webhooks';

export { AGENT_ID, BATCH_ID, ORG_ID, SESSION_STATUS, SEARCH_ATTRIBUTE_FLAGS } from './search-attributes';
export { batchSummary, sessionSummary } from './summary';

/** Arguments of one session's workflow. The workflow id is the session id. */
export interface SessionWorkflowArgs {
  sessionId: string;
  orgId: string;
  agentId: string;
  run: AgentRunSpec;
  /** The session's input (JSON text) when it is small; a larger one is read from MongoDB by provisioning. */
  input?: string;
}

/** What a batch carries from one run to the next when it continues as new. */
export interface BatchProgress {
  /** Items `0 … next-1` have been started at least once. */
  next: number;
  completed: number;
  failed: number;
  /** Items `0 … prepared-1` have their first attempt's session document. */
  prepared: number;
  /** Failed items waiting for another attempt. */
  retries: { index: number; attempt: number }[];
}

/** Arguments of a batch's workflow. The workflow id is the batch id. */
export interface BatchWorkflowArgs {
  batchId: string;
  orgId: string;
  agentId: string;
  run: AgentRunSpec;
  total: number;
  concurrency: number;
  maxAttempts: number;
  progress?: BatchProgress;
  /** The batch's own webhook, called once when it completes or is cancelled. */
  webhook?: WebhookSpec;
}

/** Live counts of a batch, answered by its workflow. */
export const batchCountsQuery = defineQuery<BatchCounts>('batchCounts');

/** Arguments of an instance's workflow. The workflow id is the instance id (`inst_<id>`). */
export interface InstanceWorkflowArgs {
  instanceId: string;
  orgId: string;
  agentId: string;
  run: AgentRunSpec;
}

export interface InstanceWorkflowResult {
  instanceId: string;
  status: 'failed' | 'stopped';
  error: string | null;
}

/** Asks the instance to destroy its sandbox and end (DELETE …/instances/{id}). */
export const destroyInstanceSignal = defineSignal('destroyInstance');

/** Its sandbox's host was lost (worker/host-watch.ts): the instance ends failed, reason host_lost. */
export const hostLostSignal = defineSignal<[{ hostId: string }]>('hostLost');

/** Arguments of a webhook delivery's workflow. */
export interface WebhookWorkflowArgs {
  event: 'session.ended' | 'batch.completed';
  orgId: string;
  subjectId: string;
  webhook: WebhookSpec;
}
