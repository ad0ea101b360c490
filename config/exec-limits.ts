/**
 * Limits on exec: what one `exec/run` answer may hold, how many exec sessions may run, how many
 * clients may attach to one, and how far behind an attached client may fall. One module for the
 * API (config/index.ts spreads the shape) and the sandbox host (sandbox/host/main.ts, server.ts).
 *
 * | variable                    | default | read by | what                                                       |
 * |-----------------------------|---------|---------|------------------------------------------------------------|
 * | EXEC_RUN_OUTPUT_MAX_BYTES   | 1 MiB   | host    | bytes of stdout and of stderr an exec/run answer keeps (the rest dropped, `truncated: true`) |
 * | EXEC_SESSIONS_PER_SANDBOX   | 32      | host    | running exec sessions (agent runners included) per sandbox |
 * | EXEC_SESSIONS_PER_ORG       | 256     | API     | running exec sessions per organisation (counted from the store, checked against the hosts) |
 * | EXEC_ATTACHES_PER_SESSION   | 8       | host    | WebSocket clients attached to one exec session at once      |
 * | EXEC_WS_BACKLOG_MAX_BYTES   | 8 MiB   | both    | unsent bytes queued toward one attached client before it is disconnected |
 * | EXEC_WS_STALL_SECONDS       | 30      | API     | how long a client that reads nothing may hold its stream paused (backpressure) before it is disconnected |
 *
 * Over a count the request answers 429 `rate_limited`; a client over the backlog or stall bound is
 * closed with code 1008 and a reason.
 */
import { z } from 'zod';

const count = (max: number) => z.coerce.number().int().min(1).max(max);

export const execLimitsEnvShape = {
  EXEC_RUN_OUTPUT_MAX_BYTES: z.coerce
    .number()
    .int()
    .min(1024)
    .max(256 * 1024 * 1024)
    .default(1024 * 1024),
  EXEC_SESSIONS_PER_SANDBOX: count(100_000).default(32),
  EXEC_SESSIONS_PER_ORG: count(10_000_000).default(256),
  EXEC_ATTACHES_PER_SESSION: count(10_000).default(8),
  EXEC_WS_BACKLOG_MAX_BYTES: z.coerce
    .number()
    .int()
    .min(64 * 1024)
    .max(1024 * 1024 * 1024)
    .default(8 * 1024 * 1024),
  EXEC_WS_STALL_SECONDS: z.coerce
    .number()
    .min(0.1)
    .max(24 * 3600)
    .default(30),
};

export type ExecLimits = { [K in keyof typeof execLimitsEnvShape]: number };

/** The limits from an environment (absent ones take their defaults). Throws an Error naming every bad variable. */
export function loadExecLimits(env: NodeJS.ProcessEnv = process.env): ExecLimits {
  const parsed = z.object(execLimitsEnvShape).safeParse(env);
  if (!parsed.success) throw new Error(parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; '));
  return parsed.data;
}
