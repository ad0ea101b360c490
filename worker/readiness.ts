import type { Worker } from '@temporalio/worker';
import type { HostClient } from '../sandbox';

/** The worker process's readiness, as its metrics port reports it on GET /readyz. */
export interface WorkerReadiness {
  ok: boolean;
  /** What is missing, when not ok. */
  message: string;
  workers: Record<string, string>;
  host: string;
}

/** How long the sandbox host may take to answer a readiness probe. */
const HOST_PROBE_MS = 3_000;

/**
 * Ready when every Temporal worker of the process is RUNNING and the sandbox host beside it answers.
 * `workers()` is empty until they are created (the metrics port listens before that).
 */
export function workerReadiness(deps: {
  workers: () => { name: string; worker: Pick<Worker, 'getState'> }[];
  host: Pick<HostClient, 'health'>;
}): () => Promise<WorkerReadiness> {
  return async () => {
    const list = deps.workers();
    const workers = Object.fromEntries(list.map(({ name, worker }) => [name, worker.getState()]));
    const problems: string[] = [];
    if (!list.length) problems.push('Temporal workers are not created yet');
    for (const [name, state] of Object.entries(workers)) if (state !== 'RUNNING') problems.push(`Temporal worker ${name} is ${state}`);
    let host = 'ok';
    try {
      await deps.host.health({ signal: AbortSignal.timeout(HOST_PROBE_MS) });
    } catch (err) {
      host = `error: ${err instanceof Error ? err.message : String(err)}`;
      problems.push(`sandbox host does not answer (${err instanceof Error ? err.message : String(err)})`);
    }
    return { ok: problems.length === 0, message: problems.length ? `not ready: ${problems.join('; ')}` : 'ok', workers, host };
  };
}
