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

/**
 * A JSON logger for one process (`api`, `worker`, `host`, `stack`) on stdout. Lines are written
 * asynchronously (lines logged while a write is under way go out together in the next one, so a
 * busy process makes fewer system calls) and flushed when the process exits.
 */
export function createLogger(name: string, level = process.env.LOG_LEVEL ?? 'info'): Logger {
  return pino({ name, level, redact: { paths: REDACT_PATHS, censor: '[redacted]' } }, pino.destination({ dest: 1, sync: false }));
}

/** The request URL without secrets that may ride in the query string (api_key, token). */
export function scrubUrl(url: string): string {
  return url.replace(/([?&](?:api_key|token|key)=)[^&]*/gi, '$1[redacted]');
}

export type { Logger };
