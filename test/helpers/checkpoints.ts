import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { HostClient } from '../../sandbox/host-contract/client';
import { api, T } from './env';

const ROOT = path.resolve(__dirname, '..', '..');

/** A client of the test stack's sandbox host, to look inside sandboxes. */
export const hostClient = (): HostClient => new HostClient({ url: T.hostUrl(), token: T.hostToken() });

/** Runs a bash script inside a sandbox (through the host) and returns its stdout; throws on a non-zero exit. */
export async function sh(sandboxId: string, script: string): Promise<string> {
  const r = await hostClient().execRun(sandboxId, { cmd: 'bash', args: ['-c', script] });
  if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}: ${r.stderr}`);
  return r.stdout;
}

/** Creates a sandbox through the API and returns its id. */
export async function newSandbox(body: Record<string, unknown> = {}, key?: string): Promise<string> {
  const r = await api('POST', '/api/sandboxes', { body, key });
  if (r.status !== 201) throw new Error(`create sandbox: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body.sandboxID as string;
}

/** A key of a fresh organisation, made with the admin command. */
export async function otherOrgKey(org = `other-${Date.now().toString(36)}`): Promise<string> {
  const { stdout } = await promisify(execFile)(process.execPath, [path.join(ROOT, 'dist/scripts/keys.js'), 'create', '--org', org], {
    env: { ...process.env, MONGO_URL: T.mongo() },
  });
  return (JSON.parse(stdout) as { key: string }).key;
}
