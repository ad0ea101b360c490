import {
  ActivityFailure,
  ApplicationFailure,
  CancellationScope,
  isCancellation,
  proxyActivities,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import type { Activities } from '../activities';
import { SESSION_STATUS } from './search-attributes';
import type { AgentRunSpec } from '../store';
import type { SessionWorkflowResult, SessionEnd } from './types';

/** Arguments of one session's workflow. The workflow id is the session id. */
export interface SessionWorkflowArgs {
  sessionId: string;
  orgId: string;
  agentId: string;
  run: AgentRunSpec;
}

/** Provisioning may run on any worker: the one that takes it provisions on its own sandbox host. */
const { provisionSandbox } = proxyActivities<Activities>({
  startToCloseTimeout: '2 minutes',
  retry: {
    initialInterval: '500 ms',
    backoffCoefficient: 2,
    maximumInterval: '30 s',
    maximumAttempts: 8,
    nonRetryableErrorTypes: ['PatchFailed', 'SnapshotNotFound', 'InvalidAgent'],
  },
});

/** Activities bound to the sandbox host that owns the session's sandbox. */
function hostActivities(taskQueue: string, timeoutSeconds: number) {
  const waiting = proxyActivities<Activities>({
    taskQueue,
    startToCloseTimeout: `${timeoutSeconds + 120} s`,
    heartbeatTimeout: '10 s',
    retry: { initialInterval: '1 s', backoffCoefficient: 2, maximumInterval: '10 s' },
  });
  const cleanup = proxyActivities<Activities>({
    taskQueue,
    startToCloseTimeout: '1 minute',
    retry: { initialInterval: '500 ms', backoffCoefficient: 2, maximumInterval: '10 s' },
  });
  return { awaitEntrypointExit: waiting.awaitEntrypointExit, destroySandboxAndRecordOutcome: cleanup.destroySandboxAndRecordOutcome };
}

/** Records an ending that happened before any sandbox existed (provisioning failed for good). */
const { recordSessionOutcome } = proxyActivities<Activities>({
  startToCloseTimeout: '30 s',
  retry: { initialInterval: '500 ms', backoffCoefficient: 2, maximumInterval: '10 s' },
});

function setStatus(status: string): void {
  upsertSearchAttributes([{ key: SESSION_STATUS, value: status }]);
}

/**
 * One session: provision a sandbox (input written, entrypoint started), await the entrypoint's
 * exit while heartbeating, capture its result, destroy the sandbox. The sandbox is destroyed on
 * every path, cancellation included; the outcome is written to MongoDB before the workflow ends.
 */
export async function sessionWorkflow(args: SessionWorkflowArgs): Promise<SessionWorkflowResult> {
  const { sessionId } = args;
  let provisioned: { sandboxId: string; taskQueue: string } | undefined;
  let end: SessionEnd | undefined;
  try {
    // Not cancellable: a DELETE during provisioning waits for the sandbox to exist, then destroys it.
    provisioned = await CancellationScope.nonCancellable(() =>
      provisionSandbox({ sessionId, orgId: args.orgId, agentId: args.agentId, run: args.run }),
    );
    setStatus('running');
    const host = hostActivities(provisioned.taskQueue, args.run.timeoutSeconds);
    end = await host.awaitEntrypointExit({ sessionId, sandboxId: provisioned.sandboxId });
  } catch (err) {
    if (isCancellation(err)) {
      end = { status: 'failed', result: null, outcome: { reason: 'cancelled', exit_code: null, message: 'session ended by request' } };
    } else if (!provisioned) {
      const message = err instanceof ActivityFailure && err.cause ? err.cause.message : String(err);
      end = { status: 'failed', result: null, outcome: { reason: 'provisioning_failed', exit_code: null, message } };
    } else {
      const message = err instanceof ActivityFailure && err.cause ? err.cause.message : String(err);
      end = { status: 'failed', result: null, outcome: { reason: 'exit_code', exit_code: null, message } };
    }
  } finally {
    const final = end ?? { status: 'failed' as const, result: null, outcome: { reason: null, exit_code: null, message: 'session ended unexpectedly' } };
    await CancellationScope.nonCancellable(async () => {
      if (provisioned) {
        const host = hostActivities(provisioned.taskQueue, args.run.timeoutSeconds);
        await host.destroySandboxAndRecordOutcome({ sessionId, sandboxId: provisioned.sandboxId, end: final });
      } else {
        await recordSessionOutcome({ sessionId, end: final });
      }
    });
    setStatus(final.status);
  }
  if (!end) throw ApplicationFailure.nonRetryable('session ended without an outcome', 'SessionLost');
  return {
    sessionId,
    status: end.status,
    outcome: end.outcome,
    workflowId: workflowInfo().workflowId,
  };
}
