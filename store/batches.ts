import type { Collection } from 'mongodb';
import { isDuplicateKey, type Store } from './index';
import { addToList, listName, listUnlisted, pageListed, removeFromList } from './listing';
import type { BatchCounts, StoredWebhook } from '../contract/workflows';

export type BatchStatus = 'running' | 'completed' | 'cancelled';

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

/** Reads a batch; null when there is none. */
export function findBatch(store: Store, id: string): Promise<BatchDoc | null> {
  return batchesOf(store).batches.findOne({ _id: id });
}

/** The list of an agent's batches (store/listing.ts). */
const batchList = (orgId: string, agentId: string) => listName('batches', orgId, agentId);

/** Stores a new batch and lists it; throws MongoDB's duplicate-key error when its id is taken. */
export async function insertBatch(store: Store, doc: BatchDoc): Promise<void> {
  await batchesOf(store).batches.insertOne(doc);
  await addToList(store, batchList(doc.orgId, doc.agent_id), [doc]);
}

/** Makes sure a stored batch is listed (a retried creation whose first try stopped between the two writes). */
export async function listBatch(store: Store, doc: BatchDoc): Promise<void> {
  await addToList(store, batchList(doc.orgId, doc.agent_id), [doc]);
}

/** Deletes a batch document and its listing key (its workflow could not be started). */
export async function deleteBatch(store: Store, doc: BatchDoc): Promise<void> {
  await batchesOf(store).batches.deleteOne({ _id: doc._id });
  await removeFromList(store, batchList(doc.orgId, doc.agent_id), doc);
}

/**
 * One page of an agent's batches (those with `status`, if given), newest first: a range of
 * listing keys, so its cost does not grow with the list (a status filter reads at most 2,000 keys
 * per page: the page may then be short, with a cursor to go on).
 */
export function listBatches(
  store: Store,
  orgId: string,
  agentId: string,
  status: BatchStatus | undefined,
  limit: number,
  cursor: string | undefined,
): Promise<{ page: BatchDoc[]; next_cursor: string | null }> {
  const load = async (id: string) => {
    const b = await findBatch(store, id);
    return b && b.orgId === orgId && b.agent_id === agentId ? b : null;
  };
  return pageListed(store, batchList(orgId, agentId), cursor, limit, load, status ? (b) => b.status === status : undefined);
}

/** Lists the batches stored before batches were listed by key, once per database; returns how many it read. */
export function listUnlistedBatches(store: Store): Promise<number> {
  const all = batchesOf(store).batches.find({}, { projection: { orgId: 1, agent_id: 1, created_at: 1 } });
  return listUnlisted(store, 'migrated:batches-listed', all, (b) => ({ list: batchList(b.orgId, b.agent_id), id: b._id }));
}

/** Marks a batch cancelled, ended at `at`. */
export async function markBatchCancelled(store: Store, id: string, at: Date): Promise<void> {
  await batchesOf(store).batches.updateOne({ _id: id }, { $set: { status: 'cancelled', updated_at: at, completed_at: at } });
}

/**
 * Stores a batch's items once, in chunks of BATCH_CHUNK_SIZE, a few chunks at a time (FerretDB
 * serialises writes, and one huge insertMany holds the whole body twice); chunks stored by an
 * earlier try are kept.
 */
export async function storeBatchItems(store: Store, batchId: string, items: { input: unknown; metadata: unknown }[]): Promise<void> {
  const docs: BatchItemsDoc[] = [];
  for (let c = 0; c * BATCH_CHUNK_SIZE < items.length; c++) {
    const slice = items.slice(c * BATCH_CHUNK_SIZE, (c + 1) * BATCH_CHUNK_SIZE);
    docs.push({
      _id: batchChunkId(batchId, c),
      batch_id: batchId,
      inputs: slice.map((i) => JSON.stringify(i.input)),
      metadatas: slice.map((i) => JSON.stringify(i.metadata)),
    });
  }
  const { batchItems } = batchesOf(store);
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

/** Reads the `batch_items` chunk `chunk` of a batch; null when it is missing. */
export function findBatchChunk(store: Store, batchId: string, chunk: number): Promise<BatchItemsDoc | null> {
  return batchesOf(store).batchItems.findOne({ _id: batchChunkId(batchId, chunk) });
}

/** Writes a batch's counts (and, at its end, its status). Filtered by `_id` alone. */
export async function recordBatchCounts(store: Store, batchId: string, counts: BatchCounts, status?: BatchStatus): Promise<void> {
  const now = new Date();
  const set: Record<string, unknown> = { counts, updated_at: now };
  if (status) {
    set.status = status;
    set.completed_at = now;
  }
  await batchesOf(store).batches.updateOne({ _id: batchId }, { $set: set });
}

/** The counts of every running batch. */
export async function runningBatchCounts(store: Store): Promise<BatchCounts[]> {
  const running = await batchesOf(store)
    .batches.find({ status: 'running' }, { projection: { counts: 1 } })
    .toArray();
  return running.map((b) => b.counts);
}
