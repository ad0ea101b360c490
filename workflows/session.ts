import {
  ActivityFailure,
  ApplicationFailure,
  CancellationScope,
  isCancellation,
  patched,
  proxyActivities,
  TimeoutFailure,
  proxyLocalActivities,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import type { ActivityOptions } from '@temporalio/workflow';
import type { Activities } from '../activities';
import { SESSION_STATUS } from './search-attributes';
import type { AgentRunSpec } from '../store';
import type { SessionWorkflowResult, SessionEnd } from './types';
import type { EntrypointExit, Provisioned } from '../activities';
import { startWebhook } from './webhook';

/** Arguments of one session's workflow. The workflow id is the session id. */
export interface SessionWorkflowArgs {
  sessionId: string;
  orgId: string;
  agentId: string;
  run: AgentRunSpec;
  /** The session's input (JSON text) when it is small; a larger one is read from MongoDB by provisioning. */
  input?: string;
}

/** Provisioning may run on any worker: the one that takes it provisions on its own sandbox host (or places it on another). */
const PROVISION_OPTIONS: ActivityOptions = {
  startToCloseTimeout: '2 minutes',
  // A worker that dies mid-provisioning is noticed after this, not after the whole timeout.
  heartbeatTimeout: '10 s',
  retry: {
    initialInterval: '500 ms',
    backoffCoefficient: 2,
    maximumInterval: '30 s',
    maximumAttempts: 8,
    nonRetryableErrorTypes: ['PatchFailed', 'SnapshotNotFound', 'InvalidAgent'],
  },
};
/**
 * Provisioning is a local activity: it runs in the worker that runs the
 * workflow task (beside that worker's own sandbox host), which saves a workflow task and an
 * activity task per session; a crash of that worker re-runs it (it is idempotent) on another.
 */
const { provisionSandboxAndRunEntrypoint: provisionLocally } = proxyLocalActivities<Activities>({
  startToCloseTimeout: PROVISION_OPTIONS.startToCloseTimeout,
  localRetryThreshold: '10 s',
  retry: PROVISION_OPTIONS.retry,
});
/**
 * Provisioning starts where the workflow task runs; placement may send it on to another host, and a
 * snapshot's layers are fetched by the host that provisions. Workflows started before that (no
 * marker in their history) provision a snapshot's session on the snapshot's host, as they did.
 */
const provisionerFor = (run: AgentRunSpec) =>
  run.snapshotRef && !patched('snapshot-layers-follow')
    ? proxyActivities<Activities>({ ...PROVISION_OPTIONS, taskQueue: run.snapshotRef.taskQueue }).provisionSandboxAndRunEntrypoint
    : provisionLocally;

/**
 * How long provisioning sent to another host (placement) may wait for that host's worker to take
 * it: a host that died meanwhile is given up and the session provisioned where its workflow runs.
 */
const PLACED_SCHEDULE_TO_START = '20 s';

type ProvisionArgs = Parameters<Activities['provisionSandboxAndRunEntrypoint']>[0];

/**
 * Provisions where placement says: the local activity either provisions on its own host or names
 * another host's task queue, where provisioning then runs as a regular activity. If that host's
 * worker never takes it (schedule-to-start timeout, no attempt ever started), it is provisioned here.
 */
async function provision(args: ProvisionArgs): Promise<Provisioned> {
  const first = await provisionerFor(args.run)(args);
  if (!first.redirect) return first;
  const placed = { ...args, placed: true };
  try {
    return await proxyActivities<Activities>({ ...PROVISION_OPTIONS, taskQueue: first.redirect, scheduleToStartTimeout: PLACED_SCHEDULE_TO_START }).provisionSandboxAndRunEntrypoint(placed);
  } catch (err) {
    if (neverStarted(err)) return await provisionLocally(placed);
    throw err;
  }
}

/** True for an activity that timed out waiting to be taken, with no attempt that ever heartbeated. */
function neverStarted(err: unknown): boolean {
  if (!(err instanceof ActivityFailure) || !(err.cause instanceof TimeoutFailure)) return false;
  return err.cause.timeoutType === 'SCHEDULE_TO_START' && err.cause.lastHeartbeatDetails === undefined;
}

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
  return { awaitEntrypointExit: waiting.awaitEntrypointExit, captureResultAndDestroySandbox: cleanup.captureResultAndDestroySandbox };
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
 * How the workflow ends once the outcome is recorded: a completed session returns its result; a
 * failed one fails the workflow (red in the Temporal UI, counted in its Failures view) with a
 * non-retryable ApplicationFailure whose type is the outcome's reason and whose message is the
 * outcome's message. A session whose workflow was cancelled ends Canceled (`cancellation`).
 * MongoDB stays the source of the session's state: the failure only mirrors it.
 */
async function finish(args: SessionWorkflowArgs, result: SessionWorkflowResult, cancellation?: unknown): Promise<SessionWorkflowResult> {
  // The webhook, if any, is delivered by a workflow of its own that outlives this one.
  if (args.run.webhook) await startWebhook({ event: 'session.ended', orgId: args.orgId, subjectId: args.sessionId, webhook: args.run.webhook });
  if (result.status === 'completed') return result;
  if (cancellation !== undefined) throw cancellation;
  throw ApplicationFailure.create({
    type: result.outcome?.reason ?? 'failed',
    message: result.outcome?.message ?? 'the session failed',
    nonRetryable: true,
    details: [result],
  });
}

/**
 * One session: provision a sandbox (input written, entrypoint started), await the entrypoint's
 * exit while heartbeating, capture its result, destroy the sandbox. The sandbox is destroyed on
 * every path, cancellation included; the outcome is written to MongoDB before the workflow ends.
 */
export async function sessionWorkflow(args: SessionWorkflowArgs): Promise<SessionWorkflowResult> {
  const { sessionId } = args;
  let provisioned: Provisioned | undefined;
  let exit: EntrypointExit | null = null;
  let cancelled = false;
  let cancellation: unknown;
  let quick: SessionWorkflowResult | undefined;
  let failure: string | undefined;
  let end: SessionEnd;
  try {
    // Not cancellable: a DELETE during provisioning waits for the sandbox to exist, then destroys it.
    provisioned = await CancellationScope.nonCancellable(() => provision({ sessionId, orgId: args.orgId, agentId: args.agentId, run: args.run, input: args.input }));
    if (provisioned.end) {
      // A quick entrypoint: the provisioning step captured its result and destroyed its sandbox.
      // (Ended outside this try: a failed session's failure must not be caught as the workflow's own.)
      setStatus(provisioned.end.status);
      quick = { sessionId, workflowId: workflowInfo().workflowId, status: provisioned.end.status, outcome: provisioned.end.outcome };
      return await finish(args, quick);
    }
    setStatus('running');
    const host = hostActivities(provisioned.taskQueue, args.run.timeoutSeconds);
    exit = provisioned.exit ?? (await host.awaitEntrypointExit({ sessionId, sandboxId: provisioned.sandboxId }));
  } catch (err) {
    if (quick) throw err; // finish()'s failure of a quick session: the session has ended
    if (isCancellation(err)) {
      cancelled = true;
      cancellation = err;
    } else if (provisioned) failure = err instanceof ActivityFailure && err.cause ? err.cause.message : String(err);
    else {
      const message = err instanceof ActivityFailure && err.cause ? err.cause.message : String(err);
      end = { status: 'failed', result: null, outcome: { reason: 'provisioning_failed', exit_code: null, message } };
      await CancellationScope.nonCancellable(() => recordSessionOutcome({ sessionId, end }));
      setStatus('failed');
      return await finish(args, { sessionId, workflowId: workflowInfo().workflowId, status: end.status, outcome: end.outcome });
    }
  }
  // Every path with a sandbox ends here: capture, record, destroy, even when cancelled.
  const { sandboxId, taskQueue } = provisioned!;
  end = await CancellationScope.nonCancellable(() =>
    hostActivities(taskQueue, args.run.timeoutSeconds).captureResultAndDestroySandbox({ sessionId, sandboxId, exit, cancelled, failure, memoryMB: args.run.memoryMB }),
  );
  setStatus(end.status);
  return await finish(args, { sessionId, workflowId: workflowInfo().workflowId, status: end.status, outcome: end.outcome }, cancellation);
}
