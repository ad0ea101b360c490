import { ApplicationFailure } from '@temporalio/activity';
import { ERRORS, failureType, isStepFailure, type FailureCode } from '../contract/errors';

/**
 * The ApplicationFailure an activity throws for registry code `code` (contract/errors.ts): its
 * Temporal type is the code's failure type, and it is non-retryable unless the registry says a retry
 * may help. `details` travel with it (e.g. the lost host's id).
 */
export function failure(code: FailureCode, message: string, ...details: unknown[]): ApplicationFailure {
  return ApplicationFailure.create({ type: failureType(code), message, nonRetryable: !ERRORS[code].retryable, details });
}

/**
 * The result of a service call, with a StepFailure it throws (contract/errors.ts) reported as the
 * registry's failure (see failure); any other error passes as it is (Temporal retries it).
 */
export async function withFailureTypes<T>(call: Promise<T>): Promise<T> {
  try {
    return await call;
  } catch (err) {
    if (isStepFailure(err)) throw failure(err.type, err.message, ...err.details);
    throw err;
  }
}
