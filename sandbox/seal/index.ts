/**
 * Sealed secrets on the sandbox host (docs/sealed-secrets.md): placeholders made at create, the CA
 * and the egress proxy started with the host (SANDBOX_SEAL=off leaves them out).
 */
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'pino';
import { MAX_SEALED_PER_SANDBOX, normaliseAllowedHost, normaliseInjectInto, PLACEHOLDER_PREFIX } from '../../contract/sealed';
import type { CreateSandboxRequest } from '../host-contract/types';
import type { SecretBox } from '../../lib/secret-box';
import { SandboxError } from '../../contract/errors';
import type { SandboxNetwork } from '../network';
import { SealCa, TRUST_ENV } from './ca';
import { sealedContext, SealProxy, type SealedEntry } from './proxy';

export { sealedContext, SealProxy, type SealedEntry };

/** Default port of the proxy on the host (SANDBOX_SEAL_PORT); sandboxes reach it only through the table's redirect. */
export const DEFAULT_SEAL_PORT = 10080;

/**
 * The sandbox's sealed secrets: a placeholder each (random, so unique per sandbox and secret), its
 * value sealed with the host's key; and the env that goes with them (placeholders, trust variables
 * the caller did not set).
 */
export function sealSecrets(
  id: string,
  specs: NonNullable<CreateSandboxRequest['sealedSecrets']>,
  envs: Record<string, string>,
  box: SecretBox,
): { entries: SealedEntry[]; env: Record<string, string> } {
  if (specs.length > MAX_SEALED_PER_SANDBOX) throw new SandboxError('invalid_request', `at most ${MAX_SEALED_PER_SANDBOX} sealed secrets per sandbox`);
  const env: Record<string, string> = {};
  const entries: SealedEntry[] = [];
  for (const s of specs) {
    let hosts: string[];
    let inject: string[] | undefined;
    try {
      hosts = s.allowedHosts.map(normaliseAllowedHost);
      inject = s.injectInto?.length ? [...new Set(s.injectInto.map(normaliseInjectInto))] : undefined;
    } catch (err) {
      throw new SandboxError('invalid_request', `sealedSecrets ${s.name}: ${(err as Error).message}`);
    }
    const placeholder = `${PLACEHOLDER_PREFIX}${randomBytes(16).toString('hex')}`;
    entries.push({ placeholder, name: s.name, hosts, ...(inject ? { inject } : {}), box: box.seal(s.value, sealedContext(id, placeholder)) });
    env[s.name] = placeholder;
  }
  if (entries.length) for (const [k, v] of Object.entries(TRUST_ENV)) if (envs[k] === undefined) env[k] = v;
  return { entries, env };
}

/**
 * A create's env and sealed secrets (state fields): a respawn's as they were kept, else new
 * placeholders for `sealedSecrets` (the env gets them, the host keeps the values).
 */
export function sealedOf(req: CreateSandboxRequest, box: SecretBox): { envs: Record<string, string>; sealed?: SealedEntry[] } {
  const { entries, env } = req.restoredSealed?.length
    ? { entries: req.restoredSealed, env: {} }
    : sealSecrets(req.id, req.sealedSecrets ?? [], req.envs ?? {}, box);
  return { envs: { ...req.envs, ...env }, ...(entries.length ? { sealed: entries } : {}) };
}

/** Makes (or reads) the host's CA, puts it into the sandboxes' base `/etc/ssl`, starts the proxy and puts it into the network's path. */
export async function startSealing(
  network: SandboxNetwork,
  o: { dataDir: string; baseDir: string; hostLabel: string; env: NodeJS.ProcessEnv; log: Logger },
): Promise<SealProxy | null> {
  if (/^(off|0|false|no)$/i.test(o.env.SANDBOX_SEAL ?? '')) return null;
  const port = o.env.SANDBOX_SEAL_PORT ? Number(o.env.SANDBOX_SEAL_PORT) : DEFAULT_SEAL_PORT;
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new Error(`SANDBOX_SEAL_PORT must be a port number: ${o.env.SANDBOX_SEAL_PORT}`);
  const ca = new SealCa(path.join(o.dataDir, 'seal'));
  await ca.init(o.hostLabel);
  await ca.install(o.baseDir);
  const extraTrust = o.env.SANDBOX_SEAL_TRUST_FILE ? [await fsp.readFile(o.env.SANDBOX_SEAL_TRUST_FILE, 'utf8')] : [];
  const proxy = new SealProxy({
    port,
    address: await network.serviceAddress(),
    ca,
    extraTrust,
    reachable: (source, ip) => network.proxyReachable(source, ip),
    steer: (source, addresses, seconds) => network.steer(source, addresses, seconds),
    log: o.log,
  });
  await proxy.start();
  network.attachSeal(proxy, port);
  o.log.info({ port, ca: path.join(o.dataDir, 'seal', 'ca.pem') }, 'sealed secrets proxy ready');
  return proxy;
}
