import type { Collection } from 'mongodb';
import type { Store } from './index';
import { isDuplicateKey } from './index';
import { INTERVAL_MS } from '../contract/capacity';

const DAY_MS = 24 * 60 * 60 * 1000;

/** A capacity reservation. Append-only: never updated or deleted once written. */
export interface ReservationDoc {
  /** `rsv-<id>`; derived from the Idempotency-Key when one was sent. */
  _id: string;
  orgId: string;
  startsAt: Date;
  endsAt: Date;
  capacityGb: number;
  idempotencyKey: string | null;
  createdAt: Date;
}

/**
 * Reserved GB of one organisation on one UTC day: field `q<n>` holds the GB reserved in the day's
 * n-th 15-minute interval (absent = 0). `_id` is `<orgId>:<YYYY-MM-DD>`, so every read and write is an
 * `_id` lookup (FerretDB scans the collection for any other filter).
 */
export interface CapacityDayDoc {
  _id: string;
  orgId: string;
  day: string;
  [field: `q${number}`]: number;
}

/**
 * The per-organisation lock that serialises reservations (no transactions on FerretDB). It names the
 * reservation in flight and the days it touches, so whoever takes over an expired lock can repair them.
 */
interface CapacityLockDoc {
  _id: string;
  owner: string;
  days: string[];
  until: Date;
}

const LOCK_TTL_MS = 30_000;
const LOCK_WAIT_MS = 15_000;

export const reservationsOf = (store: Store): Collection<ReservationDoc> => store.db.collection<ReservationDoc>('capacity_reservations');
const daysOf = (store: Store): Collection<CapacityDayDoc> => store.db.collection<CapacityDayDoc>('capacity_days');
const locksOf = (store: Store): Collection<CapacityLockDoc> => store.db.collection<CapacityLockDoc>('capacity_locks');

/** `YYYY-MM-DD` of a UTC instant. */
const dayOf = (ms: number): string => new Date(ms).toISOString().slice(0, 10);
const dayId = (orgId: string, day: string): string => `${orgId}:${day}`;
/** Field of the interval starting at `ms` in its day document. */
const fieldOf = (ms: number): `q${number}` => `q${Math.floor((ms - Math.floor(ms / DAY_MS) * DAY_MS) / INTERVAL_MS)}`;

/** The UTC days touched by [fromMs, toMs). */
function daysIn(fromMs: number, toMs: number): string[] {
  const out: string[] = [];
  for (let d = Math.floor(fromMs / DAY_MS) * DAY_MS; d < toMs; d += DAY_MS) out.push(dayOf(d));
  return out;
}

/**
 * Reserved GB per interval start (ms) in [fromMs, toMs), both aligned to 15 minutes. One `_id` read
 * per UTC day in the window.
 */
export async function reservedByInterval(store: Store, orgId: string, fromMs: number, toMs: number): Promise<Map<number, number>> {
  const days = daysIn(fromMs, toMs);
  const docs = await Promise.all(days.map((d) => daysOf(store).findOne({ _id: dayId(orgId, d) })));
  const out = new Map<number, number>();
  for (let t = fromMs; t < toMs; t += INTERVAL_MS) {
    const doc = docs[days.indexOf(dayOf(t))];
    out.set(t, doc?.[fieldOf(t)] ?? 0);
  }
  return out;
}

/** Thrown by reserve when an interval would go over the limit. */
export class CapacityExceededError extends Error {
  override name = 'CapacityExceededError';
  constructor(
    readonly intervalStart: Date,
    readonly reservedGb: number,
    readonly limitGb: number,
  ) {
    super(`interval ${intervalStart.toISOString()} has ${reservedGb} GB of ${limitGb} GB reserved`);
  }
}

/** Thrown when another reservation of the organisation holds the lock for longer than we wait. */
export class CapacityBusyError extends Error {
  override name = 'CapacityBusyError';
}

/**
 * Records a reservation unless it would take any of its intervals over `limitGb`.
 *
 * Concurrency without transactions: reservations of one organisation are serialised by a lock document
 * (a unique `_id` insert); under it the day counters are read, checked and incremented by `_id`, so
 * two concurrent requests can never both pass the check. The reservation record is written before the
 * counters, and a lock left behind by a crashed process expires after 30 s; whoever takes it over
 * recomputes the days it names from the records. Returns `created: false` with the stored record when
 * `doc._id` exists already (an Idempotency-Key replay). Throws CapacityExceededError, CapacityBusyError.
 */
