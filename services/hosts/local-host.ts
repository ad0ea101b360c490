import type { HostClient } from '../../sandbox';
import type { SandboxLimits } from '../../config/limits';
import type { SecretBox } from '../../lib/secret-box';
import type { Store } from '../../store';

/**
 * The sandbox host beside the worker, and the worker's settings for the sandboxes its workflows'
 * steps make there (the worker builds it once, worker/main.ts).
 */
export interface LocalHost {
  /** The sandbox host on this machine. */
  host: HostClient;
  /** The id of `host` (layers made elsewhere are fetched to it); absent: never fetch. */
  hostId?: string;
  /** HOST_TOKEN, for probing other hosts. */
  hostToken?: string;
  /** HOST_DEAD_AFTER in ms (a layer's source host silent this long is lost). */
  hostDeadAfterMs?: number;
  /** Task queue of the worker beside `host`; returned by provisioning so later steps land here. */
  hostTaskQueue: string;
  resultMaxBytes: number;
  /** How much of each of a session's stdout and stderr is kept (SESSION_LOG_MAX_BYTES). */
  logMaxBytes: number;
  /** The sandbox limits' defaults and maxima (the same SANDBOX_* variables as the host beside it). */
  limits: SandboxLimits;
  /** SANDBOX_USER: who agents' sandboxes run as when the agent does not say (absent: root). */
  sandboxUser?: 'root' | 'sandbox';
  /** Opens secret-store values (the same SECRETS_KEY as the API's). */
  secrets: SecretBox;
  /**
   * Where a new session's sandbox should go: the task queue of another live host chosen by free
   * capacity (services/hosts/placement.ts placementFrom), or null for this one. Absent: always this one.
   */
  placeElsewhere?: () => Promise<string | null>;
  /** True when more than one host is registered (runs of sessions are then claimed, see claimSessionRun). */
  severalHosts?: () => Promise<boolean>;
}

/** What the services of the workflows' steps on the local host are built from. */
export type LocalRunDeps = LocalHost & { store: Store };
