import { freePort } from '../../scripts/launcher';

/**
 * The settings of a stack a test file starts itself (two hosts, the production profile, payload
 * encryption): test logging, no worker metrics port, its own resolver and sealed-secrets proxy ports,
 * and a resolver upstream that never answers. `extra` is added over them.
 */
export async function ownStackEnv(extra: Record<string, string> = {}): Promise<Record<string, string>> {
  return {
    NODE_ENV: 'test',
    LOG_LEVEL: 'info',
    WORKER_METRICS_PORT: '0',
    SANDBOX_DNS_PORT: String(await freePort()),
    SANDBOX_SEAL_PORT: String(await freePort()),
    SANDBOX_DNS: '127.0.0.1:9',
    ...extra,
  };
}
