/**
 * The one error registry of the platform: every error code, with its HTTP status, whether a retry
 * may help, where it is answered (the public API, the sandbox host's HTTP API), and, for a failure
 * an activity reports to Temporal, the failure type it becomes there (and, when it ends a session,
 * the session outcome's reason). Every status table, every `nonRetryableErrorTypes` list and the
 * outcome of a failed provisioning are derived from it.
 *
 * Pure data and plain classes: imported by workflows (their bundle), so it imports nothing.
 */

/** Why a failed session ended (`outcome.reason` of a session). */
export const OUTCOME_REASONS = ['exit_code', 'timeout', 'cancelled', 'invalid_result', 'oom', 'provisioning_failed', 'host_lost'] as const;
export type OutcomeReason = (typeof OUTCOME_REASONS)[number];

/** Where a code is answered over HTTP: the public API (`api`), the sandbox host's API (`host`). */
type Surface = 'api' | 'host';

/** One code of the registry. */
export interface ErrorSpec {
  /** HTTP status of an answer with this code (for a failure-only code: the status it would have). */
  readonly status: number;
  /** Whether trying the same thing again later may succeed. */
  readonly retryable: boolean;
  /** The HTTP APIs that answer with this code. */
  readonly on: readonly Surface[];
  /** The Temporal failure type (ApplicationFailure `type`) an activity reports this code as. */
  readonly failure?: string;
  /** The outcome reason of a session that this failure ends. */
  readonly outcome?: OutcomeReason;
  /** A host answer with this code is answered as is by the public API (else it is a 502 bad_gateway). */
  readonly relayed?: true;
}

const both: readonly Surface[] = ['api', 'host'];
const api: readonly Surface[] = ['api'];
const host: readonly Surface[] = ['host'];
const none: readonly Surface[] = [];

/** Every error code. */
export const ERRORS = {
  invalid_request: { status: 400, retryable: false, on: both, relayed: true },
  unauthorized: { status: 401, retryable: false, on: both },
  forbidden: { status: 403, retryable: false, on: api },
  not_found: { status: 404, retryable: false, on: both, relayed: true },
  method_not_allowed: { status: 405, retryable: false, on: api },
  conflict: { status: 409, retryable: false, on: both, relayed: true },
  gone: { status: 410, retryable: false, on: api },
  payload_too_large: { status: 413, retryable: false, on: both, relayed: true },
  unsupported_media_type: { status: 415, retryable: false, on: api },
  /** The request line and headers (a URL, a cookie) are longer than the HTTP server reads (Node's max header size). */
  request_header_fields_too_large: { status: 431, retryable: false, on: api },
  /** The request's headers or body did not arrive within the HTTP server's time limits. */
  request_timeout: { status: 408, retryable: true, on: api },
  /** A patch of a snapshot failed while the host built a sandbox: the agent's snapshot is broken. */
  patch_failed: { status: 422, retryable: false, on: host, failure: 'PatchFailed', outcome: 'provisioning_failed' },
  rate_limited: { status: 429, retryable: true, on: both, relayed: true },
  internal: { status: 500, retryable: true, on: both },
  not_implemented: { status: 501, retryable: false, on: api },
  bad_gateway: { status: 502, retryable: true, on: api },
  unavailable: { status: 503, retryable: true, on: both, relayed: true },
  /** The organisation's storage quota (ORG_STORAGE_QUOTA_MB) is used up: waiting does not help, deleting does. */
  insufficient_storage: { status: 507, retryable: false, on: api },

  /** The agent cannot run as configured (its secret store, environment or sandbox request is refused). */
  invalid_agent: { status: 400, retryable: false, on: none, failure: 'InvalidAgent', outcome: 'provisioning_failed' },
  /** The agent's snapshot, or one of its layers, cannot be found. */
  snapshot_not_found: { status: 404, retryable: false, on: none, failure: 'SnapshotNotFound', outcome: 'provisioning_failed' },
  /** The sandbox a step needs no longer exists on its host. */
  sandbox_lost: { status: 410, retryable: false, on: none, failure: 'SandboxLost' },
  /** The sandbox host that owns a sandbox is lost (its sandboxes are written off). */
  host_lost: { status: 503, retryable: false, on: none, failure: 'HostLost', outcome: 'host_lost' },
  /** A rewind's turn has no checkpoint any more: garbage collection freed it (the API answers 409 conflict with the reason). */
  checkpoint_freed: { status: 409, retryable: false, on: none, failure: 'CheckpointFreed' },
  /** The session or batch a webhook is about no longer exists. */
  webhook_subject_not_found: { status: 404, retryable: false, on: none, failure: 'NotFound' },
  /** The webhook's address is refused by the operator's policy (WEBHOOK_ALLOWED_CIDRS). */
  webhook_target_refused: { status: 400, retryable: false, on: none, failure: 'WebhookTargetRefused' },
  /** No answer from the webhook's receiver. */
  webhook_unreachable: { status: 502, retryable: true, on: none, failure: 'WebhookUnreachable' },
  /** The webhook's receiver answered with a non-2xx status. */
  webhook_refused: { status: 502, retryable: true, on: none, failure: 'WebhookRefused' },
} as const satisfies Record<string, ErrorSpec>;

