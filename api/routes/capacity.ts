import { z } from 'zod';
import type { RouteTable } from '../http';
import { idempotencyKeyOf } from '../idempotency';
import { INTERVAL_MS, type CapacityService } from '../../services/capacity';
import { reservationView } from '../../services/views';

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

/** /api/capacity: the calendar of reservable capacity, and reservations against it. */
export function registerCapacityRoutes(t: RouteTable, capacity: CapacityService): void {
  t.add({
    method: 'get',
    path: '/api/capacity/calendar',
    tag: 'capacity',
    summary: 'Reservable capacity per 15-minute UTC interval in [from, to) (at most 31 days)',
    query: CalendarQuery,
    responses: { 200: { description: 'A planning snapshot', schema: Calendar } },
    handler: async ({ query, org, res }) => {
      res.json(await capacity.calendar(org.id, query.from, query.to));
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
      const key = idempotencyKeyOf(req);
      const { reservation, created } = await capacity.reserve(org.id, body, key);
      res.status(created ? 201 : 200).json(reservationView(reservation));
    },
  });

  t.add({
    method: 'get',
    path: '/api/capacity/reservations',
    tag: 'capacity',
    summary: "The organisation's reservations, by start time (a JSON array)",
    responses: { 200: { description: 'The reservations', schema: z.array(Reservation) } },
    handler: async ({ org, res }) => {
      res.json((await capacity.list(org.id)).map(reservationView));
    },
  });
}
