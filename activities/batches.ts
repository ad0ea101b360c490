import type { BatchCounts } from '../contract/workflows';
import type { BatchJob, BatchStatus } from '../services/sessions/batch-runs';
import { withFailureTypes } from './failures';
import type { ActivityDeps } from './deps';

export type { BatchJob } from '../services/sessions/batch-runs';

/**
 * The batch activities: adapters from Temporal's calls to the batch-run service
 * (services/sessions/batch-runs.ts). Each is harmless to retry.
 */
export const createBatchActivities = (deps: ActivityDeps) => ({
  /** Creates the session documents of items `from … to-1` (attempt 1) and of `jobs`; existing ones are left as they are. */
  async prepareBatchSessions(args: { batchId: string; orgId: string; agentId: string; from: number; to: number; jobs?: BatchJob[] }): Promise<number> {
    return withFailureTypes(deps.services.batchRuns.prepareSessions(args));
  },

  /** Writes a batch's counts (and, at its end, its status). */
  async recordBatchProgress(args: { batchId: string; counts: BatchCounts; status?: BatchStatus }): Promise<void> {
    await withFailureTypes(deps.services.batchRuns.recordProgress(args));
  },

  /** Deletes the session documents created ahead for items `from … to-1` that never started, when a batch is cancelled. */
  async discardBatchSessions(args: { batchId: string; from: number; to: number }): Promise<number> {
    return withFailureTypes(deps.services.batchRuns.discardUnstartedSessions(args));
  },
});
