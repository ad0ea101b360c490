import { createHash, randomBytes } from 'node:crypto';
import { api, unique, withMongo } from '../../helpers/env';

const Q = 15 * 60 * 1000;
const iso = (ms: number): string => new Date(ms).toISOString();
/** An aligned start well past earliestReservableStart, on a fresh day so tests do not share intervals. */
const futureStart = (daysAhead: number): number => Math.ceil((Date.now() + daysAhead * 86_400_000) / 86_400_000) * 86_400_000 + 10 * 3600_000;

/** A new organisation with its own key, and optionally its own reservation limit. */
async function newOrg(limitGb?: number): Promise<string> {
  const orgId = unique('cap');
  const key = `sap_${randomBytes(18).toString('base64url')}`;
  await withMongo(async (c) => {
    await c
      .db()
      .collection('orgs')
      .insertOne({ _id: orgId as never, name: orgId, createdAt: new Date(), settings: limitGb === undefined ? {} : { reservationLimitGb: limitGb } });
    await c
      .db()
      .collection('api_keys')
      .insertOne({ _id: createHash('sha256').update(key).digest('hex') as never, orgId, label: 'test', prefix: 'sap_', createdAt: new Date() });
  });
  return key;
}

const calendar = (key: string, from: number | string, to: number | string) =>
  api(
    'GET',
    `/api/capacity/calendar?from=${encodeURIComponent(typeof from === 'number' ? iso(from) : from)}&to=${encodeURIComponent(typeof to === 'number' ? iso(to) : to)}`,
    { key },
  );
const reserveReq = (key: string, startsAt: number, endsAt: number, capacityGb: number, headers?: Record<string, string>) =>
  api('POST', '/api/capacity/reservations', { key, body: { startsAt: iso(startsAt), endsAt: iso(endsAt), capacityGb }, headers });

describe('capacity calendar', () => {
  it('answers one aligned UTC row per 15 minutes, with the default limit from the configuration', async () => {
    const key = await newOrg();
    const from = Date.parse('2030-03-01T23:00:00Z');
    const asked = Date.now();
    const r = await calendar(key, from, from + 2 * 3600_000);
    const answered = Date.now();
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ intervalDuration: 'PT15M', timezone: 'UTC' });
    expect(r.body.intervals).toHaveLength(8);
    r.body.intervals.forEach((row: any, i: number) => {
      expect(row).toEqual({ startsAt: iso(from + i * Q), endsAt: iso(from + (i + 1) * Q), reservationLimitGb: 64, reservedGb: 0, reservableGb: 64 });
      expect(row.startsAt).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:(00|15|30|45):00\.000Z$/);
    });
    // Rows cross midnight UTC in order.
    expect(r.body.intervals[4].startsAt).toBe('2030-03-02T00:00:00.000Z');
    const generated = Date.parse(r.body.generatedAt);
    // Made while the request was served (the API runs on this machine's clock).
    expect(generated).toBeGreaterThanOrEqual(asked);
    expect(generated).toBeLessThanOrEqual(answered);
    expect(Date.parse(r.body.staleAt)).toBe(generated + 60_000);
    const earliest = Date.parse(r.body.earliestReservableStart);
    expect(earliest % Q).toBe(0);
    expect(earliest - generated).toBeGreaterThanOrEqual(30 * 60_000);
    expect(earliest - generated).toBeLessThan(45 * 60_000);
  });

  it('accepts +00:00 and a window of exactly 31 days', async () => {
    const key = await newOrg(12);
    const r = await calendar(key, '2030-01-01T00:00:00+00:00', '2030-02-01T00:00:00Z');
    expect(r.status).toBe(200);
    expect(r.body.intervals).toHaveLength(31 * 96);
    expect(r.body.intervals[0].reservationLimitGb).toBe(12);
    expect(r.body.intervals.at(-1).endsAt).toBe('2030-02-01T00:00:00.000Z');
  });

  it.each([
    ['2030-01-01T00:07:00Z', '2030-01-01T01:00:00Z', /query\.from: must be aligned to 15 minutes/],
    ['2030-01-01T00:00:00Z', '2030-01-01T01:00:30Z', /query\.to: must be aligned to 15 minutes/],
    ['2030-01-01T00:00:00.500Z', '2030-01-01T01:00:00Z', /query\.from: must be aligned/],
    ['2030-01-01T01:00:00+01:00', '2030-01-01T02:00:00Z', /query\.from: must be an RFC 3339 UTC timestamp/],
    ['2030-01-01', '2030-01-02T00:00:00Z', /query\.from: must be an RFC 3339 UTC timestamp/],
    ['2030-02-30T00:00:00Z', '2030-03-02T00:00:00Z', /query\.from: must be an RFC 3339 UTC timestamp/],
    ['2030-01-01T01:00:00Z', '2030-01-01T01:00:00Z', /query\.to: must be after query\.from/],
    ['2030-01-01T02:00:00Z', '2030-01-01T01:00:00Z', /query\.to: must be after query\.from/],
    ['2030-01-01T00:00:00Z', '2030-02-01T00:15:00Z', /at most 31 days/],
  ])('refuses from=%s to=%s with 400', async (from, to, message) => {
    const r = await calendar(await newOrg(), from, to);
    expect(r.status).toBe(400);
    expect(r.body.error).toEqual({ type: 'invalid_request', message: expect.stringMatching(message) });
  });

  it('refuses a missing bound with 400 naming it', async () => {
    const r = await api('GET', '/api/capacity/calendar?from=2030-01-01T00:00:00Z');
    expect(r.status).toBe(400);
    expect(r.body.error.message).toMatch(/query\.to/);
  });
});

