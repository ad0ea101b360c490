/**
 * The sandbox host daemon: one per machine, owns every sandbox on it. Configured by environment:
 * DATA_DIR (required), HOST_TOKEN (required), HOST_ID (default hostname), SANDBOX_PROVIDER
 * (namespaces | process, default namespaces; `bwrap` is the old name of namespaces), HOST_LISTEN (default 127.0.0.1:7300), LOG_LEVEL (default info),
 * SANDBOX_SCRATCH_DIR (where sessions' sandboxes keep their files; default /dev/shm when it is a tmpfs, `off`: DATA_DIR),
 * HOST_MAX_SANDBOXES (live sandboxes at most; default one per 64 MB of memory, at least 16),
 * SANDBOX_AUDIT_LOG (the entrypoint audit log; default DATA_DIR/audit/entrypoints.ndjson, `off`: none),
 * SANDBOX_PATH_MAX_DEPTH and SANDBOX_PATH_MAX_BYTES (the files API's paths: at most 256 components,
 * 4096 bytes by default; beyond them 400, see ../paths.ts),
 * SANDBOX_ENTRYPOINT_CLAIM_TIMEOUT_MS (how long an entrypoint's helper may take to claim its start; default 30000),
 * the sandboxes' default limits and maxima (SANDBOX_MEMORY_MB, SANDBOX_MAX_MEMORY_MB, …: config/limits.ts),
 * and exec's limits (EXEC_RUN_OUTPUT_MAX_BYTES, EXEC_SESSIONS_PER_SANDBOX, …: config/exec-limits.ts).
 * SIGTERM/SIGINT stop the HTTP server; sandboxes keep running and are adopted by the next start.
 */
import * as os from 'node:os';
import pino from 'pino';
import { z } from 'zod';
import { configSchema, defaultSecretIssues, sandboxProviderSetting, sandboxProviderWarning } from '../../config';
import { limitsEnvShape, resolveLimits } from '../../config/limits';
import { pathLimits } from '../paths';
import { execLimitsEnvShape, loadExecLimits } from '../../config/exec-limits';
import { REDACT_PATHS, scrubUrl } from '../../lib/logger';
import { startHost } from './server';

const envSchema = z.object({
  DATA_DIR: z.string().min(1),
  HOST_TOKEN: z.string().min(1),
  HOST_ID: z.string().min(1).default(os.hostname()),
  SANDBOX_PROVIDER: sandboxProviderSetting,
  HOST_LISTEN: z.string().default('127.0.0.1:7300'),
  // Where sessions' sandboxes keep their files: unset = /dev/shm when it is a tmpfs, 'off' = DATA_DIR.
  SANDBOX_SCRATCH_DIR: z.string().optional(),
  // One fsync'd line per entrypoint start: a path, or 'off'.
  SANDBOX_AUDIT_LOG: z.string().min(1).optional(),
  // At most this many live sandboxes; default: one per 64 MB of memory, at least 16.
  HOST_MAX_SANDBOXES: z.coerce.number().int().positive().optional(),
  // A path of the files API has at most this many components, and this many bytes (400 beyond).
  SANDBOX_PATH_MAX_DEPTH: z.coerce.number().int().min(1).max(4096).default(256),
  SANDBOX_PATH_MAX_BYTES: z.coerce.number().int().min(1).max(65536).default(4096),
  // How long an entrypoint's helper may take to claim its start before the host cancels it (ms).
  SANDBOX_ENTRYPOINT_CLAIM_TIMEOUT_MS: z.coerce.number().int().positive().optional(),
  LOG_LEVEL: z.enum(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']).default('info'),
  ...limitsEnvShape,
  ...execLimitsEnvShape,
});

async function main(): Promise<void> {
  // The same redaction as every other process's logger (lib/logger.ts): no token in a line.
  const logger = pino(
    {
      level: process.env.LOG_LEVEL ?? 'info',
      base: { svc: 'sandbox-host' },
      redact: { paths: REDACT_PATHS, censor: '[redacted]' },
      hooks: { streamWrite: scrubUrl },
    },
    pino.destination({ dest: 2, sync: false }),
  );
  const parsed = envSchema.safeParse(process.env);
  if (!parsed.success) {
    logger.fatal({ issues: parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`) }, 'invalid environment');
    process.exit(2);
  }
  const env = parsed.data;
  // A published default HOST_TOKEN is refused outside development, as the API and the worker refuse it (config/index.ts).
  const nodeEnv = configSchema.shape.NODE_ENV.safeParse(process.env.NODE_ENV);
  const defaults = defaultSecretIssues({ NODE_ENV: nodeEnv.success ? nodeEnv.data : 'production', HOST_TOKEN: env.HOST_TOKEN });
  if (defaults.length) {
    logger.fatal({ issues: defaults }, 'invalid environment');
    process.exit(2);
  }
  const { limits, issues } = resolveLimits(env);
  if (issues.length) {
    logger.fatal({ issues: issues.map((i) => `${i.variable}: ${i.message}`) }, 'invalid environment');
    process.exit(2);
  }
  logger.level = env.LOG_LEVEL;
  const providerWarning = sandboxProviderWarning(process.env);
  if (providerWarning) logger.warn(providerWarning);
  pathLimits.maxDepth = env.SANDBOX_PATH_MAX_DEPTH;
  pathLimits.maxBytes = env.SANDBOX_PATH_MAX_BYTES;
  const host = await startHost({
    dataDir: env.DATA_DIR,
    token: env.HOST_TOKEN,
    provider: env.SANDBOX_PROVIDER,
    hostId: env.HOST_ID,
    listen: env.HOST_LISTEN,
    scratchDir: env.SANDBOX_SCRATCH_DIR === 'off' ? null : env.SANDBOX_SCRATCH_DIR || undefined,
    limits,
    execLimits: loadExecLimits(process.env),
    logger,
    auditLog: env.SANDBOX_AUDIT_LOG === 'off' ? null : env.SANDBOX_AUDIT_LOG,
    ...(env.HOST_MAX_SANDBOXES ? { maxSandboxes: env.HOST_MAX_SANDBOXES } : {}),
  });
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, 'stopping; sandboxes keep running');
    host.close().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
}

main().catch((err) => {
  process.stderr.write(`sandbox host failed to start: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
