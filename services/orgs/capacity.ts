import { ApiError, conflict, invalid } from '../../contract/errors';
import { derivedId, randomId } from '../../lib/ids';
import {
  CapacityBusyError,
  CapacityExceededError,
  listReservations,
  findReservation,
  reserve,
  reservedByInterval,
  type ReservationDoc,
} from '../../store/capacity';
import { orgReservationLimitGb } from '../../store/orgs';
import type { ServiceDeps } from '../deps';

import { INTERVAL_MS } from '../../contract/capacity';

const MAX_WINDOW_MS = 31 * 24 * 60 * 60 * 1000;
/** A reservation may start at most this far ahead. */
const MAX_HORIZON_MS = 366 * 24 * 60 * 60 * 1000;
/** How long a calendar answer may be relied on. */
const STALE_AFTER_MS = 60_000;
/** Reservations must start at least this far ahead. */
const LEAD_MS = 30 * 60 * 1000;

/** The next 15-minute boundary at least 30 minutes after `nowMs`. */
export function earliestReservableStart(nowMs: number): number {
  return Math.ceil((nowMs + LEAD_MS) / INTERVAL_MS) * INTERVAL_MS;
}

/** Checks a [from, to) window: from < to and at most 31 days; throws 400 naming the field. */
function checkWindow(from: number, to: number, where: { from: string; to: string }): void {
  if (to <= from) throw invalid(`${where.to}: must be after ${where.from}`);
  if (to - from > MAX_WINDOW_MS) throw invalid(`${where.to}: the window from ${where.from} must be at most 31 days`);
}

/** One 15-minute interval of the calendar. */
export interface CalendarInterval {
  startsAt: string;
  endsAt: string;
  reservationLimitGb: number;
  reservedGb: number;
  reservableGb: number;
}

/** Reservable capacity per organisation, in 15-minute intervals, and reservations against it. */
export interface CapacityService {
  /** The calendar of [from, to) (epoch ms, aligned; at most 31 days): what is reserved and reservable per interval. */
  calendar(
    orgId: string,
    from: number,
    to: number,
  ): Promise<{
    generatedAt: string;
    staleAt: string;
    intervalDuration: 'PT15M';
    timezone: 'UTC';
    earliestReservableStart: string;
    intervals: CalendarInterval[];
  }>;
  /**
   * Reserves `capacityGb` in every interval of [startsAt, endsAt); never over the limit (409). With an
   * idempotency key, a second request answers the first reservation (`created: false`; 409 if it differs).
   */
  reserve(
    orgId: string,
    body: { startsAt: number; endsAt: number; capacityGb: number },
    idempotencyKey: string | undefined,
  ): Promise<{ reservation: ReservationDoc; created: boolean }>;
  /** The organisation's reservations, by start time. */
  list(orgId: string): Promise<ReservationDoc[]>;
}

export function createCapacityService(deps: ServiceDeps): CapacityService {
  /** The organisation's reservation limit per interval: its setting, else RESERVATION_LIMIT_GB. */
  const limitOf = async (orgId: string): Promise<number> => (await orgReservationLimitGb(deps.store, orgId)) ?? deps.cfg.RESERVATION_LIMIT_GB;

  return {
    async calendar(orgId, from, to) {
      checkWindow(from, to, { from: 'query.from', to: 'query.to' });
      const now = Date.now();
      const [limit, reserved] = await Promise.all([limitOf(orgId), reservedByInterval(deps.store, orgId, from, to)]);
      const intervals: CalendarInterval[] = [];
      for (let s = from; s < to; s += INTERVAL_MS) {
        const gb = reserved.get(s) ?? 0;
        intervals.push({
          startsAt: new Date(s).toISOString(),
          endsAt: new Date(s + INTERVAL_MS).toISOString(),
          reservationLimitGb: limit,
          reservedGb: gb,
          reservableGb: Math.max(0, limit - gb),
        });
      }
      return {
        generatedAt: new Date(now).toISOString(),
        staleAt: new Date(now + STALE_AFTER_MS).toISOString(),
        intervalDuration: 'PT15M',
        timezone: 'UTC',
        earliestReservableStart: new Date(earliestReservableStart(now)).toISOString(),
        intervals,
      };
    },

    async reserve(orgId, body, key) {
      checkWindow(body.startsAt, body.endsAt, { from: 'body.startsAt', to: 'body.endsAt' });
      const now = Date.now();
      const earliest = earliestReservableStart(now);
      const limit = await limitOf(orgId);
      const doc: ReservationDoc = {
        _id: key ? `rsv-${derivedId(orgId, 'reservation', key)}` : `rsv-${randomId()}`,
        orgId,
        startsAt: new Date(body.startsAt),
        endsAt: new Date(body.endsAt),
        capacityGb: body.capacityGb,
        idempotencyKey: key ?? null,
        createdAt: new Date(now),
      };
      const replay = key ? await findReservation(deps.store, doc._id) : null;
      if (!replay) {
        if (body.startsAt < earliest) throw invalid(`body.startsAt: must be at or after earliestReservableStart (${new Date(earliest).toISOString()})`);
        if (body.startsAt > now + MAX_HORIZON_MS) throw invalid('body.startsAt: must be within 366 days from now');
        if (body.capacityGb > limit) throw invalid(`body.capacityGb: must be at most reservationLimitGb (${limit})`);
      }
      let result;
      try {
        result = replay ? { reservation: replay, created: false } : await reserve(deps.store, doc, limit);
      } catch (err) {
        if (err instanceof CapacityExceededError) {
          throw conflict(`not enough capacity: ${err.message}; ${body.capacityGb} GB more would exceed reservationLimitGb`);
        }
        if (err instanceof CapacityBusyError) throw new ApiError('unavailable', err.message);
        throw err;
      }
      const r = result.reservation;
      if (!result.created && (r.startsAt.getTime() !== body.startsAt || r.endsAt.getTime() !== body.endsAt || r.capacityGb !== body.capacityGb)) {
        throw conflict('Idempotency-Key was already used for a different reservation');
      }
      return result;
    },

    list: (orgId) => listReservations(deps.store, orgId),
  };
}
