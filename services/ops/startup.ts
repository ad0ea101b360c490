/**
 * What the API process does with the store when it starts, before it listens: connects, makes sure
 * the bootstrap key exists, and brings records written by older versions up to date (each a no-op
 * once done). The worker process only connects (openWorkerStore).
 */
import { backfillStorageEntries } from '../../store/storage-entries';
import { backfillOpenExecs } from '../../store/exec';
import { backfillPreviewEntries } from '../../store/previews';
import type { Logger } from '../../lib/logger';
import type { SecretBox } from '../../lib/secret-box';
import { connectStore, type Store } from '../../store';
import { listUnlistedAgents, sealLegacyAgentEnvs } from '../../store/agents';
import { listUnlistedBatches } from '../../store/batches';
import { ensureApiKey, orgOfWorkflowId } from '../../store/orgs';
import { listUnlistedSandboxes } from '../../store/sandboxes';
import { listUnlistedSessions } from '../../store/sessions';

/** Connects to MongoDB at `url` and makes sure `bootstrapKey` (when set) is a key of the `default` organisation. */
export async function openApiStore(url: string, bootstrapKey: string | null | undefined): Promise<Store> {
  const store = await connectStore(url);
  if (bootstrapKey) await ensureApiKey(store, 'default', bootstrapKey);
  return store;
}

/** Connects the worker to MongoDB at `url`; the API made the indexes when it started. */
export function openWorkerStore(url: string): Promise<Store> {
  return connectStore(url, { ensureIndexes: false });
}

/** The organisation a workflow belongs to (by its id), for the per-organisation payload codec. */
export const workflowOrgLookup =
  (store: Store) =>
  (workflowId: string): Promise<string | null> =>
    orgOfWorkflowId(store, workflowId);

/** Brings records written by older versions up to date: sealed agent env values, and the listings by key. */
export async function migrateOnStart(store: Store, secrets: SecretBox, logger: Logger): Promise<void> {
  // Agents written before env values were sealed: sealed now, so MongoDB holds no value.
  const sealed = await sealLegacyAgentEnvs(store, secrets);
  if (sealed > 0) logger.info({ agents: sealed }, 'sealed the env values of agents written before they were sealed');
  // Sessions stored before they were listed by key (store/listing.ts): listed now, once.
  const listed = await listUnlistedSessions(store);
  if (listed > 0) logger.info({ sessions: listed }, 'listed the sessions stored before sessions were listed by key');
  // So are agents, batches and live sandboxes.
  const more = { agents: await listUnlistedAgents(store), batches: await listUnlistedBatches(store), sandboxes: await listUnlistedSandboxes(store) };
  if (more.agents + more.batches + more.sandboxes > 0) logger.info(more, 'listed the agents, batches and live sandboxes stored before they were listed by key');
  // Checkpoints recorded before storage entries existed (store/storage-entries.ts): counted there now, once.
  const counted = await backfillStorageEntries(store);
  if (counted > 0) logger.info({ checkpoints: counted }, 'gave the checkpoints recorded before storage entries existed theirs');
  // Exec sessions without an exit recorded before open-exec entries existed (store/exec.ts): entered now, once.
  const open = await backfillOpenExecs(store);
  if (open > 0) logger.info({ execSessions: open }, 'entered the open exec sessions recorded before open-exec entries existed');
  // Previews recorded before sandbox-preview entries existed (store/previews.ts): entered now, once.
  const previews = await backfillPreviewEntries(store);
  if (previews > 0) logger.info({ previews }, 'entered the previews recorded before sandbox-preview entries existed');
}
