import type { Store } from './index';
import type { HostCapacity } from '../sandbox';

/**
 * A sandbox host, registered by the worker beside it at start and refreshed by its heartbeat (every
 * HOST_HEARTBEAT_MS, with the load the host reports). A host whose heartbeat is older than
 * HOST_DEAD_AFTER is dead: nothing new is placed on it, and what ran on it is written off.
 */
export interface HostDoc {
  _id: string;
  url: string;
  taskQueue: string;
  /** The last heartbeat (or registration). */
  updatedAt: Date;
  /** The host's load at the last heartbeat; absent in records of older versions. */
  capacity?: HostCapacity;
  /** Set when the host was found dead (by whoever noticed first): its sandboxes are written off. */
  lostAt?: Date | null;
  /** Set once what ran on the lost host was written off (worker/host-watch.ts). */
  writtenOff?: boolean;
}

export const hostsOf = (store: Store) => store.db.collection<HostDoc>('hosts');

/**
 * Records (or refreshes) where a host is reachable, which task queue serves it, and its load.
 * Answers whether the host is marked lost (a host back from a freeze learns it here, and rejoins).
 */
export async function registerHost(
  store: Store,
  host: { id: string; url: string; taskQueue: string; capacity?: HostCapacity },
): Promise<{ lostAt: Date | null }> {
  const set: Partial<HostDoc> = { url: host.url, taskQueue: host.taskQueue, updatedAt: new Date() };
  if (host.capacity) set.capacity = host.capacity;
  const doc = await hostsOf(store).findOneAndUpdate({ _id: host.id }, { $set: set }, { upsert: true, returnDocument: 'after' });
  return { lostAt: doc?.lostAt ?? null };
}

/** True while the host's heartbeat is younger than `deadAfterMs` (a host marked lost may be heard of again before it rejoins: see `lostAt`). */
export const hostAlive = (doc: Pick<HostDoc, 'updatedAt'>, deadAfterMs: number, now = Date.now()): boolean =>
  now - new Date(doc.updatedAt).getTime() < deadAfterMs;

/**
 * How much a host should get of new sandboxes: its free slots (HOST_MAX_SANDBOXES − live), scaled
 * down by the share of its memory the live sandboxes' limits reserve (never below a tenth: limits
 * are maxima and usually overcommitted). 0: the host is at its limit and takes nothing new.
 */
export function placementWeight(c: HostCapacity | undefined): number {
  if (!c) return 1;
  const free = c.maxSandboxes - c.sandboxes;
  if (free <= 0) return 0;
  const memory = c.memoryMB > 0 ? Math.max(0.1, 1 - c.reservedMB / c.memoryMB) : 1;
  return free * memory;
}

/**
 * Picks a host for a new sandbox among the live ones, at random in proportion to placementWeight:
 * callers that see the same (seconds-old) loads still spread their sandboxes instead of all going
 * to the emptiest host. A host marked lost gets nothing until it has rejoined. null: no live host has room.
 */
export function chooseHost<T extends HostDoc>(docs: T[], deadAfterMs: number, random = Math.random, now = Date.now()): T | null {
  const candidates = docs
    .filter((d) => hostAlive(d, deadAfterMs, now) && !d.lostAt)
    .map((d) => ({ d, w: placementWeight(d.capacity) }))
    .filter((x) => x.w > 0);
  const total = candidates.reduce((sum, x) => sum + x.w, 0);
  if (total <= 0) return null;
  let r = random() * total;
  for (const x of candidates) {
    r -= x.w;
    if (r < 0) return x.d;
  }
  return candidates[candidates.length - 1]!.d;
}

/**
 * The hosts collection as one process sees it, read at most every `maxAgeMs` (a small collection,
 * read whole: one query per interval, whatever the rate of creates).
 */
export class HostView {
  private docs: HostDoc[] = [];
  private at = 0;
  private loading: Promise<HostDoc[]> | null = null;

  constructor(
    private readonly store: Store,
    private readonly maxAgeMs = 1_000,
  ) {}

  async all(): Promise<HostDoc[]> {
    if (Date.now() - this.at < this.maxAgeMs) return this.docs;
    this.loading ??= hostsOf(this.store)
      .find({})
      .toArray()
      .then((docs) => {
        this.docs = docs;
        this.at = Date.now();
        return docs;
      })
      .finally(() => {
        this.loading = null;
      });
    return this.loading;
  }

  /** Forgets what was read (after a host was found dead, say). */
  invalidate(): void {
    this.at = 0;
  }
}

/**
 * Records that host `hostId` was found lost (once: the first finder wins). Answers true for the
 * process that marked it, which then writes off what ran there (instances, see worker/host-watch.ts).
 */
export async function markHostLost(store: Store, hostId: string): Promise<boolean> {
  const r = await hostsOf(store).updateOne({ _id: hostId, $or: [{ lostAt: null }, { lostAt: { $exists: false } }] }, { $set: { lostAt: new Date() } });
  return r.modifiedCount === 1;
}

/**
 * True when host `hostId` is lost: registered, silent for longer than `deadAfterMs`, and not
 * answering a direct probe either (a host whose worker alone is down is not lost). Marks it lost.
 */
export async function checkHostLost(store: Store, hostId: string, deadAfterMs: number, probe: (url: string) => Promise<boolean>): Promise<boolean> {
  const doc = await hostsOf(store).findOne({ _id: hostId });
  if (!doc) return false;
  if (doc.lostAt) return true;
  if (hostAlive(doc, deadAfterMs)) return false;
  if (await probe(doc.url)) return false;
  await markHostLost(store, hostId);
  return true;
}

/** Reads a host's registration; null when it is not registered. */
export function findHost(store: Store, hostId: string): Promise<HostDoc | null> {
  return hostsOf(store).findOne({ _id: hostId });
}

/** Every registered host (a small collection). */
export function listHosts(store: Store): Promise<HostDoc[]> {
  return hostsOf(store).find({}).toArray();
}

/** Up to `limit` registered hosts, most recently heard from first. */
export function listRecentHosts(store: Store, limit: number): Promise<HostDoc[]> {
  return hostsOf(store).find({}).sort({ updatedAt: -1 }).limit(limit).toArray();
}

/** Records that what ran on a lost host has been written off. */
export async function markHostWrittenOff(store: Store, hostId: string): Promise<void> {
  await hostsOf(store).updateOne({ _id: hostId }, { $set: { writtenOff: true } });
}

/** A lost host is back: clears its lost and written-off marks (those of the loss at `lostAt` only, when given: a newer loss stays). */
export async function markHostRejoined(store: Store, hostId: string, lostAt?: Date): Promise<void> {
  await hostsOf(store).updateOne(lostAt ? { _id: hostId, lostAt } : { _id: hostId }, { $set: { lostAt: null, writtenOff: false, updatedAt: new Date() } });
}
