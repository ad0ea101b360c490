/**
 * Whether a sandbox host is lost: silent past its heartbeat's deadline and not answering a direct
 * probe either. Asked by the session and instance workflows (through activities/hosts.ts and
 * services/sessions/session-runs.ts) and by the worker's host watch.
 */
import { HostClient } from '../../sandbox';
import type { Store } from '../../store';
import { findHost, markHostLost } from '../../store/hosts';
import { hostAlive } from './placement';

/** Whether the host at `url` answers its /healthz within 1.5 s. */
export function hostAnswers(url: string, token: string): Promise<boolean> {
  return new HostClient({ url, token })
    .health({ signal: AbortSignal.timeout(1_500) })
    .then(() => true)
    .catch(() => false);
}

/**
 * True when host `hostId` is lost: registered, silent for longer than `deadAfterMs`, and not
 * answering a direct probe (with the hosts' `token`) either (a host whose worker alone is down is
 * not lost). Marks it lost.
 */
export async function checkHostLost(store: Store, hostId: string, deadAfterMs: number, token: string): Promise<boolean> {
  const doc = await findHost(store, hostId);
  if (!doc) return false;
  if (doc.lostAt) return true;
  if (hostAlive(doc, deadAfterMs)) return false;
  if (await hostAnswers(doc.url, token)) return false;
  await markHostLost(store, hostId);
  return true;
}
