import type { Client } from '@temporalio/client';
import { WorkflowNotFoundError } from '@temporalio/client';
import type { Logger } from '../../lib/logger';
import type { HostClient } from '../../sandbox';
import type { Store } from '../../store';
import { findSandbox, markSandboxStopped } from '../../store/sandboxes';
import { hibernateSandbox } from './hibernation';
import { readSession } from '../../store/sessions';
import type { SandboxInfo } from '../../sandbox';

/** Sandboxes younger than this are left alone: their session may still be provisioning, or their record being written. */
const GRACE_MS = 60_000;

/**
 * Destroys sandboxes nobody needs any more: a session's sandbox left behind by a crash (its
 * session has ended, or its workflow is gone), an API or instance sandbox without a record, and
 * an API sandbox idle past its `timeout` (or hibernates it, when created with onTimeout: hibernate). Runs at start, then every `intervalMs` (15 s).
 */
export function startReaper(deps: {
  host: HostClient;
  store: Store;
  client: Client;
  logger: Logger;
  intervalMs?: number;
  /** After each scheduled sweep (the worker counts them: sap_reaper_sweeps_total). */
  onSweep?: (outcome: 'ok' | 'error') => void;
}): {
  stop(): void;
  sweep(): Promise<number>;
} {
  async function sweep(): Promise<number> {
    let reaped = 0;
    const sandboxes = await deps.host.listSandboxes();
    for (const sb of sandboxes) {
      const orphan = await isOrphan(sb).catch(() => false);
      if (orphan) {
        await deps.host.destroySandbox(sb.id);
        deps.logger.warn({ sandboxId: sb.id, owner: sb.owner, why: orphan }, 'destroyed a sandbox');
        reaped++;
      }
    }
    return reaped;
  }

  /** Why a sandbox should go (its owner has ended, or it has been idle past its timeout), or false. */
  async function isOrphan(sb: SandboxInfo): Promise<string | false> {
    if (sb.owner?.kind === 'session') {
      if (Date.now() - Date.parse(sb.createdAt) < GRACE_MS) return false;
      const session = await readSession(deps.store, sb.owner.id);
      if (!session || session.status === 'completed' || session.status === 'failed') return 'its session has ended';
      try {
        const d = await deps.client.workflow.getHandle(sb.owner.id).describe();
        return d.status.name !== 'RUNNING' ? 'its session workflow has ended' : false;
      } catch (err) {
        return err instanceof WorkflowNotFoundError ? 'its session workflow does not exist' : false;
      }
    }
    if (sb.owner?.kind === 'api' || sb.owner?.kind === 'instance') {
      const doc = await findSandbox(deps.store, sb.id);
      // The API records a sandbox while the host creates it: a young one may not have its record yet.
      if (!doc && Date.now() - Date.parse(sb.createdAt) < GRACE_MS) return false;
      if (!doc || doc.status === 'stopped') return 'it has no record';
      const last = (doc.lastActiveAt ?? doc.createdAt).getTime();
      if (doc.timeout > 0 && Date.now() - last > doc.timeout * 1000) {
        if (doc.onTimeout === 'hibernate' && doc.status === 'running') {
          await hibernateSandbox(deps.store, deps.host, doc);
          deps.logger.info({ sandboxId: doc._id, timeout: doc.timeout }, 'hibernated an idle sandbox');
          return false;
        }
        await markSandboxStopped(deps.store, doc._id);
        return `idle for more than ${doc.timeout} s`;
      }
    }
    return false;
  }
  const run = () =>
    sweep().then(
      () => deps.onSweep?.('ok'),
      (err) => {
        deps.logger.warn({ err: String(err) }, 'reaper sweep failed');
        deps.onSweep?.('error');
      },
    );
  void run();
  const timer = setInterval(run, deps.intervalMs ?? 15_000);
  timer.unref();
  return { stop: () => clearInterval(timer), sweep };
}
