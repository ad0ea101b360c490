import type { Client } from '@temporalio/client';
import type { Logger } from 'pino';
import type { Store } from '../store';
import type { HostClient } from '../sandbox';
import { checkHostLost, findHost, hostAlive, listHosts, markHostRejoined, markHostWrittenOff, type HostDoc } from '../store/hosts';
import { instancesOnHost } from '../store/sandboxes';
import { hostAnswers } from '../activities/hosts';
import { hostLostSignal } from '../workflows/defs';

/**
 * Watches the other hosts from each worker: a host silent for HOST_DEAD_AFTER that does not answer a
 * probe is marked lost (store/hosts.ts), and what lived on it is written off once: each instance
 * there gets the `hostLost` signal (it ends failed, reason host_lost). Sessions find out by
 * themselves (their host-bound steps time out; workflows/session.ts). A lost host's API sandboxes
 * answer 410 (api/hosts.ts).
 */
export function startHostWatch(o: { store: Store; client: Client; hostId: string; deadAfterMs: number; token: string; logger: Logger; intervalMs: number }): {
  stop(): void;
} {
  let running = false;
  const tick = async () => {
    if (running) return;
    running = true;
    try {
      const docs = await listHosts(o.store);
      for (const doc of docs) {
        if (doc._id === o.hostId) continue;
        if (!doc.lostAt && hostAlive(doc, o.deadAfterMs)) continue;
        if (!doc.lostAt && !(await checkHostLost(o.store, doc._id, o.deadAfterMs, (url) => hostAnswers(url, o.token)))) continue;
        if (!doc.writtenOff) await writeOffHost(o.store, o.client, doc._id, o.logger);
      }
    } catch (err) {
      o.logger.warn({ err: (err as Error).message }, 'host watch failed');
    } finally {
      running = false;
    }
  };
  const timer = setInterval(() => void tick(), o.intervalMs);
  return { stop: () => clearInterval(timer) };
}

/** Signals every instance on lost host `hostId` that it is gone, then marks the host written off. Idempotent. */
export async function writeOffHost(store: Store, client: Client, hostId: string, logger: Logger): Promise<void> {
  const onIt = await instancesOnHost(store, hostId);
  for (const instanceId of onIt) {
    await client.workflow
      .getHandle(instanceId)
      .signal(hostLostSignal, { hostId })
      .catch((err: Error) => logger.debug({ err: err.message, instanceId }, 'instance already ended'));
  }
  await markHostWrittenOff(store, hostId);
  logger.warn({ hostId, instances: onIt.length }, 'sandbox host lost: its instances were written off');
}

/**
 * At a worker's start, beside a host that was written off while it was away: its sandboxes from
 * before (the sessions and instances on them were ended or rerun elsewhere) are destroyed, then the
 * host rejoins (lostAt cleared).
 */
export async function rejoinIfLost(store: Store, client: Client, host: HostClient, hostId: string, logger: Logger): Promise<void> {
  const doc: HostDoc | null = await findHost(store, hostId);
  if (!doc?.lostAt) return;
  if (!doc.writtenOff) await writeOffHost(store, client, hostId, logger);
  const lostAt = new Date(doc.lostAt).getTime();
  const stale = (await host.listSandboxes()).filter((sb) => new Date(sb.createdAt).getTime() < lostAt);
  for (const sb of stale) await host.destroySandbox(sb.id);
  await markHostRejoined(store, hostId);
  logger.warn({ hostId, destroyed: stale.length }, 'sandbox host rejoined after it was written off: its old sandboxes were destroyed');
}
