/**
 * The per-organisation storage quota of checkpoints and snapshots. What is stored is the sum of the
 * organisation's checkpoints' sizes (store/usage.ts); what captures under way will add is reserved
 * before they copy anything (store/storage-holds.ts), so that neither one capture nor many at once
 * can take an organisation past its quota.
 */
import { ApiError } from '../lib/errors';
import type { HostClient } from '../sandbox';
import { addStorageHold, dropStorageHold, findStorageHolds, growStorageHold, renewStorageHold, type StorageHoldsDoc } from '../store/storage-holds';
import { orgStorageQuotaMB, storageUsage, type StorageUsage } from '../store/usage';
import type { SandboxDeps } from './deps';

const MIB = 1024 * 1024;

/** A hold lapses this long after it was taken or last renewed (a capture whose API process died frees its room then). */
export const STORAGE_HOLD_TTL_MS = 120_000;
/** How often a capture under way renews its hold. */
const STORAGE_HOLD_RENEW_MS = 30_000;

type QuotaDeps = Pick<SandboxDeps, 'store' | 'cfg'>;

/** The organisation's storage quota in bytes (its settings.storageQuotaMB, else ORG_STORAGE_QUOTA_MB), or null when unlimited (0). */
export async function storageQuotaOf(deps: QuotaDeps, orgId: string): Promise<number | null> {
  const mb = (await orgStorageQuotaMB(deps.store, orgId)) ?? deps.cfg.ORG_STORAGE_QUOTA_MB;
  return mb > 0 ? mb * MIB : null;
}

const mib = (n: number): string => `${(n / MIB).toFixed(1)} MiB`;

/** The 507 answer of an organisation whose checkpoints and snapshots use `usedBytes` (captures under way hold `heldBytes` more) of `quota`. */
export function quotaExceeded(usedBytes: number, quota: number, heldBytes = 0): ApiError {
  const held = heldBytes > 0 ? ` and captures under way hold ${mib(heldBytes)}` : '';
  return new ApiError(
    'insufficient_storage',
    `storage quota reached: checkpoints and snapshots use ${mib(usedBytes)}${held} of ${mib(quota)}; delete some (GET /api/usage shows the use)`,
  );
}

/** The 507 answer of a capture of `needBytes` that does not fit beside `usedBytes` stored and `heldBytes` held by other captures. */
function captureRefused(needBytes: number, usedBytes: number, heldBytes: number, quota: number): ApiError {
  const held = heldBytes > 0 ? ` and captures under way hold ${mib(heldBytes)}` : '';
  return new ApiError(
    'insufficient_storage',
    `storage quota reached: this capture would add ${mib(needBytes)}, but checkpoints and snapshots use ${mib(usedBytes)}${held} of ` +
      `${mib(quota)}; delete some (GET /api/usage shows the use)`,
  );
}

/** The bytes of the holds of `doc` that have not lapsed at `now`. */
function liveHeldBytes(doc: StorageHoldsDoc | null, now: number): number {
  return Object.values(doc?.holds ?? {}).reduce((n, h) => (h.expiresAt.getTime() > now ? n + h.bytes : n), 0);
}

/** Drops the organisation's lapsed holds (their captures' API processes died); answers the bytes the others hold. */
async function sweepLapsedHolds(deps: QuotaDeps, orgId: string): Promise<number> {
  const doc = await findStorageHolds(deps.store, orgId);
  const now = new Date();
  for (const [id, h] of Object.entries(doc?.holds ?? {})) {
    if (h.expiresAt.getTime() <= now.getTime()) await dropStorageHold(deps.store, orgId, id, h.bytes, now);
  }
  return liveHeldBytes(doc, now.getTime());
}

/**
 * Refuses (507) a new checkpoint or snapshot while the organisation's checkpoints and snapshots, with
 * what its captures under way have reserved, use its whole quota. A cheap first check: what a
 * capture adds is reserved by reserveStorage before it copies anything.
 */
export async function assertStorageRoom(deps: QuotaDeps, orgId: string): Promise<void> {
  const quota = await storageQuotaOf(deps, orgId);
  if (quota === null) return;
  const [{ usedBytes }, held] = await Promise.all([storageUsage(deps.store, orgId), sweepLapsedHolds(deps, orgId)]);
  if (usedBytes + held >= quota) throw quotaExceeded(usedBytes, quota, held);
}

