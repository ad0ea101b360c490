import path from 'node:path';
import { z } from 'zod';
import { limitsEnvShape, resolveLimits, type SandboxLimits } from './limits';
import { execLimitsEnvShape } from './exec-limits';
import { parseSecretsKey, SecretBox } from '../lib/secret-box';
import { validCidrList } from '../services/webhooks/webhook-target';

/** Directory of this checkout: the nearest parent holding package.json (from source or dist/). */
export const PROJECT_ROOT = ((): string => {
  const fs = require('node:fs') as typeof import('node:fs');
  let dir = __dirname;
  while (!fs.existsSync(path.join(dir, 'package.json')) && path.dirname(dir) !== dir) dir = path.dirname(dir);
  return dir;
})();

const port = z.coerce.number().int().min(1).max(65535);
const nonEmpty = z.string().trim().min(1);

/** Every setting the processes read, with local defaults. Parsed once at start. */
/**
 * SANDBOX_PROVIDER: `namespaces` (the default: the project's own helpers isolate each sandbox) or
 * `process` (no isolation, development only). `bwrap`, the old name of `namespaces`, is still
 * accepted and means `namespaces` (see sandboxProviderWarning).
 */
export const sandboxProviderSetting = z
  .enum(['namespaces', 'process', 'bwrap'])
  .default('namespaces')
  .transform((v): 'namespaces' | 'process' => (v === 'bwrap' ? 'namespaces' : v));

/** The one warning an entry point logs at start when SANDBOX_PROVIDER has its old name; undefined otherwise. */
export function sandboxProviderWarning(env: NodeJS.ProcessEnv = process.env): string | undefined {
  return env.SANDBOX_PROVIDER === 'bwrap' ? 'SANDBOX_PROVIDER=bwrap is the old name of namespaces' : undefined;
}

