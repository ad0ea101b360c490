import type { Config } from '../config';
import type { Logger } from '../lib/logger';
import type { SecretBox } from '../lib/secret-box';
import type { Store } from '../store';
import type { HostDirectory } from './hosts';

/**
 * What the sandbox-side services (sandboxes, checkpoints, snapshots, exec, agent sessions, files,
 * terminals, previews, storage quota) need, handed to their factories once. The API's deps satisfy it.
 */
export interface SandboxDeps {
  cfg: Config;
  store: Store;
  logger: Logger;
  /** Clients of the sandbox hosts, by host id. */
  hosts: HostDirectory;
  /** Signs file URLs and opens secret-store values (SECRETS_KEY). */
  secrets: SecretBox;
}
