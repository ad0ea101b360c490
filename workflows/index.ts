export { sessionWorkflow } from './session';
export type { SessionWorkflowArgs } from './session';
export { batchWorkflow } from './batch';
export type { BatchWorkflowArgs } from './batch';
export { instanceWorkflow } from './instance';
export type { InstanceWorkflowArgs } from './instance';
