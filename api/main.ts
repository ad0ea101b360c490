import { Client, Connection } from '@temporalio/client';
import { bootstrapApiKey, loadConfigOrExit } from '../config';
import { createLogger } from '../lib/logger';
import { connectStore } from '../store';
import { ensureApiKey, orgOfWorkflowId } from '../store/orgs';
import { dataConverterOf, payloadCodecOf } from '../lib/payload-codec';
import { createApiServer } from './server';
import { HostDirectory } from '../services/hosts';
import { resolveHostToken, resolveSecretBox } from '../config';
import { listUnlistedAgents, sealLegacyAgentEnvs } from '../store/agents';
import { listUnlistedBatches } from '../store/batches';
import { listUnlistedSandboxes } from '../store/sandboxes';
import { listUnlistedSessions } from '../store/sessions';

/** The API process: validates configuration, connects, listens, and shuts down on SIGTERM. */
async function main(): Promise<void> {
  const cfg = loadConfigOrExit();
  const logger = createLogger('api', cfg.LOG_LEVEL);
  const store = await connectStore(cfg.MONGO_URL);
  const key = bootstrapApiKey(cfg);
  if (key) await ensureApiKey(store, 'default', key);
  const secrets = resolveSecretBox(cfg);
  // Temporal payloads per organisation (PAYLOAD_ENCRYPTION): what this client sends is encrypted, what it reads decrypted.
  const codec = payloadCodecOf(cfg, secrets, (id) => orgOfWorkflowId(store, id));
  const connection = await Connection.connect({ address: cfg.TEMPORAL_ADDRESS });
  const temporal = new Client({ connection, namespace: cfg.TEMPORAL_NAMESPACE, ...dataConverterOf(codec) });
  const hosts = new HostDirectory(store, resolveHostToken(cfg), cfg.HOST_DEAD_AFTER * 1000);
  // Agents written before env values were sealed: sealed now, so MongoDB holds no value.
  const sealed = await sealLegacyAgentEnvs(store, secrets);
  if (sealed > 0) logger.info({ agents: sealed }, 'sealed the env values of agents written before they were sealed');
  // Sessions stored before they were listed by key (store/listing.ts): listed now, once.
  const listed = await listUnlistedSessions(store);
  if (listed > 0) logger.info({ sessions: listed }, 'listed the sessions stored before sessions were listed by key');
  // So are agents, batches and live sandboxes.
  const more = { agents: await listUnlistedAgents(store), batches: await listUnlistedBatches(store), sandboxes: await listUnlistedSandboxes(store) };
  if (more.agents + more.batches + more.sandboxes > 0) logger.info(more, 'listed the agents, batches and live sandboxes stored before they were listed by key');
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