export const configSchema = z.object({
  NODE_ENV: z.enum(['development', 'production', 'test']).default('development'),
  PORT: port.default(8080),
  HOST: nonEmpty.default('127.0.0.1'),
  API_KEY: z.string().min(1).max(200).optional(),
  MONGO_URL: z.url({ protocol: /^mongodb(\+srv)?$/ }).default('mongodb://127.0.0.1:27017/sap'),
  TEMPORAL_ADDRESS: z
    .string()
    .regex(/^[^:\s]+:\d+$/, 'must be host:port')
    .default('127.0.0.1:7233'),
  TEMPORAL_NAMESPACE: nonEmpty.default('default'),
  TASK_QUEUE: nonEmpty.regex(/^[\w.-]+$/, 'letters, digits, _ . - only').default('sandbox-agents'),
  PREVIEW_DOMAIN: nonEmpty.regex(/^[a-z0-9.-]+(:\d+)?$/i, 'must be a domain name').default('preview.localhost'),
  /** A second port on which only the preview proxy listens (previews are always served on PORT too). */
  PREVIEW_PORT: port.optional(),
  /**
   * How the preview proxy reaches a sandbox port: `auto` (the host's Unix socket when the host is on
   * this machine, else a tunnel through the host's HTTP port), `tcp` (always the tunnel), `unix` (always the socket).
   */
  PREVIEW_TRANSPORT: z.enum(['auto', 'tcp', 'unix']).default('auto'),
  /** Set when a TLS-terminating front serves *.PREVIEW_DOMAIN over HTTPS: previews then report sslStatus `active`. */
  PREVIEW_TLS: z
    .enum(['true', 'false', '1', '0'])
    .default('false')
    .transform((v) => v === 'true' || v === '1'),
  /** Default per-organisation capacity reservation limit, per 15-minute interval (OrgDoc.settings.reservationLimitGb overrides it). */
  RESERVATION_LIMIT_GB: z.coerce.number().int().min(0).default(64),
  /**
   * Default per-organisation storage quota for checkpoints and snapshots, in MiB of their layers
   * (OrgDoc.settings.storageQuotaMB overrides it). 0: unlimited.
   */
  ORG_STORAGE_QUOTA_MB: z.coerce.number().int().min(0).default(10_240),
  DATA_DIR: nonEmpty.default(path.join(PROJECT_ROOT, '.data')),
  SANDBOX_PROVIDER: sandboxProviderSetting,
  /** npm start: how many sandbox hosts (each with its worker) to run on this machine. */
  SANDBOX_HOSTS: z.coerce.number().int().min(1).max(16).default(1),
  /**
   * Who sandboxes' processes run as when a create does not say (`user`): root, or sandbox (uid 1000,
   * passwordless sudo; docs/isolation.md). Unset: sandbox for POST /api/sandboxes (OpenComputer's
   * convention), root for agents' sandboxes (sessions, instances).
   */
  SANDBOX_USER: z.enum(['root', 'sandbox']).optional(),
  HOST_ID: nonEmpty.regex(/^[\w.-]+$/, 'letters, digits, _ . - only').optional(),
  HOST_LISTEN: z
    .string()
    .regex(/^[^:\s]+:\d+$/, 'must be host:port')
    .default('127.0.0.1:7300'),
  HOST_TOKEN: z.string().min(16, 'must be at least 16 characters').optional(),
  /**
   * PostgreSQL's password of the production layout (docker-compose.yml passes it to the APIs). The
   * platform does not connect with it: it is read only to refuse its published default outside development.
   */
  POSTGRES_PASSWORD: z.string().optional(),
  /** The host's address as the other machines reach it (APIs, other hosts); default http://HOST_LISTEN. */
  HOST_URL: z.url({ protocol: /^https?$/ }).optional(),
  /** A worker reports its host's liveness and load this often (ms). */
  HOST_HEARTBEAT_MS: z.coerce.number().int().min(200).max(60_000).default(2_000),
  /** A host not heard of for this many seconds is dead: nothing new goes to it, and what ran on it is written off. */
  HOST_DEAD_AFTER: z.coerce.number().min(1).max(3_600).default(15),
  /**
   * Key that encrypts secret-store values at rest (AES-256-GCM): 64 hex digits or base64 of 32 bytes.
   * Unset: one is generated once into DATA_DIR/secrets.key (mode 0600). Every API and worker process
   * must see the same key.
   */
  SECRETS_KEY: z
    .string()
    .refine((v) => parseSecretsKey(v) !== null, 'must be 64 hex digits or base64 of 32 bytes')
    .optional(),
  /**
   * The API's address as its users reach it (e.g. https://sandboxes.example.com), for the signed file
   * URLs it hands out. Unset: taken from each request (X-Forwarded-Proto/-Host when a proxy sets them, else Host).
   */
  PUBLIC_API_URL: z.url({ protocol: /^https?$/ }).optional(),
  /** The Temporal Web UI's address (e.g. http://127.0.0.1:8233), for the console's links to a session's workflow; unset: no link. */
  TEMPORAL_UI_URL: z.url({ protocol: /^https?$/ }).optional(),
  RESULT_MAX_BYTES: z.coerce
    .number()
    .int()
    .positive()
    .default(4 * 1024 * 1024),
  /** The last this-many bytes of a session's stdout and of its stderr are kept (session logs). */
  SESSION_LOG_MAX_BYTES: z.coerce
    .number()
    .int()
    .min(0)
    .max(8 * 1024 * 1024)
    .default(1024 * 1024),
  /**
   * How long the API keeps a key's lookup (ms): a revoked key keeps working for at most this long,
   * and the WebSockets it opened are closed within this plus 5 s. Shorter: more store reads.
   */
  API_KEY_CACHE_MS: z.coerce.number().int().min(100).max(600_000).default(30_000),
  /** Webhook deliveries: first retry after this, doubling up to the maximum interval, for this many hours. */
  WEBHOOK_RETRY_INITIAL_MS: z.coerce.number().int().min(10).default(10_000),
  WEBHOOK_RETRY_MAX_INTERVAL_MS: z.coerce.number().int().min(10).default(3_600_000),
  WEBHOOK_MAX_HOURS: z.coerce
    .number()
    .min(0.001)
    .max(24 * 30)
    .default(24),
  /**
   * CIDR ranges (comma- or space-separated) that webhooks may reach although they are loopback,
   * private, link-local, … (refused by default: services/webhooks/webhook-target.ts), e.g. an on-premise receiver's
   * `10.1.2.0/24`. Empty: public addresses only.
   */
  WEBHOOK_ALLOWED_CIDRS: z.string().trim().default('').refine(validCidrList, 'must be CIDR ranges separated by commas, e.g. 10.1.2.0/24,fd00::/8'),
  /** One delivery attempt (resolving, connecting, sending, reading the answer) ends within this (ms). */
  WEBHOOK_TIMEOUT_MS: z.coerce.number().int().min(100).max(300_000).default(10_000),
  /** At most this much of a receiver's answer is read (bytes); the rest is dropped with the connection. */
  WEBHOOK_ANSWER_MAX_BYTES: z.coerce
    .number()
    .int()
    .min(0)
    .max(1024 * 1024)
    .default(4096),
  /** The API resolves a webhook URL's name for at most this long when it is given (ms); a name not resolved in time is checked at delivery only. */
  WEBHOOK_RESOLVE_TIMEOUT_MS: z.coerce.number().int().min(0).max(30_000).default(2_000),
  BODY_LIMIT_BYTES: z.coerce
    .number()
    .int()
    .positive()
    .default(8 * 1024 * 1024),
  /**
   * Temporal payloads encrypted per organisation (lib/payload-codec.ts; docs/threat-model.md): `on`
   * encrypts what the API and the workers send Temporal; both must agree. Reading stays possible either
   * way (a process with the codec decodes what it finds encrypted, and passes plain payloads through).
   */
  PAYLOAD_ENCRYPTION: z.enum(['on', 'off']).default('off'),
  /** The id of the data keys new payloads get (rotation: docs/threat-model.md). */
  PAYLOAD_KEY_ID: z
    .string()
    .regex(/^[\w.-]{1,32}$/, 'must be 1-32 letters, digits, _ . -')
    .default('k1'),
  /** Origins allowed to call the codec endpoint from a browser (the Temporal UI's), comma-separated; default: TEMPORAL_UI_URL's origin. */
  CODEC_CORS_ORIGINS: z.string().optional(),
  /**
   * The bearer token GET /metrics of the API asks for (`Authorization: Bearer <token>`; an operator's
   * API key is taken too). Unset: /metrics answers loopback peers only (and operator keys). Its
   * counters are every organisation's together: docs/operations/observability.md.
   */
  METRICS_TOKEN: z.string().min(16, 'must be at least 16 characters').max(200).optional(),
  /** The worker's Prometheus endpoint (GET /metrics); the Temporal SDK's exporter takes the next port. 0: off. */
  WORKER_METRICS_PORT: z.coerce.number().int().min(0).max(65534).default(9464),
  /** At most this many running sandboxes per host get sap_sandbox_* gauges (the largest memory users); 0: none. */
  SANDBOX_METRICS_MAX: z.coerce.number().int().min(0).max(1000).default(50),
  /**
   * /readyz counts a worker as gone once Temporal has seen neither a poll nor a heartbeat from it for
   * this long; workers heartbeat every third of it (1-60 s).
   */
  READY_WORKER_MAX_AGE_MS: z.coerce.number().int().min(3_000).max(600_000).default(12_000),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  /** Sandbox resource defaults and maxima (SANDBOX_MEMORY_MB, …): see config/limits.ts. */
  ...limitsEnvShape,
  ...execLimitsEnvShape,
});

