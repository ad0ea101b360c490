export type { SessionEnd, SessionWorkflowResult } from '../contract/workflows';
