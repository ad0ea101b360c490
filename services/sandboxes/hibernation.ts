import type { HostClient } from '../../sandbox';
import { HIBERNATION_LAYER_MARK } from '../../sandbox';
import type { Store } from '../../store';
import { recordHibernation, type SandboxDoc } from '../../store/sandboxes';

/**
 * Hibernates a running sandbox on its host and records it (status `hibernated`, its layer). The host's
 * hibernate is idempotent, so a caller that died between the two steps can simply call this again.
 */
export async function hibernateSandbox(store: Store, host: HostClient, doc: SandboxDoc): Promise<SandboxDoc> {
  const layerId = `${doc._id}${HIBERNATION_LAYER_MARK}${Date.now().toString(36)}`;
  const r = await host.hibernate(doc._id, layerId);
  return recordHibernation(store, doc, r.layerId);
}
