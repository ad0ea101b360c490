/** The API's one error vocabulary, its HTTP statuses, and its one error body. */
export const ERROR_STATUS = {
  invalid_request: 400,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  method_not_allowed: 405,
  conflict: 409,
  payload_too_large: 413,
  unsupported_media_type: 415,
  internal: 500,
  bad_gateway: 502,
  unavailable: 503,
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
