/**
 * The per-organisation storage quota of checkpoints and snapshots. What is stored is the sum of the
 * organisation's checkpoints' sizes (store/usage.ts); what captures under way will add is reserved
 * before they copy anything (store/storage-holds.ts), so that neither one capture nor many at once
 * can take an organisation past its quota.
 */
import { ApiError } from '../../contract/errors';
import type { HostClient } from '../../sandbox';
import { randomId } from '../../lib/ids';
import { deleteStorageHold, insertStorageHold, listStorageHolds, updateStorageHold, type StorageHoldDoc } from '../../store/storage-holds';
import { exactUsage, orgStorageQuotaMB, storageUsage, type StorageUsage } from '../../store/usage';
import type { SandboxDeps } from '../deps';

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

/** Whether a hold no longer counts at `now`: lapsed, or still pending past its time to decide. */
const lapsed = (h: StorageHoldDoc, now: number): boolean => h.expiresAt.getTime() <= now || (h.state === 'pending' && h.decideBy.getTime() <= now);

/** The organisation's holds that count now; lapsed ones (their captures' API processes died) are removed. */
async function liveHolds(deps: QuotaDeps, orgId: string): Promise<StorageHoldDoc[]> {
  const holds = await listStorageHolds(deps.store, orgId);
  const now = Date.now();
  for (const h of holds) if (h.expiresAt.getTime() <= now) await deleteStorageHold(deps.store, h._id);
  return holds.filter((h) => !lapsed(h, now));
}

const sum = (holds: StorageHoldDoc[]): number => holds.reduce((n, h) => n + h.bytes, 0);

/**
 * Refuses (507) a new checkpoint or snapshot while the organisation's checkpoints and snapshots, with
 * what its captures under way have reserved, use its whole quota. A cheap first check: what a
 * capture adds is reserved by reserveStorage before it copies anything.
 */
export async function assertStorageRoom(deps: QuotaDeps, orgId: string): Promise<void> {
  const quota = await storageQuotaOf(deps, orgId);
  if (quota === null) return;
  const held = sum(await liveHolds(deps, orgId));
  const usedBytes = await storedBytes(deps, orgId, (used) => used + held >= quota);
  if (usedBytes + held >= quota) throw quotaExceeded(usedBytes, quota, held);
}

/**
 * What the organisation stores, as a decision needs it: the storage entries' sum (one `_id` range
 * read), or, when that sum would refuse, the records' (a scan): entries may count more than their
 * records after a crash, never less (store/storage-entries.ts), so only a refusal needs the records.
 */
