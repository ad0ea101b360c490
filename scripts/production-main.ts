import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { bootstrapApiKey, loadConfigOrExit, PROJECT_ROOT, requireBootstrapKey, resolveHostToken } from '../config';
import { startProductionStack, type ProductionStack } from './production';

/**
 * `npm run start:production` (or `STACK_PROFILE=production npm start`): the production layout on this
 * machine in the foreground (scripts/production.ts). State in <DATA_DIR>/production survives for the
 * next start; Ctrl-C or SIGTERM stops every process (and the sandboxes).
 */
export async function main(): Promise<void> {
  const cfg = loadConfigOrExit();
  // The profile's servers (PostgreSQL, the Temporal server, temporal-sql-tool, the UI server): built
  // the first time they are needed, here (about ten minutes on 2 cores), not by npm start's toolchain.
  const toolchain = spawnSync('bash', [path.join(PROJECT_ROOT, 'scripts', 'toolchain-production.sh')], { stdio: 'inherit' });
  if (toolchain.status !== 0) process.exit(1);
  const dataDir = path.join(cfg.DATA_DIR, 'production');
  const apiKey = requireBootstrapKey(bootstrapApiKey(cfg), cfg.NODE_ENV);
  const port = (url: string) => Number(new URL(url.includes('://') ? url : `x://${url}`).port);
  // eslint-disable-next-line prefer-const -- set once the profile has started; stop() may run before that
  let prod: ProductionStack | undefined;
  let stopping = false;
  const stop = async (code = 0) => {
    if (stopping) return;
    stopping = true;
    process.stdout.write('\nstopping…\n');
    await prod?.stop({ destroySandboxes: process.env.KEEP_SANDBOXES !== '1' });
    process.stdout.write('stopped\n');
    process.exit(code);
  };
  process.on('SIGINT', () => void stop());
  process.on('SIGTERM', () => void stop());
  process.stdout.write(`starting the production profile (state in ${dataDir})…\n`);
  const env = process.env;
  prod = await startProductionStack({
    dataDir,
    apiKey,
    hostToken: resolveHostToken({ ...cfg, DATA_DIR: dataDir }),
    apiPorts: [cfg.PORT, Number(env.API2_PORT ?? cfg.PORT + 1)],
    temporalPort: port(cfg.TEMPORAL_ADDRESS),
    mongoPort: port(cfg.MONGO_URL) || 27017,
    uiPort: Number(env.TEMPORAL_UI_PORT ?? 8233),
    // Each host gets half of SANDBOX_NET_CIDR and its own id range (docs/operations/production.md).
    net: { name: env.SANDBOX_NET_NAME ?? 'sapp', cidr: env.SANDBOX_NET_CIDR ?? '100.96.0.0/20', idBase: Number(env.SANDBOX_ID_BASE ?? 2 ** 31) },
    supervise: true,
    log: (line) => process.stderr.write(`\x1b[31msupervisor\x1b[0m ${line}\n`),
    echo: (name, line) => {
      if (!stopping) process.stdout.write(`${name.padEnd(7)} ${line}\n`);
    },
  });
  const s = prod.stack;
  process.stdout.write(
    [
      '',
      'Sandbox Agent Platform (production profile) is up.',
      `  APIs         ${prod.apiUrls.join('  ')}   (the same service twice: spread calls over both)`,
      `  Temporal UI  ${prod.uiUrl}   (Temporal's UI server)`,
      `  Temporal     ${prod.temporalAddress}   (temporal-server 1.32.0 on PostgreSQL, 4 history shards)`,
      `  MongoDB      ${prod.mongoUrl}   (FerretDB on PostgreSQL)`,
      `  PostgreSQL   127.0.0.1:${prod.postgres.port}   user ${prod.postgres.user}, password in ${dataDir}/postgres.password; cluster ${prod.postgres.dataDir}`,
      `  Hosts        ${s.hostList.map((h) => `${h.hostId} ${h.url}`).join(', ')}`,
      `  API key      ${apiKey}   (organisation "default"; send it as X-API-Key)`,
      `  Logs         ${s.logDir}`,
      'Press Ctrl-C to stop.',
      '',
    ].join('\n') + '\n',
  );
}

if (require.main === module)
  main().catch((err) => {
    process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  });
