import { ApiError } from '../lib/errors';

/** Maps a failure of a sandbox host call to the API's vocabulary (an ApiError passes through). */
export function fromHostError(err: unknown, what: string): ApiError {
  if (err instanceof ApiError) return err;
  const e = err as { name?: string; type?: string; message?: string; status?: number };
  if (e?.name === 'HostError') {
    if (e.type === 'not_found') return new ApiError('not_found', e.message ?? `${what} not found`);
    if (e.type === 'conflict') return new ApiError('conflict', e.message ?? `${what}: conflict`);
    if (e.type === 'invalid_request') return new ApiError('invalid_request', e.message ?? 'invalid request');
    if (e.type === 'payload_too_large') return new ApiError('payload_too_large', e.message ?? 'too large');
    if (e.type === 'unavailable') return new ApiError('unavailable', e.message ?? `${what}: the sandbox host is busy; retry`);
    if (e.type === 'rate_limited') return new ApiError('rate_limited', e.message ?? 'too many');
    return new ApiError('bad_gateway', `sandbox host failed: ${e.message ?? 'unknown error'}`);
  }
  return new ApiError('unavailable', `sandbox host unreachable: ${e?.message ?? String(err)}`);
}
