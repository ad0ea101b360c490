export { sessionWorkflow } from './session';
export type { SessionWorkflowArgs } from './session';
export { batchWorkflow } from './batch';
export type { BatchWorkflowArgs } from './batch';
export { instanceWorkflow } from './instance';
export { webhookWorkflow } from './webhook';
export type { WebhookWorkflowArgs } from './webhook';
export type { InstanceWorkflowArgs } from './instance';
export { conversationWorkflow } from './conversation';
