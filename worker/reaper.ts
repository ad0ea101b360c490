import type { Client } from '@temporalio/client';
import { WorkflowNotFoundError } from '@temporalio/client';
import type { Logger } from '../lib/logger';
import type { HostClient } from '../sandbox/host/client';
import type { Store } from '../store';

/** Sandboxes younger than this are left alone: their session may still be provisioning. */
const GRACE_MS = 60_000;

/**
 * Finds session sandboxes left behind by a crash (their session has ended, or its workflow is
 * gone) and destroys them: at start, then every `intervalMs`.
 */
export function startReaper(deps: { host: HostClient; store: Store; client: Client; logger: Logger; intervalMs?: number }): { stop(): void; sweep(): Promise<number> } {
  async function sweep(): Promise<number> {
    let reaped = 0;
    const sandboxes = await deps.host.listSandboxes();
    for (const sb of sandboxes) {
      if (sb.owner?.kind !== 'session' || Date.now() - Date.parse(sb.createdAt) < GRACE_MS) continue;
      const session = await deps.store.sessions.findOne({ _id: sb.owner.id }, { projection: { status: 1 } });
      let orphan = !session || session.status === 'completed' || session.status === 'failed';
      if (!orphan) {
        try {
          const d = await deps.client.workflow.getHandle(sb.owner.id).describe();
          orphan = d.status.name !== 'RUNNING';
        } catch (err) {
          orphan = err instanceof WorkflowNotFoundError;
        }
      }
      if (orphan) {
        await deps.host.destroySandbox(sb.id);
        deps.logger.warn({ sandboxId: sb.id, sessionId: sb.owner.id }, 'destroyed an orphaned sandbox');
        reaped++;
      }
    }
    return reaped;
  }
  const run = () => sweep().catch((err) => deps.logger.warn({ err: String(err) }, 'reaper sweep failed'));
  void run();
  const timer = setInterval(run, deps.intervalMs ?? 60_000);
  timer.unref();
  return { stop: () => clearInterval(timer), sweep };
}
