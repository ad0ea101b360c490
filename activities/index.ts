import { Context, ApplicationFailure } from '@temporalio/activity';
import type { Store, AgentRunSpec, SessionDoc } from '../store';
import type { HostClient } from '../sandbox/host/client';
import type { SessionEnd } from '../workflows/types';
import { sandboxIdForSession } from '../lib/naming';

/** What the activities need from the process that runs them. */
export interface ActivityDeps {
  store: Store;
  host: HostClient;
  /** Task queue of the worker beside `host`; returned by provisioning so later steps land here. */
  hostTaskQueue: string;
  resultMaxBytes: number;
}

/** Where the agent's input and result live inside a session's sandbox. */
export const AGENT_INPUT_PATH = '/tmp/agent_input.json';
export const AGENT_RESULT_PATH = '/tmp/agent_result.json';

/**
 * The session activities. Each is idempotent, since Temporal may run it again after a crash.
 */
export const createActivities = (deps: ActivityDeps) => ({
  /**
   * Provisions the session's sandbox on this machine's host, writes the agent's files and the
   * input to /tmp/agent_input.json, starts the entrypoint, and marks the session `running`.
   * A retry finds the same sandbox (its id derives from the session id) and starts nothing twice.
   */
  async provisionSandbox(args: { sessionId: string; orgId: string; agentId: string; run: AgentRunSpec }): Promise<{ sandboxId: string; taskQueue: string }> {
    const session = await deps.store.sessions.findOne({ _id: args.sessionId }, { projection: { input: 1 } });
    if (!session) throw ApplicationFailure.nonRetryable(`session ${args.sessionId} not found`, 'InvalidAgent');
    const sandboxId = sandboxIdForSession(args.sessionId);
    await deps.host.createSandbox({
      id: sandboxId,
      orgId: args.orgId,
      owner: { kind: 'session', id: args.sessionId },
      envs: { ...args.run.env, AGENT_INPUT_PATH, AGENT_RESULT_PATH, SESSION_ID: args.sessionId, AGENT_ID: args.agentId },
      files: { ...args.run.files, [AGENT_INPUT_PATH]: JSON.stringify(session.input ?? {}) },
      entrypoint: { argv: args.run.entrypoint, timeoutSeconds: args.run.timeoutSeconds, cwd: '/workspace' },
    });
    const now = new Date();
    await deps.store.sessions.updateOne(
      { _id: args.sessionId, status: 'creating' },
      { $set: { status: 'running', sandbox_id: sandboxId, started_at: now, updated_at: now } },
    );
    return { sandboxId, taskQueue: deps.hostTaskQueue };
  },

  /**
   * Waits for the entrypoint to exit, heartbeating, then reads /tmp/agent_result.json.
   * Exit 0 → completed; non-zero or timeout → failed. A result that is not a JSON object, or is
   * larger than the limit, fails the session with that reason. The agent's failure is a result,
   * never an exception, so it is not retried.
   */
  async awaitEntrypointExit(args: { sessionId: string; sandboxId: string }): Promise<SessionEnd> {
    const ctx = Context.current();
    for (;;) {
      ctx.heartbeat();
      const st = await deps.host.entrypointStatus(args.sandboxId, { waitMs: 5000, signal: ctx.cancellationSignal });
      if (st.state === 'none') throw ApplicationFailure.nonRetryable(`sandbox ${args.sandboxId} has no entrypoint`, 'SandboxLost');
      if (st.state === 'running') continue;
      const captured = await captureResult(deps, args.sandboxId);
      if (st.timedOut) {
        return { status: 'failed', result: captured.data, outcome: { reason: 'timeout', exit_code: st.exitCode, message: 'entrypoint exceeded the agent timeout' } };
      }
      if (captured.error) {
        return { status: 'failed', result: null, outcome: { reason: 'invalid_result', exit_code: st.exitCode, message: captured.error } };
      }
      if (st.exitCode !== 0) {
        const how = st.signal ? `was killed by ${st.signal}` : `exited with code ${st.exitCode}`;
        return { status: 'failed', result: captured.data, outcome: { reason: 'exit_code', exit_code: st.exitCode, message: `entrypoint ${how}` } };
      }
      return { status: 'completed', result: captured.data, outcome: { reason: null, exit_code: 0, message: null } };
    }
  },

  /** Destroys the sandbox (whatever runs in it is killed) and records how the session ended. */
  async destroySandboxAndRecordOutcome(args: { sessionId: string; sandboxId: string; end: SessionEnd }): Promise<void> {
    await deps.host.destroySandbox(args.sandboxId);
    await recordOutcome(deps, args.sessionId, args.end);
  },

  /** Records how a session ended when it never got a sandbox. */
  async recordSessionOutcome(args: { sessionId: string; end: SessionEnd }): Promise<void> {
    await recordOutcome(deps, args.sessionId, args.end);
  },
});

export type Activities = ReturnType<typeof createActivities>;

async function recordOutcome(deps: ActivityDeps, sessionId: string, end: SessionEnd): Promise<void> {
  const now = new Date();
  const update: Partial<SessionDoc> = { status: end.status, result: end.result, outcome: end.outcome, completed_at: now, updated_at: now };
  // Only a session that has not ended yet is written: a retry never overwrites the first outcome.
  await deps.store.sessions.updateOne({ _id: sessionId, status: { $in: ['creating', 'running'] } }, { $set: update });
}

async function captureResult(deps: ActivityDeps, sandboxId: string): Promise<{ data: Record<string, unknown> | null; error?: string }> {
  let raw: Buffer | null;
  try {
    raw = await deps.host.readFile(sandboxId, AGENT_RESULT_PATH, { maxBytes: deps.resultMaxBytes });
  } catch (err) {
    if ((err as { type?: string }).type === 'payload_too_large') {
      return { data: null, error: `${AGENT_RESULT_PATH} is larger than the ${deps.resultMaxBytes}-byte limit` };
    }
    throw err;
  }
  if (raw === null) return { data: null };
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw.toString('utf8'));
  } catch {
    return { data: null, error: `${AGENT_RESULT_PATH} is not valid JSON` };
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    return { data: null, error: `${AGENT_RESULT_PATH} must hold a JSON object` };
  }
  return { data: parsed as Record<string, unknown> };
}
