/**
 * Where a new sandbox goes: which hosts are alive, how much each should get, the pick itself, and the
 * hosts as one process sees them (read from the store at most once per interval).
 */
import type { HostCapacity } from '../../contract/hosts';
import type { Store } from '../../store';
import { listHosts, type HostDoc } from '../../store/hosts';

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

/** How many times its maxAgeMs a HostView answers its last read while it reads again (see all). */
const STALE_SERVED = 5;

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

  /**
   * The hosts as read at most maxAgeMs ago. With `staleOk` (placement: a pick that lands on a host
   * that just died fails its create with a 503), between maxAgeMs and STALE_SERVED × maxAgeMs the
   * last read is answered at once while a new one is made behind it, so that a burst of creates does
   * not wait for the store each second. Otherwise, or older, or after invalidate(), the caller waits
   * for the new read (whether a host is lost or back is never answered from an old read).
   */
  async all(staleOk = false): Promise<HostDoc[]> {
    const age = Date.now() - this.at;
    if (age < this.maxAgeMs) return this.docs;
    const loading = this.load();
    if (!staleOk || age >= this.maxAgeMs * STALE_SERVED) return loading;
    loading.catch(() => undefined); // a failed read behind the answer: the next call reads again
    return this.docs;
  }

  private load(): Promise<HostDoc[]> {
    this.loading ??= listHosts(this.store)
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

/** A session stays on the host whose worker took it while that host has at least this share of the roomiest host's room. */
const STAY_SHARE = 0.75;

/**
 * The placement of new sessions as the worker beside host `hostId` decides it, from the hosts
 * collection read at most every `refreshMs`: `placeElsewhere` answers the task queue of another live
 * host with clearly more room (chosen by chooseHost), or null for this one; `severalHosts` whether
 * more than one host is registered.
 */
export function placementFrom(store: Store, o: { hostId: string; deadAfterMs: number; refreshMs: number }) {
  const hosts = new HostView(store, o.refreshMs);
  return {
    async placeElsewhere(): Promise<string | null> {
      const docs = await hosts.all();
      if (docs.length < 2) return null;
      // Workflow tasks already spread over the workers that poll the shared queue: sending a session
      // elsewhere costs an extra activity task, so it stays here unless this host has clearly less room.
      const own = docs.find((d) => d._id === o.hostId);
      const best = Math.max(...docs.filter((d) => hostAlive(d, o.deadAfterMs)).map((d) => placementWeight(d.capacity)));
      if (own && placementWeight(own.capacity) > 0 && placementWeight(own.capacity) >= STAY_SHARE * best) return null;
      const chosen = chooseHost(docs, o.deadAfterMs);
      return chosen && chosen._id !== o.hostId ? chosen.taskQueue : null;
    },
    async severalHosts(): Promise<boolean> {
      return (await hosts.all()).length > 1;
    },
  };
}
