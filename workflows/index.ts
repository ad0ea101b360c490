export { sessionWorkflow } from './session';
export type { SessionWorkflowArgs } from './session';
