import pino, { Logger } from 'pino';

/** Paths whose values never reach a log line: keys, tokens, secrets. */
export const REDACT_PATHS = [
  'req.headers["x-api-key"]',
  'req.headers.authorization',
  'req.headers["x-preview-token"]',
  'req.headers.cookie',
  '*.apiKey',
  '*.token',
  '*.secret',
  '*.password',
  '*.envs',
  '*.env',
];

/** A JSON logger for one process (`api`, `worker`, `host`, `stack`). */
export function createLogger(name: string, level = process.env.LOG_LEVEL ?? 'info'): Logger {
  return pino({ name, level, redact: { paths: REDACT_PATHS, censor: '[redacted]' } });
}

/** The request URL without secrets that may ride in the query string (api_key, token). */
export function scrubUrl(url: string): string {
  return url.replace(/([?&](?:api_key|token|key)=)[^&]*/gi, '$1[redacted]');
}

export type { Logger };