/** Room reserved for one capture (see reserveStorage). */
export interface StorageHold {
  /** The bytes reserved now. */
  readonly bytes: number;
  /** Reserves up to `bytes` in all (the capture turned out larger than its reservation); 507 when that does not fit (the caller then releases). */
  grow(bytes: number): Promise<void>;
  /** Gives the room back (once the capture is recorded with its size, or failed). Never throws: an unreleased hold lapses. */
  release(): Promise<void>;
}

/** The hold of an organisation without a quota: nothing is reserved. */
const unlimited = (bytes: number): StorageHold => ({ bytes, grow: async () => undefined, release: async () => undefined });

/**
 * Reserves `bytes` of the organisation's quota for the capture of checkpoint `holdId`, before it
 * copies anything; 507 when what is stored, what other captures under way hold and `bytes` would
 * exceed the quota. Captures at the same time cannot together pass it: the reservation is one
 * conditional update of the organisation's holds, and what is stored is read after it (a capture
 * that finished meanwhile recorded its size before giving its hold back, so it is counted at least
 * once). The hold is renewed while the capture runs and lapses STORAGE_HOLD_TTL_MS after its API
 * process dies. The caller releases it.
 */
export async function reserveStorage(deps: QuotaDeps & Pick<SandboxDeps, 'logger'>, orgId: string, holdId: string, bytes: number): Promise<StorageHold> {
  const quota = await storageQuotaOf(deps, orgId);
  if (quota === null) return unlimited(bytes);
  const need = Math.max(0, Math.ceil(bytes));
  await sweepLapsedHolds(deps, orgId);
  const expiry = () => new Date(Date.now() + STORAGE_HOLD_TTL_MS);

  /** Refuses (507) when what is stored and the holds' sum `reserved` (this capture's `mine` included) exceed the quota. */
  const verify = async (reserved: number, mine: number): Promise<void> => {
    const { usedBytes } = await storageUsage(deps.store, orgId);
    if (usedBytes + reserved > quota) throw captureRefused(mine, usedBytes, reserved - mine, quota);
  };
  /** The 507 of a hold of `want` that did not fit (this capture holding `mine` until then). */
  const refused = async (want: number, mine: number): Promise<ApiError> => {
    const [{ usedBytes }, doc] = await Promise.all([storageUsage(deps.store, orgId), findStorageHolds(deps.store, orgId)]);
    return captureRefused(want, usedBytes, Math.max(0, liveHeldBytes(doc, Date.now()) - mine), quota);
  };

  const reserved = await addStorageHold(deps.store, orgId, holdId, need, expiry(), quota);
  if (reserved === null) throw await refused(need, 0);
  try {
    await verify(reserved, need);
  } catch (err) {
    await dropStorageHold(deps.store, orgId, holdId, need).catch(() => undefined);
    throw err;
  }

  let held = need;
  let released = false;
  const timer = setInterval(() => {
    renewStorageHold(deps.store, orgId, holdId, expiry()).catch((err) =>
      deps.logger.warn({ err: String(err), orgId, holdId }, 'could not renew a storage hold'),
    );
  }, STORAGE_HOLD_RENEW_MS);
  timer.unref();
  return {
    get bytes() {
      return held;
    },
    async grow(to: number) {
      const want = Math.ceil(to);
      if (released || want <= held) return;
      const after = await growStorageHold(deps.store, orgId, holdId, held, want, quota);
      if (after === null) throw await refused(want, held);
      held = want;
      await verify(after, want);
    },
    async release() {
      if (released) return;
      released = true;
      clearInterval(timer);
      await dropStorageHold(deps.store, orgId, holdId, held).catch((err) =>
        deps.logger.warn({ err: String(err), orgId, holdId }, 'could not release a storage hold (it lapses)'),
      );
    },
  };
}

/**
 * What capturing sandbox `sandboxId` would store: its writable layer's use as its disk reports it
 * (statfs of the layer's filesystem; 0 where the host has no reading).
 */
export async function writableLayerBytes(host: Pick<HostClient, 'sandboxMetrics'>, sandboxId: string): Promise<number> {
  const m = await host.sandboxMetrics(sandboxId);
  return m.disk.usedBytes ?? 0;
}

/** What GET /api/usage shows: what is stored, what captures under way hold, the quota. */
export async function usageOf(deps: QuotaDeps, orgId: string): Promise<StorageUsage & { reservedBytes: number; quotaBytes: number | null }> {
  const [usage, holds, quotaBytes] = await Promise.all([storageUsage(deps.store, orgId), findStorageHolds(deps.store, orgId), storageQuotaOf(deps, orgId)]);
  return { ...usage, reservedBytes: liveHeldBytes(holds, Date.now()), quotaBytes };
}
