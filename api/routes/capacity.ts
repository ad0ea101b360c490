import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import { ApiError, conflict, invalid } from '../../lib/errors';
import { derivedId, randomId } from '../../lib/ids';
import {
  CapacityBusyError,
  CapacityExceededError,
  INTERVAL_MS,
  listReservations,
  reservationsOf,
  reserve,
  reservedByInterval,
  type ReservationDoc,
} from '../../store/capacity';

const MAX_WINDOW_MS = 31 * 24 * 60 * 60 * 1000;
/** A reservation may start at most this far ahead. */
const MAX_HORIZON_MS = 366 * 24 * 60 * 60 * 1000;
/** How long a calendar answer may be relied on. */
const STALE_AFTER_MS = 60_000;
/** Reservations must start at least this far ahead. */
const LEAD_MS = 30 * 60 * 1000;
const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,255}$/;
const RFC3339_UTC = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]00:00)$/i;

/**
 * An RFC 3339 UTC timestamp aligned to 15 minutes (`2026-01-01T10:15:00Z`; `+00:00` is accepted),
 * parsed to epoch milliseconds.
 */
export const AlignedTime = z
  .string()
  .transform((text, ctx) => {
    const m = RFC3339_UTC.exec(text);
    const ms = Date.parse(text);
    if (!m || Number.isNaN(ms) || new Date(ms).toISOString().slice(0, 16) !== `${m[1]}-${m[2]}-${m[3]}T${m[4]}:${m[5]}`) {
      ctx.addIssue({ code: 'custom', message: 'must be an RFC 3339 UTC timestamp such as 2026-01-01T10:15:00Z' });
      return z.NEVER;
    }
    if (ms % INTERVAL_MS !== 0) {
      ctx.addIssue({ code: 'custom', message: 'must be aligned to 15 minutes (minutes 00, 15, 30 or 45, seconds 0)' });
      return z.NEVER;
    }
    return ms;
  })
  .openapi({ type: 'string', format: 'date-time', example: '2026-01-01T10:15:00Z' });

const CalendarQuery = z.object({ from: AlignedTime, to: AlignedTime });

const IntervalRow = z
  .object({
    startsAt: z.string(),
    endsAt: z.string(),
    reservationLimitGb: z.number(),
    reservedGb: z.number(),
    reservableGb: z.number(),
  })
  .openapi('CapacityInterval');

const Calendar = z
  .object({
    generatedAt: z.string(),
    staleAt: z.string(),
    intervalDuration: z.literal('PT15M'),
    timezone: z.literal('UTC'),
    earliestReservableStart: z.string(),
    intervals: z.array(IntervalRow),
  })
  .openapi('CapacityCalendar');

const CreateReservationBody = z
  .object({
    startsAt: AlignedTime,
    endsAt: AlignedTime,
    capacityGb: z.number().int('must be a whole number of GB').positive('must be positive').multipleOf(4, 'must be a multiple of 4'),
  })
  .strict()
  .openapi('CreateReservation');

const Reservation = z
  .object({
    id: z.string(),
    startsAt: z.string(),
    endsAt: z.string(),
    capacityGb: z.number(),
    createdAt: z.string(),
  })
  .openapi('Reservation');

/** The next 15-minute boundary at least 30 minutes after `nowMs`. */
export function earliestReservableStart(nowMs: number): number {
  return Math.ceil((nowMs + LEAD_MS) / INTERVAL_MS) * INTERVAL_MS;
}

/** Checks a [from, to) window: from < to and at most 31 days; throws 400 naming the field. */
function checkWindow(from: number, to: number, where: { from: string; to: string }): void {
  if (to <= from) throw invalid(`${where.to}: must be after ${where.from}`);
  if (to - from > MAX_WINDOW_MS) throw invalid(`${where.to}: the window from ${where.from} must be at most 31 days`);
}

function reservationView(r: ReservationDoc): z.infer<typeof Reservation> {
  return {
    id: r._id,
    startsAt: r.startsAt.toISOString(),
    endsAt: r.endsAt.toISOString(),
    capacityGb: r.capacityGb,
    createdAt: r.createdAt.toISOString(),
  };
}