export type Config = z.infer<typeof configSchema> & {
  /** The sandbox limits resolved from the SANDBOX_* variables (defaults filled in). */
  limits: SandboxLimits;
};

/** Thrown when the environment holds a bad value; the message names each variable. */
export class ConfigError extends Error {
  override name = 'ConfigError';
}

/**
 * Reads and validates the environment once. Throws ConfigError naming every bad variable.
 */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const parsed = configSchema.safeParse(env);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) => `  ${i.path.join('.')}: ${i.message}`);
    throw new ConfigError(`invalid configuration:\n${lines.join('\n')}`);
  }
  const cfg = parsed.data;
  const defaults = defaultSecretIssues(cfg);
  if (defaults.length) throw new ConfigError(`invalid configuration:\n${defaults.map((l) => `  ${l}`).join('\n')}`);
  const { limits, issues } = resolveLimits(cfg);
  if (issues.length) throw new ConfigError(`invalid configuration:\n${issues.map((i) => `  ${i.variable}: ${i.message}`).join('\n')}`);
  return { ...cfg, DATA_DIR: path.resolve(cfg.DATA_DIR), limits };
}

/**
 * The secrets whose values are published (docker-compose.yml's defaults, the development key): fine
 * on a development machine, refused anywhere else, where anyone who read the repository would hold them.
 */
export const PUBLISHED_DEFAULT_SECRETS = {
  API_KEY: 'dev-key',
  HOST_TOKEN: 'change-me-host-token',
  POSTGRES_PASSWORD: 'change-me-postgres',
} as const;

/**
 * One line per secret that holds its published default while NODE_ENV is not `development` (the dev
 * profile): production and test refuse to start with one (checked once, at start, by loadConfig).
 */
export function defaultSecretIssues(
  cfg: Pick<z.infer<typeof configSchema>, 'NODE_ENV'> & Partial<Record<keyof typeof PUBLISHED_DEFAULT_SECRETS, string>>,
): string[] {
  if (cfg.NODE_ENV === 'development') return [];
  return (Object.keys(PUBLISHED_DEFAULT_SECRETS) as (keyof typeof PUBLISHED_DEFAULT_SECRETS)[])
    .filter((name) => cfg[name] === PUBLISHED_DEFAULT_SECRETS[name])
    .map(
      (name) =>
        `${name}: is the published default '${PUBLISHED_DEFAULT_SECRETS[name]}', refused with NODE_ENV=${cfg.NODE_ENV} (only the development profile, NODE_ENV=development, accepts it): set a secret of your own`,
    );
}