export async function reserve(store: Store, doc: ReservationDoc, limitGb: number): Promise<{ reservation: ReservationDoc; created: boolean }> {
  const existing = await reservationsOf(store).findOne({ _id: doc._id });
  if (existing) return { reservation: existing, created: false };
  const fromMs = doc.startsAt.getTime();
  const toMs = doc.endsAt.getTime();
  const days = daysIn(fromMs, toMs);
  await acquireLock(store, doc.orgId, doc._id, days);
  try {
    const reserved = await reservedByInterval(store, doc.orgId, fromMs, toMs);
    for (const [t, gb] of reserved) {
      if (gb + doc.capacityGb > limitGb) throw new CapacityExceededError(new Date(t), gb, limitGb);
    }
    try {
      await reservationsOf(store).insertOne(doc);
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
      const again = await reservationsOf(store).findOne({ _id: doc._id });
      if (again) return { reservation: again, created: false };
      throw err;
    }
    const incs = new Map<string, Record<string, number>>();
    for (let t = fromMs; t < toMs; t += INTERVAL_MS) {
      const day = dayOf(t);
      const inc = incs.get(day) ?? {};
      inc[fieldOf(t)] = doc.capacityGb;
      incs.set(day, inc);
    }
    for (const [day, inc] of incs) {
      await daysOf(store).updateOne({ _id: dayId(doc.orgId, day) }, { $inc: inc, $setOnInsert: { orgId: doc.orgId, day } }, { upsert: true });
    }
    return { reservation: doc, created: true };
  } finally {
    await locksOf(store)
      .deleteOne({ _id: doc.orgId, owner: doc._id })
      .catch(() => undefined);
  }
}

/** Takes the organisation's reservation lock, waiting for a holder to finish; takes over an expired lock. */
async function acquireLock(store: Store, orgId: string, owner: string, days: string[]): Promise<void> {
  const deadline = Date.now() + LOCK_WAIT_MS;
  for (let attempt = 0; ; attempt++) {
    try {
      await locksOf(store).insertOne({ _id: orgId, owner, days, until: new Date(Date.now() + LOCK_TTL_MS) });
      return;
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
    }
    const held = await locksOf(store).findOne({ _id: orgId });
    if (held && held.until.getTime() < Date.now()) {
      // The holder died mid-way. The lock collection holds only live locks, so this filter is cheap.
      const taken = await locksOf(store).findOneAndUpdate(
        { _id: orgId, owner: held.owner },
        { $set: { owner, days, until: new Date(Date.now() + LOCK_TTL_MS) } },
      );
      if (taken) {
        await repairDays(store, orgId, held.owner, held.days);
        return;
      }
    }
    if (Date.now() > deadline) throw new CapacityBusyError('another reservation of this organisation is in progress; retry');
    await new Promise((r) => setTimeout(r, Math.min(10 + attempt * 5, 50)));
  }
}

/**
 * Recomputes the day counters that an interrupted reservation `rsvId` may have left half-written.
 * Nothing to do when its record was never written (counters are written after the record).
 */
async function repairDays(store: Store, orgId: string, rsvId: string, days: string[]): Promise<void> {
  if (!(await reservationsOf(store).findOne({ _id: rsvId }))) return;
  const all = await reservationsOf(store).find({ orgId }).toArray();
  for (const day of days) {
    const dayStart = Date.parse(`${day}T00:00:00Z`);
    const fields: Record<string, number> = {};
    for (const r of all) {
      const from = Math.max(r.startsAt.getTime(), dayStart);
      const to = Math.min(r.endsAt.getTime(), dayStart + DAY_MS);
      for (let t = from; t < to; t += INTERVAL_MS) fields[fieldOf(t)] = (fields[fieldOf(t)] ?? 0) + r.capacityGb;
    }
    await daysOf(store).replaceOne({ _id: dayId(orgId, day) }, { orgId, day, ...fields }, { upsert: true });
  }
}

/** The organisation's reservations, by start time. */
export async function listReservations(store: Store, orgId: string): Promise<ReservationDoc[]> {
  const docs = await reservationsOf(store).find({ orgId }).toArray();
  return docs.sort((a, b) => a.startsAt.getTime() - b.startsAt.getTime() || a._id.localeCompare(b._id));
}

/** Reads a reservation; null when there is none. */
export function findReservation(store: Store, id: string): Promise<ReservationDoc | null> {
  return reservationsOf(store).findOne({ _id: id });
}
