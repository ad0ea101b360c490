import type { Store } from './index';
import type { HostCapacity } from '../contract/hosts';

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
  /** Set once what ran on the lost host was written off (services/hosts/host-watch.ts). */
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

/**
 * Records that host `hostId` was found lost (once: the first finder wins). Answers true for the
 * process that marked it, which then writes off what ran there (instances, see services/hosts/host-watch.ts).
 */
export async function markHostLost(store: Store, hostId: string): Promise<boolean> {
  const r = await hostsOf(store).updateOne({ _id: hostId, $or: [{ lostAt: null }, { lostAt: { $exists: false } }] }, { $set: { lostAt: new Date() } });
  return r.modifiedCount === 1;
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