async function storedBytes(deps: QuotaDeps, orgId: string, refuses: (usedBytes: number) => boolean): Promise<number> {
  const { usedBytes } = await storageUsage(deps.store, orgId);
  return refuses(usedBytes) ? (await exactUsage(deps.store, orgId)).usedBytes : usedBytes;
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

/** A pending hold that has not been admitted this long after it was taken is given up. */
const DECIDE_MS = 10_000;
/** How often a pending hold looks again whether the holds taken before it have been decided. */
const DECIDE_POLL_MS = 25;

/**
 * Takes hold of `bytes` (for the capture of `holdId`, which holds `own` already) and admits it when
 * it fits, else removes it and refuses (507). The hold is recorded `pending` first; it then waits
 * until no hold taken before it is pending, and counts every other hold that counts (admitted ones,
 * and pending ones taken after it), then what is stored (read after the holds: a finished capture
 * records its size before it removes its hold, so it is counted at least once). Of two holds at the
 * same time, either the later one sees the earlier decided, or the earlier one counts the later
 * one: together they never pass the quota. Answers the hold's id.
 */
async function admitHold(deps: QuotaDeps, orgId: string, quota: number, holdId: string, bytes: number, own: Set<string>, ownBytes: number): Promise<string> {
  const now = Date.now();
  const id = `${orgId}/${now.toString(36).padStart(10, '0')}-${randomId(8)}/${holdId}`;
  const decideBy = now + DECIDE_MS;
  await insertStorageHold(deps.store, {
    _id: id,
    orgId,
    holdId,
    bytes,
    state: 'pending',
    decideBy: new Date(decideBy),
    expiresAt: new Date(now + STORAGE_HOLD_TTL_MS),
  });
  try {
    for (;;) {
      const others = (await liveHolds(deps, orgId)).filter((h) => h._id !== id);
      if (others.some((h) => h.state === 'pending' && h._id < id)) {
        if (Date.now() > decideBy) break;
        await new Promise((r) => setTimeout(r, DECIDE_POLL_MS));
        continue;
      }
      const held = sum(others);
      const usedBytes = await storedBytes(deps, orgId, (used) => used + held + bytes > quota);
      if (usedBytes + held + bytes > quota) {
        throw captureRefused(ownBytes + bytes, usedBytes, held - sum(others.filter((h) => own.has(h._id))), quota);
      }
      if (Date.now() > decideBy) break;
      await updateStorageHold(deps.store, id, { state: 'admitted', expiresAt: new Date(Date.now() + STORAGE_HOLD_TTL_MS) });
      return id;
    }
    throw new ApiError('unavailable', 'the storage quota could not be checked in time (other captures of the organisation under way); try again');
  } catch (err) {
    await deleteStorageHold(deps.store, id).catch(() => undefined);
    throw err;
  }
}

/**
 * Reserves `bytes` of the organisation's quota for the capture of checkpoint `holdId`, before it
 * copies anything; 507 when what is stored, what other captures under way hold and `bytes` would
 * exceed the quota (see admitHold: captures at the same time cannot together pass it either). The
 * hold is renewed while the capture runs and lapses STORAGE_HOLD_TTL_MS after its API process dies.
 * The caller releases it.
 */
export async function reserveStorage(deps: QuotaDeps & Pick<SandboxDeps, 'logger'>, orgId: string, holdId: string, bytes: number): Promise<StorageHold> {
  const quota = await storageQuotaOf(deps, orgId);
  if (quota === null) return unlimited(bytes);
  const ids = new Set<string>();
  let held = Math.max(0, Math.ceil(bytes));
  ids.add(await admitHold(deps, orgId, quota, holdId, held, ids, 0));
  let released = false;
  const timer = setInterval(() => {
    const expiresAt = new Date(Date.now() + STORAGE_HOLD_TTL_MS);
    for (const id of ids) {
      updateStorageHold(deps.store, id, { expiresAt }).catch((err) => deps.logger.warn({ err: String(err), orgId, holdId }, 'could not renew a storage hold'));
    }
  }, STORAGE_HOLD_RENEW_MS);
  timer.unref();
  return {
    get bytes() {
      return held;
    },
    async grow(to: number) {
      const want = Math.ceil(to);
      if (released || want <= held) return;
      // The difference is one more hold of this capture's, admitted the same way.
      ids.add(await admitHold(deps, orgId, quota, `${holdId}-more`, want - held, ids, held));
      held = want;
    },
    async release() {
      if (released) return;
      released = true;
      clearInterval(timer);
      for (const id of ids) {
        await deleteStorageHold(deps.store, id).catch((err) =>
          deps.logger.warn({ err: String(err), orgId, holdId }, 'could not release a storage hold (it lapses)'),
        );
      }
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

/**
 * What GET /api/usage shows: what is stored (from the records: exact, and it corrects the storage
 * entries; not a hot path), what captures under way hold, the quota.
 */
export async function usageOf(deps: QuotaDeps, orgId: string): Promise<StorageUsage & { reservedBytes: number; quotaBytes: number | null }> {
  const [usage, holds, quotaBytes] = await Promise.all([exactUsage(deps.store, orgId), listStorageHolds(deps.store, orgId), storageQuotaOf(deps, orgId)]);
  const now = Date.now();
  return { ...usage, reservedBytes: sum(holds.filter((h) => !lapsed(h, now))), quotaBytes };
}
