import type { SessionOutcome } from '../store';

/** How a session ended: what the activities hand back to the workflow and record. */
export interface SessionEnd {
  status: 'completed' | 'failed';
  result: Record<string, unknown> | null;
  outcome: SessionOutcome | null;
}

/** What a session workflow returns (visible in the Temporal UI); the result data stays in MongoDB. */
export interface SessionWorkflowResult {
  sessionId: string;
  workflowId: string;
  status: 'completed' | 'failed';
  outcome: SessionOutcome | null;
}
