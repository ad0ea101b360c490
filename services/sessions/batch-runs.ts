/**
 * The steps of a batch's workflow that touch its records: create the session documents of the items
 * about to start (in bulk), record progress at a bounded rate, and discard sessions that will never start.
 */
import type { BatchCounts } from '../../contract/workflows';
import { batchSessionId } from '../../lib/batch-ids';
import type { SessionDoc, Store } from '../../store';
import { BATCH_CHUNK_SIZE, findBatchChunk, recordBatchCounts, type BatchItemsDoc, type BatchStatus } from '../../store/batches';
import { deleteUnstartedSessions, insertSessionsOnce } from '../../store/sessions';

export type { BatchStatus } from '../../store/batches';

/** One item attempt a batch is about to start. */
export interface BatchJob {
  index: number;
  attempt: number;
}

export function createBatchRunService(deps: { store: Store }) {
  return {
    /**
     * Creates the session documents of items `from … to-1` (attempt 1) and of `jobs`, in one
     * insertMany per call. A document that already exists is left as it is, so a retry is harmless.
     */
    async prepareSessions(args: { batchId: string; orgId: string; agentId: string; from: number; to: number; jobs?: BatchJob[] }): Promise<number> {
      const jobs: BatchJob[] = [...(args.jobs ?? [])];
      for (let i = args.from; i < args.to; i++) jobs.push({ index: i, attempt: 1 });
      if (jobs.length === 0) return 0;
      const chunkNos = [...new Set(jobs.map((j) => Math.floor(j.index / BATCH_CHUNK_SIZE)))];
      const chunks = new Map<number, BatchItemsDoc>();
      await Promise.all(
        chunkNos.map(async (c) => {
          const doc = await findBatchChunk(deps.store, args.batchId, c);
          if (!doc) throw new Error(`items chunk ${c} of ${args.batchId} is missing`);
          chunks.set(c, doc);
        }),
      );
      const now = new Date();
      const docs: SessionDoc[] = jobs.map(({ index, attempt }) => {
        const chunk = chunks.get(Math.floor(index / BATCH_CHUNK_SIZE))!;
        const at = index % BATCH_CHUNK_SIZE;
        return {
          _id: batchSessionId(args.batchId, index, attempt),
          orgId: args.orgId,
          agent_id: args.agentId,
          status: 'creating',
          input: chunk.inputs[at] ?? '{}',
          metadata: chunk.metadatas[at] ?? '{}',
          result: null,
          preview_url: null,
          outcome: null,
          sandbox_id: null,
          idempotency_key: null,
          created_at: now,
          updated_at: now,
          started_at: null,
          completed_at: null,
        };
      });
      await insertSessionsOnce(deps.store, docs);
      return docs.length;
    },

    /** Writes a batch's counts (and, at its end, its status). Filtered by `_id` alone. */
    async recordProgress(args: { batchId: string; counts: BatchCounts; status?: BatchStatus }): Promise<void> {
      await recordBatchCounts(deps.store, args.batchId, args.counts, args.status);
    },

    /**
     * Deletes the session documents created ahead for items `from … to-1` that never started
     * (still `creating`), when a batch is cancelled.
     */
    async discardUnstartedSessions(args: { batchId: string; from: number; to: number }): Promise<number> {
      if (args.to <= args.from) return 0;
      const ids: string[] = [];
      for (let i = args.from; i < args.to; i++) ids.push(batchSessionId(args.batchId, i, 1));
      return deleteUnstartedSessions(deps.store, ids);
    },
  };
}

export type BatchRunService = ReturnType<typeof createBatchRunService>;
