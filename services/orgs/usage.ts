import { usageOf } from '../checkpoints/storage-quota';
import type { ServiceDeps } from '../deps';

/** What an organisation uses, against its quotas. */
export interface UsageService {
  /** Bytes of the organisation's checkpoint layers, its quota, and how many checkpoints and snapshots it has. */
  storage(orgId: string): ReturnType<typeof usageOf>;
}

export function createUsageService(deps: ServiceDeps): UsageService {
  return { storage: (orgId) => usageOf(deps, orgId) };
}
