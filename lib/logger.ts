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

/** Query parameters whose values are credentials (names compared after percent-decoding, case-insensitively). */
const SECRET_PARAM_NAMES = new Set(['api_key', 'apikey', 'access_token', 'token', 'key', 'sig', 'signature', 'secret', 'password']);
/** One query parameter in a text: its separator, its name as written, and its value (up to the next & # space or quote). */
const QUERY_PARAM = /([?&])([^=&#?\s"\\]+)=([^&#\s"]*)/g;
/** A signed file URL's path: its last segment is the token that grants the file (api/routes/files.ts). */
const SIGNED_FILE_PATH = /(\/api\/files\/)[^/?#\s"\\]+/g;

/**
 * A query parameter's name as a server reads it: `+` as a space and percent-escapes decoded, again
 * while that changes it (a few rounds), so `api%5Fkey`, `%61pi_key` and `api%255Fkey` all read `api_key`.
 * A malformed escape is left as written (as Node's querystring does).
 */
export function decodeParamName(name: string): string {
  let out = name.replace(/\+/g, ' ');
  for (let i = 0; i < 4 && out.includes('%'); i++) {
    const next = out.replace(/%([0-9a-f]{2})/gi, (_m, hex: string) => String.fromCharCode(parseInt(hex, 16)));
    if (next === out) break;
    out = next;
  }
  return out.toLowerCase();
}

/**
 * `text` (a URL, or a whole log line) without the secrets that ride in URLs: a signed file URL's
 * token and credential query parameters (api_key, token, …), whatever percent-encoding spells their
 * name (a server decodes `api%5Fkey` to `api_key` before it reads it, so the scrub decodes too). Every
 * logger of the platform runs each line through it (pino's streamWrite hook), so a URL logged
 * anywhere, in any field or message, is scrubbed.
 */
export function scrubUrl(text: string): string {
  return text
    .replace(SIGNED_FILE_PATH, '$1[redacted]')
    .replace(QUERY_PARAM, (whole, sep: string, name: string) => (SECRET_PARAM_NAMES.has(decodeParamName(name)) ? `${sep}${name}=[redacted]` : whole));
}

export type { Logger };
