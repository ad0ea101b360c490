import { checkHostLost } from '../services/host-loss';
import type { ActivityDeps } from './deps';

/** Activities about hosts; they run on the shared task queue (any live worker). */
export const createHostActivities = (deps: ActivityDeps) => ({
  /**
   * True when host `hostId` is lost (services/host-loss.ts checkHostLost): a workflow whose host-bound step
   * was not taken in time asks this before it writes the step off.
   */
  async isHostLost(args: { hostId: string }): Promise<boolean> {
    return checkHostLost(deps.store, args.hostId, deps.hostDeadAfterMs ?? 15_000, deps.hostToken ?? '');
  },
});
