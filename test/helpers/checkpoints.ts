import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { T } from './env';

const ROOT = path.resolve(__dirname, '..', '..');

/** A key of a fresh organisation, made with the admin command (a tenant's unless `role` says operator). */
export async function otherOrgKey(org = `other-${Date.now().toString(36)}`, role: 'tenant' | 'operator' = 'tenant'): Promise<string> {
  const { stdout } = await promisify(execFile)(process.execPath, [path.join(ROOT, 'dist/scripts/keys.js'), 'create', '--org', org, '--role', role], {
    env: { ...process.env, MONGO_URL: T.mongo() },
  });
  return (JSON.parse(stdout) as { key: string }).key;
}
