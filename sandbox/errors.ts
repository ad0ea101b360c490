/**
 * One vocabulary of errors for the sandbox runtime and the host's HTTP API, mapped to HTTP statuses
 * in one table the compiler checks.
 */

export type SandboxErrorType =
  | 'invalid_request'
  | 'unauthorized'
  | 'not_found'
  | 'conflict'
  | 'payload_too_large'
  | 'patch_failed'
  | 'rate_limited'
  | 'internal'
  | 'unavailable';

/** HTTP status of each error type. */
export const errorStatus: Record<SandboxErrorType, number> = {
  invalid_request: 400,
  unauthorized: 401,
  not_found: 404,
  conflict: 409,
  payload_too_large: 413,
  patch_failed: 422,
  rate_limited: 429,
  internal: 500,
  unavailable: 503,
};

/** An expected failure of a sandbox operation; `type` says which (recognise it by `.name`/`.type`). */
export class SandboxError extends Error {
  override readonly name = 'SandboxError';
  constructor(
    readonly type: SandboxErrorType,
    message: string,
  ) {
    super(message);
  }
}

/** True when `err` is a SandboxError (checked by name, so it works across module copies). */
export function isSandboxError(err: unknown): err is SandboxError {
  return typeof err === 'object' && err !== null && (err as { name?: unknown }).name === 'SandboxError';
}
