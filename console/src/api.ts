/**
 * The console's one way to the API: same origin, the key from this tab's session storage in
 * X-API-Key (never in a URL), a timeout on every call, and the API's error body turned into an error.
 */
const KEY = 'sap.console.apiKey';

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly type: string,
    message: string,
  ) {
    super(message);
  }
  /** As the console shows it: the API's type and message. */
  override toString(): string {
    return this.status ? `${this.status} ${this.type}: ${this.message}` : `${this.type}: ${this.message}`;
  }
}

export const getKey = (): string | null => sessionStorage.getItem(KEY);
export const setKey = (key: string): void => sessionStorage.setItem(KEY, key);
export const clearKey = (): void => sessionStorage.removeItem(KEY);

/** Why the console signed out by itself (the API's 401 for the stored key), for the sign-in page to show once. */
let signedOutBy: ApiError | null = null;
export const takeSignOutReason = (): ApiError | null => {
  const e = signedOutBy;
  signedOutBy = null;
  return e;
};

export interface CallOpts {
  method?: string;
  body?: unknown;
  /** Sent as is (file uploads), with Content-Type application/octet-stream. */
  raw?: Blob;
  signal?: AbortSignal;
  /** Default 15 s; the call fails with type `timeout` after it. */
  timeoutMs?: number;
  accept?: string;
  key?: string;
}

/** Sends the request; answers the Response once its headers are in (for streams). Errors come as ApiError. */
export async function request(path: string, opts: CallOpts = {}): Promise<Response> {
  const key = opts.key ?? getKey();
  const headers: Record<string, string> = { Accept: opts.accept ?? 'application/json' };
  if (key) headers['X-API-Key'] = key;
  let body: BodyInit | undefined;
  if (opts.raw) {
    body = opts.raw;
    headers['Content-Type'] = 'application/octet-stream';
  } else if (opts.body !== undefined) {
    body = JSON.stringify(opts.body);
    headers['Content-Type'] = 'application/json';
  }
  const timeoutMs = opts.timeoutMs ?? 15_000;
  const timeout = AbortSignal.timeout(timeoutMs);
  const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
  let res: Response;
  try {
    res = await fetch(path, { method: opts.method ?? 'GET', headers, body, signal, credentials: 'omit', cache: 'no-store' });
  } catch (err) {
    if (timeout.aborted) throw new ApiError(0, 'timeout', `the API did not answer within ${Math.round(timeoutMs / 1000)} s`);
    if (opts.signal?.aborted) throw new ApiError(0, 'aborted', 'left the page');
    throw new ApiError(0, 'network', `the API cannot be reached (${(err as Error).message})`);
  }
  if (!res.ok) {
    const e = await errorOf(res);
    // The stored key stopped working (revoked, or its organisation removed): forget it and go to the
    // sign-in page, which shows the API's message, rather than leave every page failing.
    if (res.status === 401 && opts.key === undefined && key !== null && getKey() === key) {
      clearKey();
      signedOutBy = e;
      location.hash = '#/signin';
    }
    throw e;
  }
  return res;
}

/** A JSON call. */
export async function api<T>(path: string, opts: CallOpts = {}): Promise<T> {
  const res = await request(path, opts);
  const text = await res.text();
  return (text ? JSON.parse(text) : null) as T;
}

async function errorOf(res: Response): Promise<ApiError> {
  const text = await res.text().catch(() => '');
  try {
    const e = (JSON.parse(text) as { error?: { type?: string; message?: string } }).error;
    if (e?.type) return new ApiError(res.status, e.type, e.message ?? '');
  } catch {
    /* not the API's error body */
  }
  return new ApiError(res.status, 'http_error', text.slice(0, 200) || res.statusText);
}

/** The subprotocols a WebSocket offers: `sap-console`, and the key (base64url) so that it is in no URL. */
export function socketProtocols(): string[] {
  const key = getKey() ?? '';
  const b64 = btoa(String.fromCharCode(...new TextEncoder().encode(key)))
    .replace(/\+/g, '-')
    .replace(/\//g, '_')
    .replace(/=+$/, '');
  return ['sap-console', `sap-key.${b64}`];
}

export const enc = encodeURIComponent;

/** GET /api/console/config: the key's role, and for an operator the Temporal UI's address (null for a tenant). */
export interface ConsoleConfig {
  temporalUiUrl: string | null;
  temporalNamespace: string;
  role: 'tenant' | 'operator';
}

let config: { key: string; value: Promise<ConsoleConfig> } | null = null;
/** The console's settings for the signed-in key, read once per key (dropped when the call fails). */
export function consoleConfig(): Promise<ConsoleConfig> {
  const key = getKey() ?? '';
  if (config?.key !== key) {
    const value = api<ConsoleConfig>('/api/console/config').catch((e: unknown) => {
      if (config?.value === value) config = null;
      return Promise.reject(e);
    });
    config = { key, value };
  }
  return config.value;
}
