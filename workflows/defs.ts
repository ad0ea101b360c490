/**
 * The definitions of the workflows that callers outside them need: their arguments, signals,
 * queries, search attributes and summaries. Imports nothing from activities/, so the services
 * (which start, signal and query workflows) depend on this module and not on workflow code.
 */
import { defineQuery, defineSignal } from '@temporalio/workflow';
import type { BatchCounts } from '../contract/workflows';

export { AGENT_ID, BATCH_ID, ORG_ID, SESSION_STATUS, SEARCH_ATTRIBUTE_FLAGS } from './search-attributes';
export { batchSummary, sessionSummary } from './summary';
export type {
  BatchProgress,
  BatchWorkflowArgs,
  InstanceWorkflowArgs,
  InstanceWorkflowResult,
  SessionWorkflowArgs,
  WebhookWorkflowArgs,
} from '../contract/workflows';

/** Live counts of a batch, answered by its workflow. */
export const batchCountsQuery = defineQuery<BatchCounts>('batchCounts');

/** Asks the instance to destroy its sandbox and end (DELETE …/instances/{id}). */
export const destroyInstanceSignal = defineSignal('destroyInstance');

/** Its sandbox's host was lost (services/hosts/host-watch.ts): the instance ends failed, reason host_lost. */
export const hostLostSignal = defineSignal<[{ hostId: string }]>('hostLost');
