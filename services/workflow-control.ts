import { WorkflowExecutionAlreadyStartedError, WorkflowNotFoundError, type Client, type WorkflowHandle, type WorkflowStartOptions } from '@temporalio/client';
import { WorkflowIdReusePolicy } from '@temporalio/common';
import type * as workflows from '../workflows';

/** How long ending a workflow by request waits for it to close before answering. */
export const END_WAIT_MS = 15_000;

/**
 * The workflows the worker runs, by the names it registers them under: the exports of
 * workflows/index.ts (its workflowsPath). Imported as types only, so this process loads no workflow
 * code, yet a start names a workflow that exists and passes the arguments its function takes.
 */
type Workflows = typeof workflows;
export type WorkflowName = keyof Workflows;

/**
 * Starts the workflow `name` (checked against workflows/index.ts, with `options.args` checked
 * against its function's parameters) whose id is its resource's id (a second start of the same id is
 * refused by Temporal, REJECT_DUPLICATE); starting one that already exists is not an error, so a
 * retried create makes sure its workflow runs. Anything else Temporal says is thrown.
 */
export async function startWorkflowOnce<N extends WorkflowName>(
  temporal: Client,
  name: N,
  options: Omit<WorkflowStartOptions<Workflows[N]>, 'workflowIdReusePolicy'>,
): Promise<void> {
  // The spread of a generic conditional type is not seen as one again: its parts were checked above.
  const started = { ...options, workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE } as WorkflowStartOptions<Workflows[N]>;
  try {
    await temporal.workflow.start<Workflows[N]>(name, started);
  } catch (err) {
    if (err instanceof WorkflowExecutionAlreadyStartedError) return;
    throw err;
  }
}

/**
 * Asks a workflow to end (`ask`: cancel it, or signal it) and waits up to END_WAIT_MS for it to
 * close, however it closes. Returns false when Temporal knows no such workflow (never started, or
 * gone), for the caller to record the end itself; any other failure is thrown.
 */
export async function endWorkflowAndWait(temporal: Client, workflowId: string, ask: (handle: WorkflowHandle) => Promise<unknown>): Promise<boolean> {
  const handle = temporal.workflow.getHandle(workflowId);
  try {
    await ask(handle);
    await Promise.race([handle.result().catch(() => undefined), new Promise((r) => setTimeout(r, END_WAIT_MS).unref())]);
    return true;
  } catch (err) {
    if (err instanceof WorkflowNotFoundError) return false;
    throw err;
  }
}

/**
 * Waits up to `ms` for a workflow to close (one long poll on Temporal), or until `signal` aborts.
 * True when it has closed (or Temporal knows no such workflow); false when the wait ended first.
 */
export async function waitForClose(temporal: Client, workflowId: string, ms: number, signal?: AbortSignal): Promise<boolean> {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), ms);
  const gone = () => abort.abort();
  signal?.addEventListener('abort', gone);
  try {
    await temporal.withAbortSignal(abort.signal, () => temporal.workflow.getHandle(workflowId).result());
    return true;
  } catch (err) {
    return !abort.signal.aborted || err instanceof WorkflowNotFoundError;
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener('abort', gone);
  }
}
