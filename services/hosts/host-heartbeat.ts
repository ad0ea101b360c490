/**
 * The worker's own host in the hosts collection: registered when the worker starts, and kept alive by
 * a heartbeat (its liveness and load) for as long as the host answers. A host written off while it was
 * away (frozen, cut off) rejoins first: its old sandboxes go before it takes anything new.
 */
import type { Client } from '@temporalio/client';
import type { Logger } from '../../lib/logger';
import type { HostCapacity } from '../../contract/hosts';
import type { HostClient } from '../../sandbox';
import type { Store } from '../../store';
import { registerHost } from '../../store/hosts';
import { rejoinIfLost } from './host-watch';

export interface OwnHost {
  store: Store;
  client: Client;
  /** The sandbox host beside the worker. */
  host: HostClient;
  entry: { id: string; url: string; taskQueue: string };
  logger: Logger;
}

/** Registers the host with its capacity, after rejoining when it was written off while away. */
export async function joinHosts(o: OwnHost, capacity: HostCapacity): Promise<void> {
  await rejoinIfLost(o.store, o.client, o.host, o.entry.id, o.logger);
  await registerHost(o.store, { ...o.entry, capacity });
}

/**
 * The heartbeat: the host's liveness and load every `intervalMs`, as long as the host answers (a host
 * that stops answering stops being heard of, and is dead HOST_DEAD_AFTER later). A host written off
 * while it was frozen or cut off hears of it here, at its first heartbeat back, and rejoins.
 */
export function startHostHeartbeat(o: OwnHost & { intervalMs: number }): { stop(): void } {
  let rejoining = false;
  const timer = setInterval(() => {
    o.host
      .health({ signal: AbortSignal.timeout(o.intervalMs) })
      .then(async ({ hostId: _id, ok: _o, provider: _p, ...load }) => {
        const { lostAt } = await registerHost(o.store, { ...o.entry, capacity: load });
        if (!lostAt || rejoining) return;
        rejoining = true;
        await rejoinIfLost(o.store, o.client, o.host, o.entry.id, o.logger).finally(() => (rejoining = false));
      })
      .catch((err: Error) => o.logger.warn({ err: err.message }, 'host heartbeat failed'));
  }, o.intervalMs);
  return { stop: () => clearInterval(timer) };
}
