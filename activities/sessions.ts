import { Context } from '@temporalio/activity';
import { failure } from './failures';
import { saveSessionLog, sessionLogDoc, stderrTail, type HostLog } from '../store/session-logs';
import type { AgentRunSpec, SessionEnd } from '../contract/workflows';
import { claimSessionRun, markSessionRunning, readSessionResult, recordSessionEnd, sessionInputOf } from '../store/sessions';
import type { HostClient } from '../sandbox';
import type { CreatedSandbox, EntrypointStatus } from '../sandbox';
import { sandboxIdForSession } from '../lib/naming';
import { ImageError, resolveImage, type ResolvedImage } from '../services/images';
import { effectiveResources } from '../config/limits';
import { storeSecretsOf, SecretStoreMissing, SecretUnreadable } from '../store/secrets';
import { withoutOverridden, type SealedSecretSpec } from '../contract/sealed';
import { AgentEnvUnreadable, openAgentEnv } from '../store/agent-env';

import type { ActivityDeps } from './deps';
import { findHost } from '../store/hosts';
import { checkHostLost } from '../services/host-loss';
import { hostAlive } from '../services/placement';

/** Where the agent's input and result live inside a session's sandbox. */
export const AGENT_INPUT_PATH = '/tmp/agent_input.json';
export const AGENT_RESULT_PATH = '/tmp/agent_result.json';

/**
 * The session activities. Each is idempotent, since Temporal may run it again after a crash.
 */
