import { toApiError } from '../../api/app';
import { ApiError, ERROR_STATUS } from '../../lib/errors';
import { afterCursor, decodeCursor, encodeCursor } from '../../api/cursor';

describe('error vocabulary', () => {
  it('maps every type to a status', () => {
    for (const [type, status] of Object.entries(ERROR_STATUS)) {
      expect(new ApiError(type as keyof typeof ERROR_STATUS, 'x').status).toBe(status);
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
