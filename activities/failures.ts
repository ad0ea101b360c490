import { ApplicationFailure } from '@temporalio/activity';
import { ERRORS, failureType, type FailureCode } from '../contract/errors';

/**
 * The ApplicationFailure an activity throws for registry code `code` (contract/errors.ts): its
 * Temporal type is the code's failure type, and it is non-retryable unless the registry says a retry
 * may help. `details` travel with it (e.g. the lost host's id).
 */
export function failure(code: FailureCode, message: string, ...details: unknown[]): ApplicationFailure {
  return ApplicationFailure.create({ type: failureType(code), message, nonRetryable: !ERRORS[code].retryable, details });
}
