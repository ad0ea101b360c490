import type { Collection } from 'mongodb';
import type { Store } from './index';
import type { StoredWebhook } from '../lib/webhooks';

export type BatchStatus = 'running' | 'completed' | 'cancelled';

/** How many of a batch's items are in each state. */
export interface BatchCounts {
  pending: number;
  running: number;
  completed: number;
  failed: number;
}

/**
 * A batch of sessions. `_id` is the batch id (`batch_<id>`), also its workflow id. The counts are
 * written by the batch workflow at a bounded rate, so they are readable while every worker is down.
 */
export interface BatchDoc {
  _id: string;
  orgId: string;
  agent_id: string;
  status: BatchStatus;
  total: number;
  concurrency: number;
  max_attempts: number;
  counts: BatchCounts;
  /** sha256 of the items, to tell an idempotent retry from a different batch under the same key. */
  items_hash: string;
  idempotency_key: string | null;
  /** Called once when the batch completes (or is cancelled); absent: none. */
  webhook?: StoredWebhook | null;
  created_at: Date;
  updated_at: Date;
  completed_at: Date | null;
}

/**
 * A chunk of a batch's items, stored once: `_id` is `<batchId>:<chunk>`, holding items
 * `chunk * BATCH_CHUNK_SIZE …` in order, each input and metadata as JSON text.
 */
export interface BatchItemsDoc {
  _id: string;
  batch_id: string;
  inputs: string[];
  metadatas: string[];
}

/** Items per `batch_items` document. */
export const BATCH_CHUNK_SIZE = 100;

/** The `batch_items` document holding item `index`. */
export const batchChunkId = (batchId: string, chunk: number): string => `${batchId}:${chunk}`;

export { batchSessionId } from '../lib/batch-ids';

export interface BatchCollections {
  batches: Collection<BatchDoc>;
  batchItems: Collection<BatchItemsDoc>;
}

/** The batch collections of a store. */
export function batchesOf(store: Store): BatchCollections {
  return {
    batches: store.db.collection<BatchDoc>('batches'),
    batchItems: store.db.collection<BatchItemsDoc>('batch_items'),
  };
}

/** Creates the index that lists an agent's batches. */
export async function ensureBatchIndexes(store: Store): Promise<void> {
  await batchesOf(store).batches.createIndex({ orgId: 1, agent_id: 1, created_at: -1 });
}
