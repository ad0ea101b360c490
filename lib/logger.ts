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
  return pino(
    { name, level, redact: { paths: REDACT_PATHS, censor: '[redacted]' }, hooks: { streamWrite: scrubUrl } },
    pino.destination({ dest: 1, sync: false }),
  );
}

/** Query parameters whose values are credentials. */
const SECRET_PARAMS = /([?&](?:api_key|apikey|access_token|token|key|sig|signature|secret|password)=)[^&#\s"]*/gi;
/** A signed file URL's path: its last segment is the token that grants the file (api/routes/files.ts). */
const SIGNED_FILE_PATH = /(\/api\/files\/)[^/?#\s"\\]+/g;

/**
 * `text` (a URL, or a whole log line) without the secrets that ride in URLs: a signed file URL's
 * token and credential query parameters (api_key, token, …). Every logger of the platform runs
 * each line through it (pino's streamWrite hook), so a URL logged anywhere, in any field or
 * message, is scrubbed.
 */
export function scrubUrl(text: string): string {
  return text.replace(SIGNED_FILE_PATH, '$1[redacted]').replace(SECRET_PARAMS, '$1[redacted]');
}

export type { Logger };
