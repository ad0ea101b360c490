import { ActivityFailure, CancellationScope, condition, isCancellation, proxyActivities, setHandler } from '@temporalio/workflow';
import type { ActivityOptions } from '@temporalio/workflow';
import type { Activities } from '../activities';
import { nonRetryableFailureTypes } from '../contract/errors';
import { destroyInstanceSignal, hostLostSignal, type InstanceWorkflowArgs, type InstanceWorkflowResult } from './defs';

export { destroyInstanceSignal, hostLostSignal, type InstanceWorkflowArgs, type InstanceWorkflowResult } from './defs';

const PROVISION: ActivityOptions = {
  startToCloseTimeout: '2 minutes',
  heartbeatTimeout: '30 s',
  retry: {
    initialInterval: '1 s',
    backoffCoefficient: 2,
    maximumInterval: '30 s',
    maximumAttempts: 6,
    nonRetryableErrorTypes: nonRetryableFailureTypes(),
  },
};

const { recordInstanceEnd } = proxyActivities<Activities>({
  startToCloseTimeout: '30 s',
  retry: { initialInterval: '500 ms', backoffCoefficient: 2, maximumInterval: '10 s' },
});

/**
 * One instance: provision its sandbox (on the snapshot's host when the agent has a snapshot; a
 * failure is retried by Temporal, then recorded as `failed` with its reason), then wait — for
 * as long as it takes — for the destroy signal, then destroy the sandbox on its host and record
 * `stopped`. The sandbox is owned by the host, not the worker, so a worker restart changes
 * nothing; a cancelled workflow still destroys its sandbox.
 */
/** The host id in a host's task queue (`<TASK_QUEUE>@<hostId>`). */
const hostOfQueue = (taskQueue: string): string => taskQueue.slice(taskQueue.lastIndexOf('@') + 1);

export async function instanceWorkflow(args: InstanceWorkflowArgs): Promise<InstanceWorkflowResult> {
  let destroy = false;
  setHandler(destroyInstanceSignal, () => {
    destroy = true;
  });
  let lostHost: string | null = null;
  setHandler(hostLostSignal, ({ hostId }) => {
    lostHost = hostId;
  });
  const provisioner = proxyActivities<Activities>(args.run.snapshotRef ? { ...PROVISION, taskQueue: args.run.snapshotRef.taskQueue } : PROVISION);
  let placed: { sandboxId: string; taskQueue: string };
  try {
    placed = await CancellationScope.nonCancellable(() =>
      provisioner.provisionInstance({ instanceId: args.instanceId, orgId: args.orgId, agentId: args.agentId, run: args.run }),
    );
  } catch (err) {
    const error = err instanceof ActivityFailure && err.cause ? err.cause.message : String(err);
    await CancellationScope.nonCancellable(() => recordInstanceEnd({ instanceId: args.instanceId, status: 'failed', error }));
    return { instanceId: args.instanceId, status: 'failed', error };
  }
  try {
    await condition(() => destroy || lostHost !== null);
  } catch (err) {
    if (!isCancellation(err)) throw err;
  }
  if (lostHost !== null && hostOfQueue(placed.taskQueue) === lostHost) {
    // Nothing to destroy: the host destroys its old sandboxes when it comes back.
    const error = `host_lost: sandbox host ${lostHost} was lost; the instance's sandbox is written off`;
    await CancellationScope.nonCancellable(() => recordInstanceEnd({ instanceId: args.instanceId, status: 'failed', error }));
    return { instanceId: args.instanceId, status: 'failed', error };
  }
  const host = proxyActivities<Activities>({
    taskQueue: placed.taskQueue,
    startToCloseTimeout: '1 minute',
    retry: { initialInterval: '500 ms', backoffCoefficient: 2, maximumInterval: '10 s' },
  });
  await CancellationScope.nonCancellable(() => host.destroyInstanceSandbox({ instanceId: args.instanceId, sandboxId: placed.sandboxId }));
  return { instanceId: args.instanceId, status: 'stopped', error: null };
}