export type ErrorCode = keyof typeof ERRORS;
type CodesOn<S extends Surface> = { [C in ErrorCode]: S extends (typeof ERRORS)[C]['on'][number] ? C : never }[ErrorCode];
/** The codes the public API answers with. */
export type ApiErrorType = CodesOn<'api'>;
/** The codes the sandbox host's API answers with. */
export type HostErrorType = CodesOn<'host'>;
/** The codes an activity reports to Temporal as a failure of a type of its own. */
export type FailureCode = { [C in ErrorCode]: (typeof ERRORS)[C] extends { failure: string } ? C : never }[ErrorCode];

const codes = Object.keys(ERRORS) as ErrorCode[];
const spec = (code: ErrorCode): ErrorSpec => ERRORS[code];

function statusTable<S extends Surface>(surface: S): Record<CodesOn<S>, number> {
  return Object.fromEntries(codes.filter((c) => spec(c).on.includes(surface)).map((c) => [c, spec(c).status])) as Record<CodesOn<S>, number>;
}

/** HTTP status of each code of the public API. */
export const API_ERROR_STATUS: Readonly<Record<ApiErrorType, number>> = statusTable('api');
/** HTTP status of each code of the sandbox host's API. */
export const HOST_ERROR_STATUS: Readonly<Record<HostErrorType, number>> = statusTable('host');

/** The Temporal failure type of a failure code (what the Temporal UI shows). */
export function failureType(code: FailureCode): string {
  return spec(code).failure!;
}

/** Every failure type a retry cannot help: the `nonRetryableErrorTypes` of the workflows' retry policies. */
export function nonRetryableFailureTypes(): string[] {
  return codes.filter((c) => spec(c).failure && !spec(c).retryable).map((c) => spec(c).failure!);
}

/**
 * The outcome reason of a session whose provisioning failed with a failure of type `type`:
 * the registry's reason for that failure, else `provisioning_failed`.
 */
export function provisioningOutcome(type: string | undefined): OutcomeReason {
  return codes.map(spec).find((s) => s.failure !== undefined && s.failure === type)?.outcome ?? 'provisioning_failed';
}

/** True when a sandbox host's answer with this code is answered with the same code by the public API. */
export function relayedFromHost(code: string): code is ApiErrorType & HostErrorType {
  return code in ERRORS && spec(code as ErrorCode).relayed === true;
}

/** `{ "error": { "type", "message" } }`, the body of every error answer (API and sandbox host). */
export interface ErrorBody<T extends string = ApiErrorType> {
  error: { type: T; message: string };
}

/**
 * An error with a registry code; its HTTP status comes from the registry. Recognise one by `.name`
 * and `.type`, not `instanceof` (module copies, the workflow sandbox).
 */
export class CodedError<C extends string = ErrorCode> extends Error {
  constructor(
    readonly type: C,
    message: string,
  ) {
    super(message);
  }
  /** The code's HTTP status (500 for a code the registry does not know). */
  get status(): number {
    return (ERRORS as Record<string, ErrorSpec>)[this.type]?.status ?? 500;
  }
  toBody(): ErrorBody<C> {
    return { error: { type: this.type, message: this.message } };
  }
}

/** An error of the public API; thrown anywhere in a request, rendered by the API's error handler. */
export class ApiError extends CodedError<ApiErrorType> {
  override name = 'ApiError';
}

/** An expected failure of a sandbox operation on the host, answered by the host's API with its code. */
export class SandboxError extends CodedError<HostErrorType> {
  override readonly name = 'SandboxError';
}

/** True when `err` is a SandboxError (checked by name, so it works across module copies). */
export function isSandboxError(err: unknown): err is SandboxError {
  return typeof err === 'object' && err !== null && (err as { name?: unknown }).name === 'SandboxError';
}

/**
 * An error answered by a sandbox host, as its client receives it: the code of its body and the
 * HTTP status it came with (a code this registry does not know is kept as is).
 */
export class HostError extends CodedError<HostErrorType | (string & {})> {
  override readonly name = 'HostError';
  constructor(
    type: HostErrorType | (string & {}),
    readonly httpStatus: number,
    message: string,
  ) {
    super(type, message);
  }
  /** The status the host answered with. */
  override get status(): number {
    return this.httpStatus;
  }
}

/**
 * An expected failure of a workflow's step, thrown by the service that does the step with a registry
 * failure code: the activity that called the service reports it as that code's failure type
 * (activities/failures.ts). `details` travel with it (e.g. the lost host's id).
 */
export class StepFailure extends CodedError<FailureCode> {
  override readonly name = 'StepFailure';
  readonly details: unknown[];
  constructor(type: FailureCode, message: string, ...details: unknown[]) {
    super(type, message);
    this.details = details;
  }
}

/** True when `err` is a StepFailure (checked by name, so it works across module copies). */
export function isStepFailure(err: unknown): err is StepFailure {
  return typeof err === 'object' && err !== null && (err as { name?: unknown }).name === 'StepFailure';
}

export const notFound = (what: string): ApiError => new ApiError('not_found', `${what} not found`);
export const conflict = (message: string): ApiError => new ApiError('conflict', message);
export const invalid = (message: string): ApiError => new ApiError('invalid_request', message);
