import type { z } from 'zod';
import type { Session } from '../api/schemas'; // MERGE: contract
import type { Batch } from '../api/batch-schemas'; // MERGE: contract
import { fromJsonText, type SessionDoc } from '../store';
import type { BatchDoc } from '../store/batches';
import { webhookView } from '../lib/webhooks';

/** The public form of a session (2.1), plus `outcome` once it has ended: what GET answers and a webhook carries. */
export function sessionView(s: SessionDoc): z.infer<typeof Session> {
  return {
    id: s._id,
    agent_id: s.agent_id,
    status: s.status,
    input: fromJsonText(s.input) ?? {},
    result: fromJsonText(s.result),
    preview_url: s.preview_url,
    metadata: fromJsonText(s.metadata) ?? {},
    outcome: s.outcome,
    created_at: s.created_at.toISOString(),
    updated_at: s.updated_at.toISOString(),
  };
}

/** The public form of a batch: what GET answers and a webhook carries. */
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
