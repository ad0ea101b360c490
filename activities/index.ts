import { createHostActivities } from './hosts';
import type { ActivityDeps } from './deps';
import { createSessionActivities } from './sessions';
import { createBatchActivities } from './batches';
import { createInstanceActivities } from './instances';
import { createConversationActivities } from './conversations';
import { createWebhookActivities } from './webhooks';

export type { ActivityDeps } from './deps';
export type { EntrypointExit, Provisioned } from './sessions';

/**
 * Every activity the worker registers, built from its dependencies. Workflows import the type
 * only: `proxyActivities<Activities>(…)`.
 */
export const createActivities = (deps: ActivityDeps) => ({
  ...createSessionActivities(deps),
  ...createBatchActivities(deps),
  ...createInstanceActivities(deps),
  ...createConversationActivities(deps),
  ...createWebhookActivities(deps),
  ...createHostActivities(deps),
});

export type Activities = ReturnType<typeof createActivities>;
