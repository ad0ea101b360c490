import { bootstrapApiKey, loadConfigOrExit, requireBootstrapKey, resolveHostToken, sandboxProviderWarning } from '../config';
import { startStack, Stack } from './launcher';

/**
 * `npm start`: the whole local stack in the foreground. Ctrl-C stops every process (and the
 * sandboxes); state in DATA_DIR survives for the next start.
 */
async function main(): Promise<void> {
  // STACK_PROFILE=production: the production layout instead (scripts/production-main.ts).
  if (process.env.STACK_PROFILE === 'production') return (await import('./production-main')).main();
  const cfg = loadConfigOrExit();
  // The stack's processes get the new name; the old one is reported here once.
  const providerWarning = sandboxProviderWarning();
  if (providerWarning) process.stderr.write(`warning: ${providerWarning}\n`);
  const [tHost, tPort] = cfg.TEMPORAL_ADDRESS.split(':');
  const mongoPort = Number(new URL(cfg.MONGO_URL).port || 27017);
  const apiKey = requireBootstrapKey(bootstrapApiKey(cfg), cfg.NODE_ENV);
  if (tHost !== '127.0.0.1' && tHost !== 'localhost') {
    process.stderr.write(`npm start runs its own Temporal server on 127.0.0.1; unset TEMPORAL_ADDRESS (got ${cfg.TEMPORAL_ADDRESS})\n`);
    process.exit(2);
  }
  const uiPort = Number(process.env.TEMPORAL_UI_PORT ?? 8233);
  const colors: Record<string, string> = { api: '36', worker: '35', host: '33' };
  // eslint-disable-next-line prefer-const -- set once the stack has started; stop() may run before that
  let stack: Stack | undefined;
  let stopping = false;
  const stop = async (code = 0) => {
    if (stopping) return;
    stopping = true;
    process.stdout.write('\nstopping…\n');
    await stack?.stop({ destroySandboxes: process.env.KEEP_SANDBOXES !== '1' });
    process.stdout.write('stopped\n');
    process.exit(code);
  };
  process.on('SIGINT', () => void stop());
  process.on('SIGTERM', () => void stop());

  process.stdout.write(`starting the stack (state in ${cfg.DATA_DIR})…\n`);
  stack = await startStack({
    dataDir: cfg.DATA_DIR,
    apiPort: cfg.PORT,
    temporalPort: Number(tPort),
    uiPort,
    mongoPort,
    hostPort: Number(cfg.HOST_LISTEN.split(':')[1]),
    hosts: cfg.SANDBOX_HOSTS,
    apiKey,
    hostToken: resolveHostToken(cfg),
    sandboxProvider: cfg.SANDBOX_PROVIDER,
    supervise: true,
    // Deaths and restarts go to stderr, so they stand out from the processes' own output.
    log: (line) => process.stderr.write(`\x1b[31msupervisor\x1b[0m ${line}\n`),
    onGiveUp: (name, message) => {
      process.stderr.write(`\nstopping the stack: ${message} (its log: ${cfg.DATA_DIR}/logs/${name}.log)\n`);
      void stop(1);
    },
    echo: (name, line) => {
      if (!stopping) process.stdout.write(`\x1b[${colors[name] ?? '0'}m${name.padEnd(6)}\x1b[0m ${line}\n`);
    },
  });
  process.stdout.write(
    [
      '',
      'Sandbox Agent Platform is up.',
      `  API          ${stack.apiUrl}   (OpenAPI: ${stack.apiUrl}/openapi.json, reference: ${stack.apiUrl}/docs)`,
      `  Console      ${stack.apiUrl}/console`,
      `  Temporal UI  ${stack.uiUrl}`,
      `  Temporal     ${stack.temporalAddress}`,
      `  MongoDB      ${stack.mongoUrl}`,
      `  Hosts        ${stack.hostList.map((h) => `${h.hostId} ${h.url}`).join(', ')}`,
      `  API key      ${apiKey}   (organisation "default"; send it as X-API-Key)`,
      `  Logs         ${stack.logDir}`,
      `  Metrics      ${stack.apiUrl}/metrics (API), http://${cfg.HOST}:${cfg.WORKER_METRICS_PORT}/metrics (worker, with the Temporal SDK's metrics)`,
      'Press Ctrl-C to stop.',
      '',
    ].join('\n') + '\n',
  );
}

main().catch((err) => {
  process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
