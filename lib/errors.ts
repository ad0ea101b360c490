/** The API's one error vocabulary, its HTTP statuses, and its one error body. */
export const ERROR_STATUS = {
  invalid_request: 400,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  method_not_allowed: 405,
  conflict: 409,
  gone: 410,
  payload_too_large: 413,
  unsupported_media_type: 415,
  rate_limited: 429,
  internal: 500,
  not_implemented: 501,
  bad_gateway: 502,
  unavailable: 503,
  /** The organisation's storage quota (ORG_STORAGE_QUOTA_MB) is used up: waiting does not help, deleting does. */
  insufficient_storage: 507,
} as const satisfies Record<string, number>;

export type ErrorType = keyof typeof ERROR_STATUS;

/** `{ "error": { "type", "message" } }`, the body of every error answer. */
export interface ErrorBody {
  error: { type: ErrorType; message: string };
}

/** An error that carries its API type; thrown anywhere in a request, rendered by the error handler. */
export class ApiError extends Error {
  override name = 'ApiError';
  constructor(
    readonly type: ErrorType,
    message: string,
  ) {
    super(message);
  }
  get status(): number {
    return ERROR_STATUS[this.type];
  }
  toBody(): ErrorBody {
    return { error: { type: this.type, message: this.message } };
  }
}

export const notFound = (what: string): ApiError => new ApiError('not_found', `${what} not found`);
export const conflict = (message: string): ApiError => new ApiError('conflict', message);
export const invalid = (message: string): ApiError => new ApiError('invalid_request', message);

/** Errors of the MongoDB driver that mean the database cannot be reached (not that a query was wrong). */
const MONGO_UNREACHABLE = new Set([
  'MongoNetworkError',
  'MongoNetworkTimeoutError',
  'MongoServerSelectionError',
  'MongoNotConnectedError',
  'MongoTopologyClosedError',
  'MongoPoolClearedError',
  'MongoServerClosedError',
]);
/** gRPC status codes of a Temporal call that found no server: UNAVAILABLE, DEADLINE_EXCEEDED. */
const GRPC_UNREACHABLE = new Set([14, 4]);
/** Socket errors of a call to a service (the sandbox host, or a driver's own socket). */
const SOCKET_UNREACHABLE = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'UND_ERR_SOCKET', 'UND_ERR_CONNECT_TIMEOUT']);

/**
 * Which backing service an error says is out of reach ('MongoDB', 'Temporal', 'a backing service'),
 * or null when it is some other failure. Follows `cause` chains: drivers wrap socket errors.
 * Such a failure is an outage (503, retry later), not a bug (500).
 */
export function unreachableService(err: unknown): string | null {
  for (let e = err as { name?: string; code?: unknown; cause?: unknown } | undefined, depth = 0; e && typeof e === 'object' && depth < 8; e = e.cause as typeof e, depth++) {
    if (e.name && MONGO_UNREACHABLE.has(e.name)) return 'MongoDB';
    // A gRPC error (Temporal's client wraps it in a ServiceError): a number code and metadata.
    if (typeof e.code === 'number' && GRPC_UNREACHABLE.has(e.code) && 'metadata' in e) return 'Temporal';
    if (typeof e.code === 'string' && SOCKET_UNREACHABLE.has(e.code)) return 'a backing service';
  }
  return null;
}
