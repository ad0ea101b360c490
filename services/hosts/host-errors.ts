import { relayedFromHost } from '../../contract/errors';
import { ApiError } from '../../contract/errors';

/** The message of a relayed host error that came without one. */
const DEFAULT_MESSAGE: Record<string, (what: string) => string> = {
  not_found: (what) => `${what} not found`,
  conflict: (what) => `${what}: conflict`,
  invalid_request: () => 'invalid request',
  payload_too_large: () => 'too large',
  unavailable: (what) => `${what}: the sandbox host is busy; retry`,
  rate_limited: () => 'too many',
};

/**
 * Maps a failure of a sandbox host call to the API's vocabulary (an ApiError passes through): a host
 * error whose code the registry relays (contract/errors.ts) keeps its code; any other is a 502; a host
 * that cannot be reached is a 503.
 */
export function fromHostError(err: unknown, what: string): ApiError {
  if (err instanceof ApiError) return err;
  const e = err as { name?: string; type?: string; message?: string; status?: number };
  if (e?.name === 'HostError') {
    if (e.type && relayedFromHost(e.type)) return new ApiError(e.type, e.message ?? DEFAULT_MESSAGE[e.type]?.(what) ?? e.type);
    return new ApiError('bad_gateway', `sandbox host failed: ${e.message ?? 'unknown error'}`);
  }
  return new ApiError('unavailable', `sandbox host unreachable: ${e?.message ?? String(err)}`);
}