/** The organisation's reservation limit per interval: its setting, else RESERVATION_LIMIT_GB. */
async function limitOf(deps: ApiDeps, orgId: string): Promise<number> {
  const org = await deps.store.orgs.findOne({ _id: orgId });
  return org?.settings?.reservationLimitGb ?? deps.cfg.RESERVATION_LIMIT_GB;
}

/** /api/capacity: the calendar of reservable capacity, and reservations against it. */
export function registerCapacityRoutes(t: RouteTable, deps: ApiDeps): void {
  t.add({
    method: 'get',
    path: '/api/capacity/calendar',
    tag: 'capacity',
    summary: 'Reservable capacity per 15-minute UTC interval in [from, to) (at most 31 days)',
    query: CalendarQuery,
    responses: { 200: { description: 'A planning snapshot', schema: Calendar } },
    handler: async ({ query, org, res }) => {
      checkWindow(query.from, query.to, { from: 'query.from', to: 'query.to' });
      const now = Date.now();
      const [limit, reserved] = await Promise.all([limitOf(deps, org.id), reservedByInterval(deps.store, org.id, query.from, query.to)]);
      const intervals: z.infer<typeof IntervalRow>[] = [];
      for (let s = query.from; s < query.to; s += INTERVAL_MS) {
        const gb = reserved.get(s) ?? 0;
        intervals.push({
          startsAt: new Date(s).toISOString(),
          endsAt: new Date(s + INTERVAL_MS).toISOString(),
          reservationLimitGb: limit,
          reservedGb: gb,
          reservableGb: Math.max(0, limit - gb),
        });
      }
      res.json({
        generatedAt: new Date(now).toISOString(),
        staleAt: new Date(now + STALE_AFTER_MS).toISOString(),
        intervalDuration: 'PT15M',
        timezone: 'UTC',
        earliestReservableStart: new Date(earliestReservableStart(now)).toISOString(),
        intervals,
      });
    },
  });

  t.add({
    method: 'post',
    path: '/api/capacity/reservations',
    tag: 'capacity',
    summary: 'Reserve capacity in every interval of [startsAt, endsAt); never over reservationLimitGb. Send Idempotency-Key to make retries safe.',
    body: CreateReservationBody,
    responses: {
      201: { description: 'The reservation', schema: Reservation },
      200: { description: 'The reservation an earlier request with the same Idempotency-Key made', schema: Reservation },
    },
    errors: [409, 503],
    handler: async ({ body, org, req, res }) => {
      const key = req.header('idempotency-key');
      if (key !== undefined && !IDEMPOTENCY_KEY.test(key)) throw invalid('header Idempotency-Key: must be 1-255 printable ASCII characters');
      checkWindow(body.startsAt, body.endsAt, { from: 'body.startsAt', to: 'body.endsAt' });
      const now = Date.now();
      const earliest = earliestReservableStart(now);
      const limit = await limitOf(deps, org.id);
      const doc: ReservationDoc = {
        _id: key ? `rsv-${derivedId(org.id, 'reservation', key)}` : `rsv-${randomId()}`,
        orgId: org.id,
        startsAt: new Date(body.startsAt),
        endsAt: new Date(body.endsAt),
        capacityGb: body.capacityGb,
        idempotencyKey: key ?? null,
        createdAt: new Date(now),
      };
      const replay = key ? await reservationsOf(deps.store).findOne({ _id: doc._id }) : null;
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
      res.status(result.created ? 201 : 200).json(reservationView(r));
    },
  });

  t.add({
    method: 'get',
    path: '/api/capacity/reservations',
    tag: 'capacity',
    summary: "The organisation's reservations, by start time (a JSON array)",
    responses: { 200: { description: 'The reservations', schema: z.array(Reservation) } },
    handler: async ({ org, res }) => {
      res.json((await listReservations(deps.store, org.id)).map(reservationView));
    },
  });
}
