import type { Client } from '@temporalio/client';
import type { Config } from '../config';
import type { Logger } from '../lib/logger';
import type { Store } from '../store';
import type { HostDirectory } from '../services/hosts';
import type { SecretBox } from '../lib/secret-box';

/** Everything the API needs, built once by api/main.ts (or a test) and passed to createApp. */
export interface ApiDeps {
  cfg: Config;
  store: Store;
  temporal: Client;
  logger: Logger;
  /** Clients of the sandbox hosts, by host id. */
  hosts: HostDirectory;
  /** Seals and opens secret-store values (SECRETS_KEY). */
  secrets: SecretBox;
}
