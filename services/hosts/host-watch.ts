import type { Client } from '@temporalio/client';
import type { Logger } from 'pino';
import type { Store } from '../../store';
import type { HostClient, SandboxInfo } from '../../sandbox';
import { findHost, listHosts, markHostRejoined, markHostWrittenOff, type HostDoc } from '../../store/hosts';
import { findSandboxStates, instancesOnHost, markRunningSandboxes, runningSandboxIdsOnHost } from '../../store/sandboxes';
import { checkHostLost } from './host-loss';
import { hostAlive } from './placement';
import { hostLostSignal } from '../../workflows/defs';

/**
 * Watches the other hosts from each worker: a host silent for HOST_DEAD_AFTER that does not answer a
 * probe is marked lost (services/hosts/host-loss.ts), and what lived on it is written off once: each instance
 * there gets the `hostLost` signal (it ends failed, reason host_lost). Sessions find out by
 * themselves (their host-bound steps time out; workflows/session.ts). A lost host's API sandboxes
 * answer 410 (services/hosts/hosts.ts) until the host rejoins (rejoinIfLost).
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
        if (!doc.lostAt && !(await checkHostLost(o.store, doc._id, o.deadAfterMs, o.token))) continue;
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

/** What a rejoin did: sandboxes kept (running again), destroyed (written off or killed meanwhile), recorded `error` (the host no longer has them). */
export interface Rejoined {
  kept: number;
  destroyed: number;
  missing: number;
}

/**
 * Brings back a host that was written off while it was away (frozen, cut off, or restarted), then
 * lets it rejoin (lostAt cleared) and take new work. Called at the worker's start and by its
 * heartbeat as soon as the host's record says lost. The host's own list is the truth:
 * - a session's sandbox from before the loss goes (its session ended host_lost or ran again elsewhere);
 * - an instance's sandbox from before the loss goes, its record `stopped` (the instance ended failed, host_lost);
 * - an API sandbox the host still has stays and is `running` again, unless its record was killed meanwhile (then it goes);
 * - an API sandbox recorded running from before the loss that the host no longer has is recorded `error`, never `running`.
 * null: the host was not marked lost.
 */
export async function rejoinIfLost(store: Store, client: Client, host: HostClient, hostId: string, logger: Logger): Promise<Rejoined | null> {
  const doc: HostDoc | null = await findHost(store, hostId);
  if (!doc?.lostAt) return null;
  if (!doc.writtenOff) await writeOffHost(store, client, hostId, logger);
  const lostAt = new Date(doc.lostAt);
  const before = (sb: SandboxInfo) => new Date(sb.createdAt).getTime() < lostAt.getTime();
  const onHost = await host.listSandboxes();
  const records = new Map(
    (
      await findSandboxStates(
        store,
        onHost.map((sb) => sb.id),
      )
    ).map((r) => [r._id, r]),
  );
  const go: string[] = [];
  const instanceSandboxes: string[] = [];
  for (const sb of onHost) {
    const rec = records.get(sb.id);
    if (sb.owner?.kind === 'session') {
      if (before(sb)) go.push(sb.id);
    } else if (sb.owner?.kind === 'instance' || rec?.instanceId) {
      if (before(sb)) {
        go.push(sb.id);
        instanceSandboxes.push(sb.id);
      }
    } else if (rec && (rec.status === 'stopped' || rec.status === 'error')) {
      go.push(sb.id);
    }
  }
  for (const id of go) await host.destroySandbox(id);
  await markRunningSandboxes(store, instanceSandboxes, 'stopped');
  const has = new Set(onHost.filter((sb) => sb.status === 'running' && !go.includes(sb.id)).map((sb) => sb.id));
  const missing = (await runningSandboxIdsOnHost(store, hostId, lostAt)).filter((id) => !has.has(id) && !instanceSandboxes.includes(id));
  await markRunningSandboxes(store, missing, 'error');
  await markHostRejoined(store, hostId, lostAt);
  const done = { kept: has.size, destroyed: go.length, missing: missing.length };
  logger.warn({ hostId, ...done }, 'sandbox host rejoined after it was written off: its sandboxes were reconciled');
  return done;
}