export const createSessionActivities = (deps: ActivityDeps) => ({
  /**
   * Provisions the session's sandbox on this machine's host, writes the agent's files and the
   * input to /tmp/agent_input.json, starts the entrypoint, and marks the session `running`. An
   * entrypoint that exits within QUICK_EXIT_WAIT_MS is finished here too (result captured and
   * recorded, sandbox destroyed), so a quick session is one step in Temporal, not three.
   * A retry finds the same sandbox (its id derives from the session id) and starts nothing twice;
   * a retry after the session's ending was recorded only makes sure its sandbox is gone.
   */
  async provisionSandboxAndRunEntrypoint(args: {
    sessionId: string;
    orgId: string;
    agentId: string;
    run: AgentRunSpec;
    input?: string;
    placed?: boolean;
    rerun?: number;
  }): Promise<Provisioned> {
    // The detail tells a retry (and the workflow, after a timeout) that an attempt got this far.
    // Only a regular activity (placed on another host) heartbeats: a local one cannot, and Temporal's
    // core answered each such call with a warning in the worker's log (one per session).
    const ctx = Context.current();
    if (!ctx.info.isLocal) ctx.heartbeat('provisioning');
    // Placement: the session goes to whichever live host has room (a snapshot's layers follow it).
    if (!args.placed && deps.placeElsewhere) {
      const elsewhere = await deps.placeElsewhere().catch(() => null);
      if (elsewhere) return { sandboxId: sandboxIdForSession(args.sessionId), taskQueue: elsewhere, exit: null, end: null, redirect: elsewhere };
    }
    const sandboxId = sandboxIdForSession(args.sessionId);
    // A small input comes in the workflow's arguments; a larger one is read from MongoDB.
    const [session, ended] = await Promise.all([
      args.input !== undefined ? { input: args.input } : sessionInputOf(deps.store, args.sessionId),
      readSessionResult(deps.store, args.sessionId),
    ]);
    if (!session) throw failure('invalid_agent', `session ${args.sessionId} not found`);
    const input = session.input;
    if (ended) {
      await deps.host.destroySandbox(sandboxId);
      return { sandboxId, taskQueue: deps.hostTaskQueue, exit: null, end: { status: ended.status, result: null, outcome: ended.outcome } };
    }
    // With several hosts, one host per run of a session: a retry that lands elsewhere goes back to it.
    if (deps.hostId && (await deps.severalHosts?.())) {
      const claimant = await claimSessionRun(deps.store, args.sessionId, args.rerun ?? 0, deps.hostId);
      if (claimant !== deps.hostId) return await backToClaimant(deps, sandboxId, claimant);
    }
    // Only an agent with a snapshot pays for resolving it (its layer, the checkpoint's patches).
    const image = args.run.snapshot ? await imageOrFail(deps, args.orgId, args.run.snapshotRef?.snapshotId ?? args.run.snapshot) : null;
    // The agent's limits, else the defaults (the same variables as the host's), sent explicitly so
    // that an OOM's message names the limit that was applied.
    const { memoryMB, cpuCount, diskMB } = effectiveResources(deps.limits, args.run);
    const { env: secretEnv, sealed } = await secretEnvOrFail(deps, args.orgId, args.run.secretStore);
    const agentEnv = agentEnvOrFail(deps, args.orgId, args.agentId, args.run);
    const platformEnv = { AGENT_INPUT_PATH, AGENT_RESULT_PATH, SESSION_ID: args.sessionId, AGENT_ID: args.agentId };
    const sealedSecrets = withoutOverridden(sealed, agentEnv, platformEnv);
    const created = await createOrExplain(deps, {
      id: sandboxId,
      orgId: args.orgId,
      owner: { kind: 'session', id: args.sessionId },
      // The agent's own env wins over its store's secrets; the platform's variables win over both.
      // Sealed secrets reach the host only (it gives the sandbox placeholders): never this activity's result.
      envs: { ...image?.env, ...secretEnv, ...agentEnv, ...platformEnv },
      ...(sealedSecrets.length ? { sealedSecrets } : {}),
      files: { ...args.run.files, [AGENT_INPUT_PATH]: input },
      ...(image ? { layers: image.layers, patches: image.patches, ...(image.workdir ? { cwd: image.workdir } : {}) } : {}),
      memoryMB,
      cpuCount,
      diskMB,
      ...(args.run.network ? { network: args.run.network } : {}),
      ...userOf(deps, args.run),
      entrypoint: { argv: args.run.entrypoint, timeoutSeconds: args.run.timeoutSeconds, cwd: image?.workdir ?? '/workspace' },
      // A short entrypoint is over when the host answers, with its result file read: one call.
      awaitExit: {
        waitMs: QUICK_EXIT_WAIT_MS,
        readFile: { path: AGENT_RESULT_PATH, maxBytes: deps.resultMaxBytes },
        ...(deps.logMaxBytes > 0 ? { readLog: { maxBytes: deps.logMaxBytes } } : {}),
      },
    });
    const early = created.entrypoint;
    const started = { sandboxId, at: early && early.state !== 'none' ? new Date(early.startedAt) : new Date() };
    if (early?.state !== 'exited') {
      await markSessionRunning(deps.store, args.sessionId, sandboxId, started.at);
      return { sandboxId, taskQueue: deps.hostTaskQueue, exit: null, end: null };
    }
    // Over already: the session goes from creating to its ending, which records when it started.
    const exit = exitOf(early);
    const captured = created.file ? capturedFrom(created.file, deps.resultMaxBytes) : undefined;
    const end = await finishSession(deps, { sessionId: args.sessionId, sandboxId, exit, cancelled: false, started, memoryMB }, captured, created.log ?? null);
    return { sandboxId, taskQueue: deps.hostTaskQueue, exit, end };
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

  /**
   * Reads /tmp/agent_result.json, records how the session ended, then destroys the sandbox.
   * Exit 0 → completed; non-zero, timeout or cancellation → failed. A result that is not a JSON
   * object, or is larger than the limit, fails the session with that reason. Recording happens
   * before destroying, and only once, so a retry after a crash neither loses nor rewrites it.
   */
  async captureResultAndDestroySandbox(args: FinishArgs): Promise<SessionEnd> {
    return finishSession(deps, args);
  },

  /** Records how a session ended when it never got a sandbox. */
  async recordSessionOutcome(args: { sessionId: string; end: SessionEnd }): Promise<void> {
    // Insert-only: the first ending recorded wins, a retry never overwrites it.
    await recordSessionEnd(deps.store, args.sessionId, args.end);
  },
});

/** How long provisioning waits for a quick entrypoint to exit before handing over to awaitEntrypointExit. */
export const QUICK_EXIT_WAIT_MS = 1000;

/**
 * Where a session's sandbox lives; how its entrypoint exited and how the session ended when that
 * happened during provisioning (the sandbox is then destroyed already).
 */
export interface Provisioned {
  sandboxId: string;
  taskQueue: string;
  /** Nothing was provisioned: provision on the host of this task queue instead (placement). */
  redirect?: string;
  exit: EntrypointExit | null;
  /** The recorded ending (result data left out: it stays in MongoDB), or null while it runs. */
  end: SessionEnd | null;
}

interface FinishArgs {
  sessionId: string;
  sandboxId: string;
  exit: EntrypointExit | null;
  cancelled: boolean;
  failure?: string;
  /** Where and when the entrypoint started, recorded with the ending when no progress record was written. */
  started?: { sandboxId: string; at: Date };
  /** The sandbox's memory limit (the agent's memoryMB; absent: the default), named when it was OOM-killed. */
  memoryMB?: number;
}

/**
 * Captures the result, records the ending (first record wins), then destroys the sandbox.
 * Returns the ending without the result data, which stays out of Temporal's history.
 */
async function finishSession(deps: ActivityDeps, args: FinishArgs, captured?: Captured, log?: HostLog | null): Promise<SessionEnd> {
  const [result, hostLog] = await Promise.all([
    captured ?? captureResult(deps, args.sandboxId),
    log !== undefined || deps.logMaxBytes === 0 ? (log ?? null) : readLog(deps, args.sandboxId),
  ]);
  const end = decideEnd(args.exit, args.cancelled, result, args.failure, args.memoryMB ?? deps.limits.memoryMB);
  const logDoc = hostLog ? sessionLogDoc(args.sessionId, hostLog) : null;
  // A failed session's message ends with the last lines of its stderr.
  const tail = end.status === 'failed' ? stderrTail(logDoc) : '';
  if (tail && end.outcome) end.outcome = { ...end.outcome, message: `${end.outcome.message ?? 'the session failed'}; stderr: ${tail}` };
  // The log only when something was printed (a silent session writes nothing more), and before the
  // ending: a session that shows as ended has its log.
  if (logDoc) await saveSessionLog(deps.store, logDoc);
  await recordSessionEnd(deps.store, args.sessionId, end, args.started);
  await deps.host.destroySandbox(args.sandboxId);
  return { ...end, result: null };
}

/** The entrypoint's output, or null when the host cannot give it (the session ends without a log rather than not at all). */
async function readLog(deps: ActivityDeps, sandboxId: string): Promise<HostLog | null> {
  try {
    return await deps.host.entrypointLog(sandboxId, deps.logMaxBytes);
  } catch {
    return null;
  }
}

/** How an entrypoint exited. */
export interface EntrypointExit {
  exitCode: number;
  timedOut: boolean;
  signal: string | null;
  /** The sandbox's memory limit made the kernel kill a process of it while the entrypoint ran. */
  oomKilled?: boolean;
}

/** The exit of an entrypoint's exited status (oomKilled only when set, to keep histories small). */
function exitOf(st: Extract<EntrypointStatus, { state: 'exited' }>): EntrypointExit {
  return { exitCode: st.exitCode, timedOut: st.timedOut, signal: st.signal, ...(st.oomKilled ? { oomKilled: true } : {}) };
}

/**
 * The session's ending from the entrypoint's exit and its captured result. `memoryMB` is the
 * sandbox's memory limit, named in the message of an OOM kill.
 */
export function decideEnd(
  exit: EntrypointExit | null,
  cancelled: boolean,
  captured: { data: Record<string, unknown> | null; error?: string },
  failure?: string,
  memoryMB?: number,
): SessionEnd {
  if (cancelled)
    return {
      status: 'failed',
      result: captured.data,
      outcome: { reason: 'cancelled', exit_code: exit?.exitCode ?? null, message: 'session ended by request' },
    };
  if (!exit) return { status: 'failed', result: captured.data, outcome: { reason: null, exit_code: null, message: failure ?? 'entrypoint status unknown' } };
  if (exit.timedOut)
    return {
      status: 'failed',
      result: captured.data,
      outcome: { reason: 'timeout', exit_code: exit.exitCode, message: 'entrypoint exceeded the agent timeout' },
    };
  const limit = `the sandbox reached its memory limit${memoryMB ? ` (${memoryMB} MB)` : ''}`;
  if (exit.oomKilled && exit.exitCode !== 0) {
    // Before invalid_result: a result cut short by the kill is a symptom, the memory limit the cause.
    const how = exit.signal ? `was killed` : `exited with code ${exit.exitCode} after a process was killed`;
    return { status: 'failed', result: captured.data, outcome: { reason: 'oom', exit_code: exit.exitCode, message: `entrypoint ${how}: ${limit}` } };
  }
  if (captured.error) return { status: 'failed', result: null, outcome: { reason: 'invalid_result', exit_code: exit.exitCode, message: captured.error } };
  if (exit.exitCode !== 0) {
    const how = exit.signal ? `was killed by ${exit.signal}` : `exited with code ${exit.exitCode}`;
    return { status: 'failed', result: captured.data, outcome: { reason: 'exit_code', exit_code: exit.exitCode, message: `entrypoint ${how}` } };
  }
  // The entrypoint survived a process of its sandbox being OOM-killed and succeeded: completed, with a note.
  const note = exit.oomKilled ? `a process of the sandbox was killed: ${limit}` : null;
  return { status: 'completed', result: captured.data, outcome: { reason: null, exit_code: 0, message: note } };
}

/** The agent's snapshot resolved to layers and patches; a missing or unready one fails for good (SnapshotNotFound). */
/**
 * Provisioning of this run was claimed by another host, which may have started the entrypoint: the
 * workflow sends the provisioning there (idempotent on that host); a claimant that is lost makes the
 * session's host lost (workflows/session.ts).
 */
async function backToClaimant(deps: ActivityDeps, sandboxId: string, claimant: string): Promise<Provisioned> {
  const doc = await findHost(deps.store, claimant);
  if (!doc || (await checkHostLost(deps.store, claimant, deps.hostDeadAfterMs ?? 15_000, deps.hostToken ?? ''))) {
    throw failure('host_lost', `sandbox host ${claimant} that provisioned this session is lost`, claimant);
  }
  return { sandboxId, taskQueue: doc.taskQueue, exit: null, end: null, redirect: doc.taskQueue };
}

export async function imageOrFail(deps: ActivityDeps, orgId: string, ref: string): Promise<ResolvedImage> {
  let image: ResolvedImage;
  try {
    image = await resolveImage(deps.store, orgId, ref);
  } catch (err) {
    if (err instanceof ImageError) throw failure('snapshot_not_found', err.message);
    throw err;
  }
  await bringLayersHere(deps, image);
  return image;
}

/**
 * Copies a snapshot's layers to this host from the host that built it, when they are not here yet
 * (the host fetches them host to host and keeps them). Their only copy on a lost host fails the
 * provisioning for good, saying so; a source that is merely slow to answer is retried.
 */
async function bringLayersHere(deps: ActivityDeps, image: ResolvedImage): Promise<void> {
  if (!deps.hostId || !image.hostId || image.hostId === deps.hostId || image.layers.length === 0) return;
  const source = await findHost(deps.store, image.hostId);
  if (!source) throw failure('snapshot_not_found', `the snapshot's layers are on sandbox host ${image.hostId}, which is not registered`);
  for (const layer of image.layers) {
    try {
      await deps.host.fetchLayer(layer, source.url);
    } catch (err) {
      const e = err as { type?: string; message?: string };
      if (e.type === 'not_found') throw failure('snapshot_not_found', `layer ${layer} of the snapshot is not on sandbox host ${image.hostId} any more`);
      if (!hostAlive(source, deps.hostDeadAfterMs ?? 15_000)) {
        throw failure('snapshot_not_found', `the snapshot's layers were only on sandbox host ${image.hostId}, which is lost`);
      }
      throw err;
    }
  }
}

/**
 * The environment from the agent's secret store, opened here (never carried in workflow arguments).
 * A store deleted since the agent named it fails the session for good, saying which.
 */
export async function secretEnvOrFail(
  deps: ActivityDeps,
  orgId: string,
  name: string | undefined,
): Promise<{ env: Record<string, string>; sealed: SealedSecretSpec[] }> {
  try {
    return await storeSecretsOf(deps.store, deps.secrets, orgId, name);
  } catch (err) {
    if (err instanceof SecretStoreMissing) throw failure('invalid_agent', `the agent's ${err.message}`);
    // A retry cannot help: the key is what it is until the operator acts.
    if (err instanceof SecretUnreadable) throw failure('invalid_agent', err.message);
    throw err;
  }
}

/** The agent's env opened (it travels sealed in the run spec); a value that does not open fails the run for good. */
/** Who the agent's sandbox runs as: the agent's `user`, else SANDBOX_USER; absent: the host's default, root. */
export function userOf(deps: Pick<ActivityDeps, 'sandboxUser'>, run: AgentRunSpec): { user?: 'root' | 'sandbox' } {
  const user = run.user ?? deps.sandboxUser;
  return user ? { user } : {};
}

export function agentEnvOrFail(deps: ActivityDeps, orgId: string, agentId: string, run: AgentRunSpec): Record<string, string> {
  try {
    return openAgentEnv(deps.secrets, orgId, agentId, run.env, run.envSealed);
  } catch (err) {
    // A retry cannot help: the key is what it is until the operator acts.
    if (err instanceof AgentEnvUnreadable) throw failure('invalid_agent', err.message);
    throw err;
  }
}

/** Creates a sandbox; failures that a retry cannot fix become non-retryable. */
export async function createOrExplain(deps: ActivityDeps, req: Parameters<HostClient['createSandbox']>[0]): Promise<CreatedSandbox> {
  try {
    return await deps.host.createSandbox(req);
  } catch (err) {
    const type = (err as { type?: string }).type;
    if (type === 'patch_failed') throw failure('patch_failed', (err as Error).message);
    if (type === 'invalid_request') throw failure('invalid_agent', (err as Error).message);
    throw err;
  }
}

/** The agent's result: its data, or why it is unusable. */
type Captured = { data: Record<string, unknown> | null; error?: string };

const tooLarge = (maxBytes: number): Captured => ({ data: null, error: `${AGENT_RESULT_PATH} is larger than the ${maxBytes}-byte limit` });

/** The result from the file the host read along with the create (see CreatedSandbox.file). */
function capturedFrom(file: NonNullable<CreatedSandbox['file']>, maxBytes: number): Captured {
  if ('missing' in file) return { data: null };
  if ('tooLarge' in file) return tooLarge(maxBytes);
  return parseResult(Buffer.from(file.content, 'base64'));
}

async function captureResult(deps: ActivityDeps, sandboxId: string): Promise<Captured> {
  let raw: Buffer | null;
  try {
    raw = await deps.host.readFile(sandboxId, AGENT_RESULT_PATH, { maxBytes: deps.resultMaxBytes });
  } catch (err) {
    if ((err as { type?: string }).type === 'payload_too_large') return tooLarge(deps.resultMaxBytes);
    throw err;
  }
  if (raw === null) return { data: null };
  return parseResult(raw);
}

/** Parses a result file: a JSON object, or the reason it is refused. */
function parseResult(raw: Buffer): Captured {
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
