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
import { failureType, nonRetryableFailureTypes, provisioningOutcome } from '../contract/errors';
import { SESSION_STATUS } from './search-attributes';
import type { AgentRunSpec } from '../contract/workflows';
import type { SessionWorkflowResult, SessionEnd } from './types';
import type { EntrypointExit, Provisioned } from '../activities';
import { startWebhook } from './webhook';
import type { SessionWorkflowArgs } from './defs';

export type { SessionWorkflowArgs } from './defs';

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
    nonRetryableErrorTypes: nonRetryableFailureTypes(),
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
 * another host's task queue (placement, or the host that claimed this run first), where provisioning
 * then runs as a regular activity. A host whose worker does not take it in time and is lost: if no
 * attempt started there, provisioning comes back here; if one did, the host is lost for this session.
 */
async function provision(args: ProvisionArgs): Promise<Provisioned> {
  try {
    let result = await provisionerFor(args.run)(args);
    while (result.redirect) {
      const queue = result.redirect;
      const placed = { ...args, placed: true };
      try {
        result = await proxyActivities<Activities>({
          ...PROVISION_OPTIONS,
          taskQueue: queue,
          scheduleToStartTimeout: PLACED_SCHEDULE_TO_START,
        }).provisionSandboxAndRunEntrypoint(placed);
      } catch (err) {
        if (!scheduleToStartTimedOut(err)) throw err;
        const hostId = hostOfQueue(queue);
        if (!(await isHostLost({ hostId }))) continue; // busy, not lost: send it again
        if (!neverStarted(err)) throw new HostLost(hostId);
        result = await provisionLocally(placed);
      }
    }
    return result;
  } catch (err) {
    // The host that claimed this run is lost (services/sessions/session-runs.ts backToClaimant).
    const lost = failureOfType(err, failureType('host_lost'));
    if (lost) throw new HostLost(String(lost.details?.[0] ?? 'unknown'));
    throw err;
  }
}

/** The ApplicationFailure of type `type` in an error's cause chain, if any. */
function failureOfType(err: unknown, type: string): ApplicationFailure | null {
  for (let e: unknown = err; e; e = (e as { cause?: unknown }).cause) {
    if (e instanceof ApplicationFailure && e.type === type) return e;
  }
  return null;
}

/** True for an activity that timed out waiting to be taken, with no attempt that ever heartbeated. */
function neverStarted(err: unknown): boolean {
  if (!(err instanceof ActivityFailure) || !(err.cause instanceof TimeoutFailure)) return false;
  return err.cause.timeoutType === 'SCHEDULE_TO_START' && err.cause.lastHeartbeatDetails === undefined;
}

/**
 * How long a step bound to the sandbox's host may wait for that host's worker: after it, the
 * workflow asks whether the host is lost (onHost) and, if it is not, sends the step again.
 */
const HOST_STEP_SCHEDULE_TO_START = '5 s';

/** Activities bound to the sandbox host that owns the session's sandbox. */
function hostActivities(taskQueue: string, timeoutSeconds: number) {
  const waiting = proxyActivities<Activities>({
    taskQueue,
    scheduleToStartTimeout: HOST_STEP_SCHEDULE_TO_START,
    startToCloseTimeout: `${timeoutSeconds + 120} s`,
    heartbeatTimeout: '10 s',
    retry: { initialInterval: '1 s', backoffCoefficient: 2, maximumInterval: '10 s' },
  });
  const cleanup = proxyActivities<Activities>({
    taskQueue,
    scheduleToStartTimeout: HOST_STEP_SCHEDULE_TO_START,
    startToCloseTimeout: '1 minute',
    retry: { initialInterval: '500 ms', backoffCoefficient: 2, maximumInterval: '10 s' },
  });
  return { awaitEntrypointExit: waiting.awaitEntrypointExit, captureResultAndDestroySandbox: cleanup.captureResultAndDestroySandbox };
}

