import type { Request, Response } from 'express';
import type { Authenticator, OrgContext } from './auth';
import { ApiError } from '../contract/errors';
import type { ExecSessionState } from '../services/exec/exec';
import type { ExecStreamOut } from '../services/exec/exec-stream';
import { sse } from './sse';

/*
 * `POST /api/sandboxes/:id/exec` with `Accept: text/event-stream`: the start's answer is the
 * session's stream, as server-sent events (`event:` and one `data:` line of JSON each):
 *
 *   session  the exec session, as the JSON answer gives it (first, once)
 *   stdout   {"data": text}    output as it comes (UTF-8; a character is never split)
 *   stderr   {"data": text}
 *   exit     {"exitCode": n, "oomKilled"?: true}   the last event when the command exits
 *   error    {"error": {"type", "message"}}         the last event when the stream ends without an exit
 *
 * A comment line (`: keepalive`) every 15 s keeps proxies from closing a quiet stream (./sse.ts).
 * A caller that leaves counts as a client that detached (`maxRunAfterDisconnect`); a revoked key's
 * stream ends with an `error` event, as its WebSockets are closed.
 */

/** How long the end of a stream may take to reach its caller before the connection is dropped. */
const END_GRACE_MS = 30_000;

/** Whether the caller asked for the stream (`text/event-stream` preferred over JSON). */
export function wantsEventStream(req: Request): boolean {
  return (req.headers.accept ?? '').includes('text/event-stream') && req.accepts(['application/json', 'text/event-stream']) === 'text/event-stream';
}

/** Writes a started session's events on `res` until it exits, the caller leaves, or its key is revoked. */
export async function writeExecEvents(
  req: Request,
  res: Response,
  auth: Authenticator,
  org: OrgContext,
  session: ExecSessionState,
  pipe: (out: ExecStreamOut) => Promise<void>,
): Promise<void> {
  const gone = new AbortController();
  const leave = () => gone.abort();
  res.on('close', leave);
  // The headers go with the first event: one write to the first byte.
  const events = sse(res, { status: 201, flush: false });
  events.send('session', session);
  let ended = false;
  const end = (last: Parameters<ExecStreamOut['end']>[0]) => {
    if (ended) return;
    ended = true;
    if ('exit' in last) events.send('exit', last.exit);
    else events.send('error', { error: { type: last.error.type, message: last.error.message } });
    events.end();
    // What is left to write is at most one chunk past the answer's mark (reading stops there), so a
    // caller that has not taken it in END_GRACE_MS reads nothing: the connection goes with its buffers.
    const grace = setTimeout(() => res.destroy(), END_GRACE_MS);
    grace.unref();
    res.once('close', () => clearTimeout(grace));
  };
  const unwatch = auth.watch(req, org, () => {
    end({ error: new ApiError('unauthorized', 'the API key was revoked') });
    gone.abort();
  });
  try {
    await pipe({
      output: (stream, data) => events.send(stream, { data }),
      drained: () =>
        new Promise<void>((resolve) => {
          const done = () => {
            res.off('drain', done);
            res.off('close', done);
            resolve();
          };
          res.on('drain', done);
          res.on('close', done);
        }),
      end,
      signal: gone.signal,
    });
  } finally {
    unwatch();
    res.off('close', leave);
    events.end();
  }
}