describe('capacity reservations', () => {
  it('reserves, shows the reservation in the calendar and the list, and keeps other organisations apart', async () => {
    const key = await newOrg(16);
    const start = futureStart(2);
    const made = await reserveReq(key, start, start + 3600_000, 8);
    expect(made.status).toBe(201);
    expect(made.body).toEqual({
      id: expect.stringMatching(/^rsv-/),
      startsAt: iso(start),
      endsAt: iso(start + 3600_000),
      capacityGb: 8,
      createdAt: expect.any(String),
    });
    const second = await reserveReq(key, start + 3 * Q, start + 5 * Q, 4);
    expect(second.status).toBe(201);

    const cal = await calendar(key, start - Q, start + 6 * Q);
    expect(cal.body.intervals.map((r: any) => r.reservedGb)).toEqual([0, 8, 8, 8, 12, 4, 0]);
    expect(cal.body.intervals.map((r: any) => r.reservableGb)).toEqual([16, 8, 8, 8, 4, 12, 16]);

    const list = await api('GET', '/api/capacity/reservations', { key });
    expect(list.status).toBe(200);
    expect(list.body.map((r: any) => r.id)).toEqual([made.body.id, second.body.id]);

    const other = await newOrg(16);
    expect((await api('GET', '/api/capacity/reservations', { key: other })).body).toEqual([]);
    expect((await calendar(other, start, start + Q)).body.intervals[0].reservedGb).toBe(0);
  });

  it('validates times, lead time and capacity', async () => {
    const key = await newOrg(16);
    const start = futureStart(2);
    const cal = await calendar(key, start, start + Q);
    const earliest = Date.parse(cal.body.earliestReservableStart);
    const cases: [unknown, RegExp][] = [
      [{ startsAt: iso(earliest - Q), endsAt: iso(earliest + Q), capacityGb: 4 }, /body\.startsAt: must be at or after earliestReservableStart/],
      [{ startsAt: iso(start + 60_000), endsAt: iso(start + Q), capacityGb: 4 }, /body\.startsAt: must be aligned/],
      [{ startsAt: iso(start), endsAt: iso(start), capacityGb: 4 }, /body\.endsAt: must be after body\.startsAt/],
      [{ startsAt: iso(start), endsAt: iso(start + Q), capacityGb: 6 }, /body\.capacityGb: must be a multiple of 4/],
      [{ startsAt: iso(start), endsAt: iso(start + Q), capacityGb: 0 }, /body\.capacityGb: must be positive/],
      [{ startsAt: iso(start), endsAt: iso(start + Q), capacityGb: 20 }, /body\.capacityGb: must be at most reservationLimitGb \(16\)/],
      [{ startsAt: iso(start), endsAt: iso(start + Q) }, /body\.capacityGb/],
      [{ startsAt: iso(start), endsAt: iso(start + Q), capacityGb: 4, extra: 1 }, /extra/],
    ];
    for (const [body, message] of cases) {
      const r = await api('POST', '/api/capacity/reservations', { key, body });
      expect([r.status, r.body.error?.message]).toEqual([400, expect.stringMatching(message)]);
    }
    // The earliest reservable start itself is accepted.
    expect((await reserveReq(key, earliest, earliest + Q, 4)).status).toBe(201);
  });

  it('never goes over the limit: a reservation that does not fit is 409 and changes nothing', async () => {
    const key = await newOrg(8);
    const start = futureStart(3);
    expect((await reserveReq(key, start + 2 * Q, start + 3 * Q, 8)).status).toBe(201);
    const over = await reserveReq(key, start, start + 4 * Q, 4);
    expect(over.status).toBe(409);
    expect(over.body.error).toEqual({ type: 'conflict', message: expect.stringContaining(iso(start + 2 * Q)) });
    const cal = await calendar(key, start, start + 4 * Q);
    expect(cal.body.intervals.map((r: any) => r.reservedGb)).toEqual([0, 0, 8, 0]);
  });

  it('lets exactly one of several concurrent reservations at the limit win', async () => {
    const key = await newOrg(8);
    const start = futureStart(4);
    // Overlapping windows that each fill interval start+Q; only one can fit.
    const results = await Promise.all([0, 1, 2, 3, 4].map((i) => reserveReq(key, start + (i % 2) * Q, start + 2 * Q + i * Q, 8)));
    const statuses = results.map((r) => r.status).sort();
    expect(statuses).toEqual([201, 409, 409, 409, 409]);
    const cal = await calendar(key, start, start + 8 * Q);
    expect(Math.max(...cal.body.intervals.map((r: any) => r.reservedGb))).toBe(8);
    const list = await api('GET', '/api/capacity/reservations', { key });
    expect(list.body).toHaveLength(1);
  });

  it('honours Idempotency-Key: a retry returns the same reservation once, another body is 409', async () => {
    const key = await newOrg(8);
    const start = futureStart(5);
    const h = { 'idempotency-key': unique('rsv') };
    const first = await reserveReq(key, start, start + Q, 8, h);
    expect(first.status).toBe(201);
    const again = await Promise.all([reserveReq(key, start, start + Q, 8, h), reserveReq(key, start, start + Q, 8, h)]);
    expect(again.map((r) => [r.status, r.body.id])).toEqual([
      [200, first.body.id],
      [200, first.body.id],
    ]);
    const other = await reserveReq(key, start, start + 2 * Q, 8, h);
    expect(other.status).toBe(409);
    expect(other.body.error.message).toMatch(/Idempotency-Key/);
    expect((await calendar(key, start, start + Q)).body.intervals[0].reservedGb).toBe(8);
    expect((await api('GET', '/api/capacity/reservations', { key })).body).toHaveLength(1);
  });

  it('handles concurrent first requests with the same Idempotency-Key as one reservation', async () => {
    const key = await newOrg(16);
    const start = futureStart(6);
    const h = { 'idempotency-key': unique('rsv') };
    const rs = await Promise.all([1, 2, 3].map(() => reserveReq(key, start, start + Q, 4, h)));
    expect(rs.map((r) => r.status).sort()).toEqual([200, 200, 201]);
    expect(new Set(rs.map((r) => r.body.id)).size).toBe(1);
    expect((await calendar(key, start, start + Q)).body.intervals[0].reservedGb).toBe(4);
  });
});