/** Records an ending that happened before any sandbox existed (provisioning failed for good). */
const { recordSessionOutcome, isHostLost } = proxyActivities<Activities>({
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

/** Thrown (and caught) inside the workflow when the sandbox's host is lost (services/hosts/host-loss.ts checkHostLost). */
class HostLost extends Error {
  constructor(readonly hostId: string) {
    super(`sandbox host ${hostId} was lost`);
  }
}

/** The host id in a host's task queue (`<TASK_QUEUE>@<hostId>`). */
const hostOfQueue = (taskQueue: string): string => taskQueue.slice(taskQueue.lastIndexOf('@') + 1);

/** True for a failure of an activity whose task no worker took in time. */
function scheduleToStartTimedOut(err: unknown): boolean {
  return err instanceof ActivityFailure && err.cause instanceof TimeoutFailure && err.cause.timeoutType === 'SCHEDULE_TO_START';
}

/**
 * Runs a step bound to a host's task queue. When no worker takes it in time, asks (on the shared
 * queue) whether the host is lost: if so throws HostLost, else sends the step again.
 */
async function onHost<T>(taskQueue: string, step: () => Promise<T>): Promise<T> {
  for (;;) {
    try {
      return await step();
    } catch (err) {
      if (!scheduleToStartTimedOut(err)) throw err;
      const hostId = hostOfQueue(taskQueue);
      if (await isHostLost({ hostId })) throw new HostLost(hostId);
    }
  }
}

/** A session runs again after a host loss (retryOnHostLoss) at most this many times. */
const MAX_HOST_LOSS_RERUNS = 3;

/**
 * One session: provision a sandbox (input written, entrypoint started), await the entrypoint's
 * exit while heartbeating, capture its result, destroy the sandbox. The sandbox is destroyed on
 * every path, cancellation included; the outcome is written to MongoDB before the workflow ends.
 * When the sandbox's host is lost, the session ends failed with reason host_lost, or, when the
 * agent sets retryOnHostLoss, runs again from the start on another host.
 */
export async function sessionWorkflow(args: SessionWorkflowArgs): Promise<SessionWorkflowResult> {
  for (let rerun = 0; ; rerun++) {
    try {
      return await runSessionOnce(args, rerun);
    } catch (err) {
      if (!(err instanceof HostLost)) throw err;
      if (args.run.retryOnHostLoss && rerun < MAX_HOST_LOSS_RERUNS) {
        setStatus('creating');
        continue;
      }
      const why = args.run.retryOnHostLoss ? ` (after ${rerun} reruns on other hosts)` : '';
      const end: SessionEnd = {
        status: 'failed',
        result: null,
        outcome: { reason: 'host_lost', exit_code: null, message: `${err.message} while the session ran${why}; its sandbox is written off` },
      };
      await CancellationScope.nonCancellable(() => recordSessionOutcome({ sessionId: args.sessionId, end }));
      setStatus('failed');
      return await finish(args, { sessionId: args.sessionId, workflowId: workflowInfo().workflowId, status: end.status, outcome: end.outcome });
    }
  }
}

/** One run of a session (sessionWorkflow); throws HostLost when its host is lost. */
async function runSessionOnce(args: SessionWorkflowArgs, rerun: number): Promise<SessionWorkflowResult> {
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
    provisioned = await CancellationScope.nonCancellable(() =>
      provision({ sessionId, orgId: args.orgId, agentId: args.agentId, run: args.run, input: args.input, ...(rerun ? { rerun } : {}) }),
    );
    if (provisioned.end) {
      // A quick entrypoint: the provisioning step captured its result and destroyed its sandbox.
      // (Ended outside this try: a failed session's failure must not be caught as the workflow's own.)
      setStatus(provisioned.end.status);
      quick = { sessionId, workflowId: workflowInfo().workflowId, status: provisioned.end.status, outcome: provisioned.end.outcome };
      return await finish(args, quick);
    }
    setStatus('running');
    const host = hostActivities(provisioned.taskQueue, args.run.timeoutSeconds);
    const sandboxId = provisioned.sandboxId;
    exit = provisioned.exit ?? (await onHost(provisioned.taskQueue, () => host.awaitEntrypointExit({ sessionId, sandboxId })));
  } catch (err) {
    if (quick || err instanceof HostLost) throw err; // finish()'s failure of a quick session, or a lost host
    if (isCancellation(err)) {
      cancelled = true;
      cancellation = err;
    } else if (provisioned) failure = err instanceof ActivityFailure && err.cause ? err.cause.message : String(err);
    else {
      const message = err instanceof ActivityFailure && err.cause ? err.cause.message : String(err);
      const type = err instanceof ActivityFailure && err.cause instanceof ApplicationFailure ? err.cause.type : undefined;
      end = { status: 'failed', result: null, outcome: { reason: provisioningOutcome(type ?? undefined), exit_code: null, message } };
      await CancellationScope.nonCancellable(() => recordSessionOutcome({ sessionId, end }));
      setStatus('failed');
      return await finish(args, { sessionId, workflowId: workflowInfo().workflowId, status: end.status, outcome: end.outcome });
    }
  }
  // Every path with a sandbox ends here: capture, record, destroy, even when cancelled.
  const { sandboxId, taskQueue } = provisioned!;
  end = await CancellationScope.nonCancellable(() =>
    onHost(taskQueue, () =>
      hostActivities(taskQueue, args.run.timeoutSeconds).captureResultAndDestroySandbox({
        sessionId,
        sandboxId,
        exit,
        cancelled,
        failure,
        memoryMB: args.run.memoryMB,
      }),
    ),
  );
  setStatus(end.status);
  return await finish(args, { sessionId, workflowId: workflowInfo().workflowId, status: end.status, outcome: end.outcome }, cancellation);
}
