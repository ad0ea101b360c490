import { Client, Connection } from '@temporalio/client';
import { bootstrapApiKey, loadConfigOrExit } from '../config';
import { createLogger } from '../lib/logger';
import { dataConverterOf, payloadCodecOf } from '../lib/payload-codec';
import { createApiServer } from './server';
import { HostDirectory } from '../services/hosts/hosts';
import { resolveHostToken, resolveSecretBox } from '../config';
import { migrateOnStart, openApiStore, workflowOrgLookup } from '../services/ops/startup';

/** The API process: validates configuration, connects, listens, and shuts down on SIGTERM. */
async function main(): Promise<void> {
  const cfg = loadConfigOrExit();
  const logger = createLogger('api', cfg.LOG_LEVEL);
  const store = await openApiStore(cfg.MONGO_URL, bootstrapApiKey(cfg));
  const secrets = resolveSecretBox(cfg);
  // Temporal payloads per organisation (PAYLOAD_ENCRYPTION): what this client sends is encrypted, what it reads decrypted.
  const codec = payloadCodecOf(cfg, secrets, workflowOrgLookup(store));
  const connection = await Connection.connect({ address: cfg.TEMPORAL_ADDRESS });
  const temporal = new Client({ connection, namespace: cfg.TEMPORAL_NAMESPACE, ...dataConverterOf(codec) });
  const hosts = new HostDirectory(store, resolveHostToken(cfg), cfg.HOST_DEAD_AFTER * 1000);
  await migrateOnStart(store, secrets, logger);
  const { server, previewServer } = createApiServer({ cfg, store, temporal, logger, hosts, secrets, codec });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(cfg.PORT, cfg.HOST, resolve);
  });
  logger.info({ url: `http://${cfg.HOST}:${cfg.PORT}` }, 'api listening');
  if (previewServer && cfg.PREVIEW_PORT) {
    await new Promise<void>((resolve, reject) => {
      previewServer.once('error', reject);
      previewServer.listen(cfg.PREVIEW_PORT, cfg.HOST, resolve);
    });
    logger.info({ url: `http://${cfg.HOST}:${cfg.PREVIEW_PORT}` }, 'preview proxy listening');
  }

  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, 'api stopping');
    server.close();
    server.closeAllConnections();
    previewServer?.close();
    previewServer?.closeAllConnections();
    await Promise.allSettled([store.close(), connection.close()]);
    process.exit(0);
  };
  process.on('SIGTERM', () => void stop('SIGTERM'));
  process.on('SIGINT', () => void stop('SIGINT'));
}

main().catch((err) => {
  process.stderr.write(`api: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
