import { MongoNetworkError, MongoServerError } from 'mongodb';
import { ServiceError } from '@temporalio/client';
import { toApiError } from '../../api/app';
import { ApiError, API_ERROR_STATUS } from '../../contract/errors';
import { afterCursor, decodeCursor, encodeCursor } from '../../store/page';

describe('error vocabulary', () => {
  it('maps every type to a status', () => {
    for (const [type, status] of Object.entries(API_ERROR_STATUS)) {
      expect(new ApiError(type as keyof typeof API_ERROR_STATUS, 'x').status).toBe(status);
    }
  });

  it('renders the spec body', () => {
    expect(new ApiError('conflict', 'busy').toBody()).toEqual({ error: { type: 'conflict', message: 'busy' } });
  });

  it('maps body-parser failures and hides internals', () => {
    expect(toApiError({ type: 'entity.parse.failed', message: 'Unexpected token' }).type).toBe('invalid_request');
    expect(toApiError({ type: 'entity.too.large', limit: 10 }).status).toBe(413);
    const internal = toApiError(new Error('secret stack detail'));
    expect(internal.type).toBe('internal');
    expect(internal.message).not.toMatch(/secret/);
  });
});

describe('outages of backing services', () => {
  const grpcError = (code: number) => Object.assign(new Error(`${code} grpc`), { code, details: 'x', metadata: {} });

  it('answers 503 unavailable, naming the service, when MongoDB or Temporal cannot be reached', () => {
    const mongo = toApiError(new MongoNetworkError('connect ECONNREFUSED 127.0.0.1:27017'));
    expect([mongo.status, mongo.type]).toEqual([503, 'unavailable']);
    expect(mongo.message).toMatch(/MongoDB/);
    expect(mongo.message).not.toMatch(/27017/);
    const temporal = toApiError(new ServiceError('Failed to query Workflow', { cause: grpcError(14) }));
    expect([temporal.status, temporal.message]).toEqual([503, 'Temporal is unavailable; retry shortly']);
    const socket = toApiError(new TypeError('fetch failed', { cause: Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }) }));
    expect(socket.status).toBe(503);
  });

  it("answers 503 when FerretDB's own backend (PostgreSQL) cannot be reached, without its message", () => {
    const down = toApiError(
      new MongoServerError({ message: '[pool.go:129 pool.(*Pool).Get] failed to connect to `user=ferretdb database=ferretdb`: dial error', code: 1 }),
    );
    expect([down.status, down.type, down.message]).toEqual([503, 'unavailable', 'MongoDB is unavailable; retry shortly']);
    const restarting = toApiError(new MongoServerError({ message: 'FATAL: the database system is shutting down (SQLSTATE 57P03)', code: 1 }));
    expect(restarting.status).toBe(503);
    // An InternalError about something else stays a bug.
    expect(toApiError(new MongoServerError({ message: 'unexpected nil document', code: 1 })).status).toBe(500);
  });

  it('keeps other failures of those services a 500', () => {
    expect(toApiError(new MongoServerError({ message: 'bad query', code: 2 })).status).toBe(500);
    expect(toApiError(new ServiceError('Failed', { cause: grpcError(3) })).status).toBe(500);
    expect(toApiError(Object.assign(new Error('no such file'), { code: 'ENOENT' })).status).toBe(500);
  });
});

describe('cursors', () => {
  it('round-trips and filters after the position', () => {
    const c = encodeCursor({ t: '2026-01-01T00:00:00.000Z', id: 'sess_a' });
    expect(decodeCursor(c)).toEqual({ t: '2026-01-01T00:00:00.000Z', id: 'sess_a' });
    expect(afterCursor(c)).toHaveProperty('$or');
    expect(afterCursor(undefined)).toEqual({});
  });

  it('rejects a forged cursor with 400', () => {
    expect(() => decodeCursor('not-a-cursor')).toThrow(ApiError);
  });
});
