/**
 * The capacity calendar and reservations (/api/capacity): bodies, queries and views.
 */
import { z } from './zod'; // zod with .openapi()

/** Length of one calendar interval. */
export const INTERVAL_MS = 15 * 60 * 1000;

export const RFC3339_UTC = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]00:00)$/i;

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

export const CalendarQuery = z.object({ from: AlignedTime, to: AlignedTime });

export const IntervalRow = z
  .object({
    startsAt: z.string(),
    endsAt: z.string(),
    reservationLimitGb: z.number(),
    reservedGb: z.number(),
    reservableGb: z.number(),
  })
  .openapi('CapacityInterval');

export const Calendar = z
  .object({
    generatedAt: z.string(),
    staleAt: z.string(),
    intervalDuration: z.literal('PT15M'),
    timezone: z.literal('UTC'),
    earliestReservableStart: z.string(),
    intervals: z.array(IntervalRow),
  })
  .openapi('CapacityCalendar');

export const CreateReservationBody = z
  .object({
    startsAt: AlignedTime,
    endsAt: AlignedTime,
    capacityGb: z.number().int('must be a whole number of GB').positive('must be positive').multipleOf(4, 'must be a multiple of 4'),
  })
  .strict()
  .openapi('CreateReservation');

export const Reservation = z
  .object({
    id: z.string(),
    startsAt: z.string(),
    endsAt: z.string(),
    capacityGb: z.number(),
    createdAt: z.string(),
  })
  .openapi('Reservation');
