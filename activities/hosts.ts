import type { ActivityDeps } from './deps';

/** Activities about hosts; they run on the shared task queue (any live worker). */
export const createHostActivities = (deps: ActivityDeps) => ({
  /**
   * True when host `hostId` is lost (services/hosts/host-loss.ts checkHostLost): a workflow whose host-bound step
   * was not taken in time asks this before it writes the step off.
   */
  async isHostLost(args: { hostId: string }): Promise<boolean> {
    return deps.services.hostLoss.isLost(args.hostId);
  },
});
