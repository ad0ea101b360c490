export type { SessionEnd } from '../store/sessions';

import type { SessionOutcome } from '../store';

/** What a session workflow returns (visible in the Temporal UI); the result data stays in MongoDB. */
export interface SessionWorkflowResult {
  sessionId: string;
  workflowId: string;
  status: 'completed' | 'failed';
  outcome: SessionOutcome | null;
}