/** loadConfig for a process entry point: prints the problem and exits 2 on a bad value. */
export function loadConfigOrExit(env: NodeJS.ProcessEnv = process.env): Config {
  try {
    return loadConfig(env);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }
}

/** The host's id: HOST_ID or the machine's hostname, made task-queue safe. */
export function hostIdOf(cfg: Config): string {
  return (
    cfg.HOST_ID ??
    require('node:os')
      .hostname()
      .replace(/[^\w.-]/g, '-')
  );
}

/** Where the other processes reach the host beside this worker. */
export function hostUrlOf(cfg: Pick<Config, 'HOST_URL' | 'HOST_LISTEN'>): string {
  return (cfg.HOST_URL ?? `http://${cfg.HOST_LISTEN}`).replace(/\/$/, '');
}

/** Task queue served by the worker beside the sandbox host `hostId`. */
export function hostTaskQueue(cfg: Pick<Config, 'TASK_QUEUE'>, hostId: string): string {
  return `${cfg.TASK_QUEUE}@${hostId}`;
}

/**
 * The secret shared by the sandbox host and its clients: HOST_TOKEN, or one generated once
 * and kept (mode 0600) in DATA_DIR/host.token.
 */
export function resolveHostToken(cfg: Config): string {
  if (cfg.HOST_TOKEN) return cfg.HOST_TOKEN;
  const fs = require('node:fs') as typeof import('node:fs');
  const file = path.join(cfg.DATA_DIR, 'host.token');
  try {
    return fs.readFileSync(file, 'utf8').trim();
  } catch {
    fs.mkdirSync(cfg.DATA_DIR, { recursive: true });
    const token = require('node:crypto').randomBytes(24).toString('hex') as string;
    try {
      fs.writeFileSync(file, token, { mode: 0o600, flag: 'wx' });
      return token;
    } catch {
      return fs.readFileSync(file, 'utf8').trim();
    }
  }
}

/**
 * The box that seals secret-store values: SECRETS_KEY, or a key generated once and kept (mode 0600)
 * in DATA_DIR/secrets.key. The file appears whole or not at all (written aside, then linked into
 * place), so an API and a worker starting together agree on one key.
 */
export function resolveSecretBox(cfg: Pick<Config, 'SECRETS_KEY' | 'DATA_DIR'>): SecretBox {
  if (cfg.SECRETS_KEY) return new SecretBox(parseSecretsKey(cfg.SECRETS_KEY)!);
  const fs = require('node:fs') as typeof import('node:fs');
  const file = path.join(cfg.DATA_DIR, 'secrets.key');
  const read = (): SecretBox => {
    const key = parseSecretsKey(fs.readFileSync(file, 'utf8'));
    if (!key) throw new ConfigError(`${file} does not hold a secrets key (64 hex digits)`);
    return new SecretBox(key);
  };
  try {
    return read();
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  fs.mkdirSync(cfg.DATA_DIR, { recursive: true });
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, (require('node:crypto').randomBytes(32) as Buffer).toString('hex'), { mode: 0o600 });
  try {
    fs.linkSync(tmp, file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  } finally {
    fs.rmSync(tmp, { force: true });
  }
  return read();
}

/** The development key used when API_KEY is unset in development. */
export const DEV_API_KEY = PUBLISHED_DEFAULT_SECRETS.API_KEY;

/**
 * The key of the organisation `default` that the API makes sure exists at start, if any: API_KEY, or
 * the development key in the dev profile (NODE_ENV=development) only.
 */
export function bootstrapApiKey(cfg: Config): string | undefined {
  return cfg.API_KEY ?? (cfg.NODE_ENV === 'development' ? DEV_API_KEY : undefined);
}

/**
 * The key a launcher (npm start, the production profile) hands its API: `key`, or a clear exit when
 * there is none (NODE_ENV other than development has no default key, and the development one is refused there).
 */
export function requireBootstrapKey(key: string | undefined, nodeEnv: string): string {
  if (key) return key;
  process.stderr.write(`API_KEY is unset: NODE_ENV=${nodeEnv} has no default key (only NODE_ENV=development uses ${DEV_API_KEY}); set API_KEY\n`);
  process.exit(2);
}

/** How often a worker sends Temporal its heartbeat: a third of READY_WORKER_MAX_AGE_MS, within the SDK's 1-60 s. */
export function workerHeartbeatMs(cfg: Pick<Config, 'READY_WORKER_MAX_AGE_MS'>): number {
  return Math.min(60_000, Math.max(1_000, Math.floor(cfg.READY_WORKER_MAX_AGE_MS / 3)));
}
