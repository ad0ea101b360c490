import { Context } from '@temporalio/activity';
import { failure, withFailureTypes } from './failures';
import type { SessionEnd } from '../contract/workflows';
import { exitOf, type EntrypointExit, type FinishArgs, type ProvisionArgs, type Provisioned } from '../services/sessions/session-runs';
import type { ActivityDeps } from './deps';

export type { EntrypointExit, Provisioned } from '../services/sessions/session-runs';

/**
 * The session activities: adapters from Temporal's calls to the session-run service
 * (services/sessions/session-runs.ts). Each is idempotent, since Temporal may run it again after a crash.
 */
export const createSessionActivities = (deps: ActivityDeps) => ({
  /**
   * Provisions the session's sandbox and starts its entrypoint (services/sessions/session-runs.ts provision):
   * a quick entrypoint is finished here too, and placement may send the provisioning to another host.
   */
  async provisionSandboxAndRunEntrypoint(args: ProvisionArgs): Promise<Provisioned> {
    // The detail tells a retry (and the workflow, after a timeout) that an attempt got this far.
    // Only a regular activity (placed on another host) heartbeats: a local one cannot, and Temporal's
    // core answered each such call with a warning in the worker's log (one per session).
    const ctx = Context.current();
    if (!ctx.info.isLocal) ctx.heartbeat('provisioning');
    return withFailureTypes(deps.services.sessionRuns.provision(args));
  },

  /**
   * Waits for the entrypoint to exit, heartbeating, and reports how it exited. The agent's
   * failure is a result, never an exception, so it is not retried.
   */
  async awaitEntrypointExit(args: { sessionId: string; sandboxId: string }): Promise<EntrypointExit> {
    const ctx = Context.current();
    for (;;) {
      ctx.heartbeat();
      const st = await deps.host.entrypointStatus(args.sandboxId, { waitMs: 5000, signal: ctx.cancellationSignal });
      if (st.state === 'none') throw failure('sandbox_lost', `sandbox ${args.sandboxId} has no entrypoint`);
      if (st.state === 'exited') return exitOf(st);
    }
  },

  /** Reads the result, records how the session ended, then destroys the sandbox (services/sessions/session-runs.ts finish). */
  async captureResultAndDestroySandbox(args: FinishArgs): Promise<SessionEnd> {
    return withFailureTypes(deps.services.sessionRuns.finish(args));
  },

  /** Records how a session ended when it never got a sandbox (the first ending recorded wins). */
  async recordSessionOutcome(args: { sessionId: string; end: SessionEnd }): Promise<void> {
    await withFailureTypes(deps.services.sessionRuns.recordEnd(args));
  },
});
