import { ApiError } from '../lib/errors';
import { orgStorageQuotaMB, storageUsage, type StorageUsage } from '../store/usage';
import type { SandboxDeps } from './deps';

const MIB = 1024 * 1024;

/** The organisation's storage quota in bytes (its settings.storageQuotaMB, else ORG_STORAGE_QUOTA_MB), or null when unlimited (0). */
export async function storageQuotaOf(deps: Pick<SandboxDeps, 'store' | 'cfg'>, orgId: string): Promise<number | null> {
  const mb = (await orgStorageQuotaMB(deps.store, orgId)) ?? deps.cfg.ORG_STORAGE_QUOTA_MB;
  return mb > 0 ? mb * MIB : null;
}

const mib = (n: number): string => `${(n / MIB).toFixed(1)} MiB`;

/** The 507 answer of an organisation whose checkpoints and snapshots use `usedBytes` of `quota`. */
export function quotaExceeded(usedBytes: number, quota: number): ApiError {
  return new ApiError(
    'insufficient_storage',
    `storage quota reached: checkpoints and snapshots use ${mib(usedBytes)} of ${mib(quota)}; delete some (GET /api/usage shows the use)`,
  );
}

/**
 * Refuses (507) a new checkpoint or snapshot while the organisation's checkpoints and snapshots use
 * its whole quota. A size is known only once a capture ends, so the capture that crosses the quota
 * is kept and the next one refused (see also assertRoomAfterCapture).
 */
export async function assertStorageRoom(deps: Pick<SandboxDeps, 'store' | 'cfg'>, orgId: string): Promise<void> {
  const quota = await storageQuotaOf(deps, orgId);
  if (quota === null) return;
  const { usedBytes } = await storageUsage(deps.store, orgId);
  if (usedBytes >= quota) throw quotaExceeded(usedBytes, quota);
}

/**
 * After capturing checkpoint `checkpointId`: refuses (507) it when the organisation's other
 * checkpoints have used the quota up meanwhile (captures that ran at the same time). The caller
 * deletes what it captured.
 */
export async function assertRoomAfterCapture(deps: Pick<SandboxDeps, 'store' | 'cfg'>, orgId: string, checkpointId: string): Promise<void> {
  const quota = await storageQuotaOf(deps, orgId);
  if (quota === null) return;
  const { usedBytes } = await storageUsage(deps.store, orgId, checkpointId);
  if (usedBytes >= quota) throw quotaExceeded(usedBytes, quota);
}

/** What GET /api/usage shows. */
export async function usageOf(deps: Pick<SandboxDeps, 'store' | 'cfg'>, orgId: string): Promise<StorageUsage & { quotaBytes: number | null }> {
  const [usage, quotaBytes] = await Promise.all([storageUsage(deps.store, orgId), storageQuotaOf(deps, orgId)]);
  return { ...usage, quotaBytes };
}
