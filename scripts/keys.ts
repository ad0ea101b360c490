import { parseArgs } from 'node:util';
import { loadConfigOrExit } from '../config';
import { connectStore } from '../store';
import { createApiKey, ensureOrg, listApiKeys, revokeApiKey } from '../store/orgs';

const USAGE = `usage:
  npm run keys -- create --org <orgId> [--label <text>] [--role tenant|operator]
                                                           create an organisation (if new) and a key for it;
                                                           tenant (the default) sees its organisation only, operator
                                                           also the hosts, the Temporal UI, /metrics and every
                                                           organisation's payloads (docs/threat-model.md)
  npm run keys -- revoke --key <key>                       revoke a key
  npm run keys -- list --org <orgId>                       list an organisation's keys (prefixes only)`;

/** Admin command for organisations and API keys. Talks to MONGO_URL directly. */
async function main(): Promise<void> {
  const { positionals, values } = parseArgs({
    allowPositionals: true,
    options: { org: { type: 'string' }, label: { type: 'string' }, key: { type: 'string' }, role: { type: 'string' } },
  });
  const cmd = positionals[0];
  const role = values.role ?? 'tenant';
  if (role !== 'tenant' && role !== 'operator') {
    process.stderr.write(`--role must be tenant or operator\n${USAGE}\n`);
    process.exitCode = 2;
    return;
  }
  const cfg = loadConfigOrExit();
  const store = await connectStore(cfg.MONGO_URL, { ensureIndexes: false });
  try {
    if (cmd === 'create' && values.org && /^[\w.-]{1,64}$/.test(values.org)) {
      await ensureOrg(store, values.org);
      const key = await createApiKey(store, values.org, values.label ?? 'cli', role);
      process.stdout.write(`${JSON.stringify({ org: values.org, role, key })}\n`);
    } else if (cmd === 'revoke' && values.key) {
      const ok = await revokeApiKey(store, values.key);
      process.stdout.write(`${JSON.stringify({ revoked: ok })}\n`);
      if (!ok) process.exitCode = 1;
    } else if (cmd === 'list' && values.org) {
      const keys = await listApiKeys(store, values.org);
      for (const k of keys)
        process.stdout.write(`${JSON.stringify({ prefix: `${k.prefix}…`, label: k.label, role: k.role ?? 'tenant', createdAt: k.createdAt })}\n`);
    } else {
      process.stderr.write(`${USAGE}\n`);
      process.exitCode = 2;
    }
  } finally {
    await store.close();
  }
}

main().catch((err) => {
  process.stderr.write(`keys: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
