import type { Client } from '@temporalio/client';
import type { Config } from '../config';
import type { Logger } from '../lib/logger';
import type { Store } from '../store';
import type { SecretBox } from '../lib/secret-box';
import type { HostDirectory } from './hosts/hosts';
import type { OrgPayloadCodec } from '../lib/payload-codec';

/** What the services of the control plane are built from (api/main.ts and worker/main.ts build it once each; tests build their own). */
export interface ServiceDeps {
  cfg: Config;
  store: Store;
  temporal: Client;
  logger: Logger;
  /** Clients of the sandbox hosts, by host id. */
  hosts: HostDirectory;
  /** Seals and opens secret-store values (SECRETS_KEY). */
  secrets: SecretBox;
  /**
   * The Temporal payload codec (lib/payload-codec.ts), for the codec endpoint; the same one is in
   * `temporal`'s data converter. Absent in tests that build their own deps: the endpoint then opens nothing.
   */
  codec?: OrgPayloadCodec;
}

/** What the sandbox-side services need (sandboxes, checkpoints, snapshots, exec, files, terminals, previews, storage quota): no Temporal client. */
export type SandboxDeps = Omit<ServiceDeps, 'temporal'>;
