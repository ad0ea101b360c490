/**
 * The errors of the sandbox runtime and the host's HTTP API: codes and statuses are the host's part
 * of the one registry (contract/errors.ts).
 */
import { HOST_ERROR_STATUS, SandboxError, type HostErrorType } from '../contract/errors';

export { SandboxError };
export type SandboxErrorType = HostErrorType;

/** HTTP status of each error type the host answers with. */
export const errorStatus: Readonly<Record<SandboxErrorType, number>> = HOST_ERROR_STATUS;

/** True when `err` is a SandboxError (checked by name, so it works across module copies). */
export function isSandboxError(err: unknown): err is SandboxError {
  return typeof err === 'object' && err !== null && (err as { name?: unknown }).name === 'SandboxError';
}
