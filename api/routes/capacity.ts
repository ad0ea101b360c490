import { z } from 'zod';
import type { RouteTable } from '../http';
import { idempotencyKeyOf } from '../idempotency';
import type { CapacityService } from '../../services/orgs/capacity';
import { reservationView } from '../../services/views';
import { CalendarQuery, Calendar, CreateReservationBody, Reservation } from '../../contract/capacity';

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
