import { HostClient } from '../sandbox';
import { checkHostLost } from '../store/hosts';
import type { ActivityDeps } from './deps';

/** Whether the host at `url` answers its /healthz within 1.5 s. */
export function hostAnswers(url: string, token: string): Promise<boolean> {
  return new HostClient({ url, token })
    .health({ signal: AbortSignal.timeout(1_500) })
    .then(() => true)
    .catch(() => false);
}

/** Activities about hosts; they run on the shared task queue (any live worker). */
export const createHostActivities = (deps: ActivityDeps) => ({
  /**
   * True when host `hostId` is lost (store/hosts.ts checkHostLost): a workflow whose host-bound step
   * was not taken in time asks this before it writes the step off.
   */
  async isHostLost(args: { hostId: string }): Promise<boolean> {
    return checkHostLost(deps.store, args.hostId, deps.hostDeadAfterMs ?? 15_000, (url) => hostAnswers(url, deps.hostToken ?? ''));
  },
});
