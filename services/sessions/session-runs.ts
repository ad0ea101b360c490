/**
 * The steps of a session's workflow on the host beside the worker: provision the sandbox and start
 * the entrypoint, capture the result and record the ending, record an ending without a sandbox. Each
 * is idempotent, since Temporal may run its activity again after a crash. What a retry cannot fix
 * throws a StepFailure (contract/errors.ts), which the activity reports as the registry's failure type.
 */
import { effectiveResources } from '../../config/limits';
import { StepFailure } from '../../contract/errors';
import { withoutOverridden } from '../../contract/sealed';
import type { AgentRunSpec, SessionEnd } from '../../contract/workflows';
import { sandboxIdForSession } from '../../lib/naming';
import type { CreatedSandbox, EntrypointStatus } from '../../sandbox';
import { findHost } from '../../store/hosts';
import { saveSessionLog, sessionLogDoc, stderrTail, type HostLog } from '../../store/session-logs';
import { claimSessionRun, markSessionRunning, readSessionResult, recordSessionEnd, sessionInputOf } from '../../store/sessions';
import { agentEnvOrFail, createOrExplain, imageOrFail, secretEnvOrFail, userOf } from '../agents/agent-sandbox';
import { checkHostLost } from '../hosts/host-loss';
import type { LocalRunDeps } from '../hosts/local-host';

/** Where the agent's input and result live inside a session's sandbox. */
export const AGENT_INPUT_PATH = '/tmp/agent_input.json';
export const AGENT_RESULT_PATH = '/tmp/agent_result.json';

/** How long provisioning waits for a quick entrypoint to exit before handing over to awaitEntrypointExit. */
export const QUICK_EXIT_WAIT_MS = 1000;

/** What provisioning is asked: the session, its agent's run spec, its input when small, and whether placement already chose this host. */
export interface ProvisionArgs {
  sessionId: string;
  orgId: string;
  agentId: string;
  run: AgentRunSpec;
  input?: string;
  placed?: boolean;
  rerun?: number;
}

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

export interface FinishArgs {
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

/** How an entrypoint exited. */
export interface EntrypointExit {
  exitCode: number;
  timedOut: boolean;
  signal: string | null;
  /** The sandbox's memory limit made the kernel kill a process of it while the entrypoint ran. */
  oomKilled?: boolean;
}

/** The session-run service: the session workflow's steps on the local host (see the module's comment). */
export function createSessionRunService(deps: LocalRunDeps) {
  return {
    /**
     * Provisions the session's sandbox on this machine's host, writes the agent's files and the
     * input to /tmp/agent_input.json, starts the entrypoint, and marks the session `running`. An
     * entrypoint that exits within QUICK_EXIT_WAIT_MS is finished here too (result captured and
     * recorded, sandbox destroyed), so a quick session is one step in Temporal, not three.
     * A retry finds the same sandbox (its id derives from the session id) and starts nothing twice;
     * a retry after the session's ending was recorded only makes sure its sandbox is gone.
     */
    provision: (args: ProvisionArgs): Promise<Provisioned> => provision(deps, args),
    /**
     * Reads /tmp/agent_result.json, records how the session ended, then destroys the sandbox.
     * Exit 0 → completed; non-zero, timeout or cancellation → failed. A result that is not a JSON
     * object, or is larger than the limit, fails the session with that reason. Recording happens
     * before destroying, and only once, so a retry after a crash neither loses nor rewrites it.
     */
    finish: (args: FinishArgs): Promise<SessionEnd> => finishSession(deps, args),
    /** Records how a session ended when it never got a sandbox. Insert-only: the first ending recorded wins, a retry never overwrites it. */
    async recordEnd(args: { sessionId: string; end: SessionEnd }): Promise<void> {
      await recordSessionEnd(deps.store, args.sessionId, args.end);
    },
  };
}

export type SessionRunService = ReturnType<typeof createSessionRunService>;

async function provision(deps: LocalRunDeps, args: ProvisionArgs): Promise<Provisioned> {
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
  if (!session) throw new StepFailure('invalid_agent', `session ${args.sessionId} not found`);
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
}

/**
 * Captures the result, records the ending (first record wins), then destroys the sandbox.
 * Returns the ending without the result data, which stays out of Temporal's history.
 */
async function finishSession(deps: LocalRunDeps, args: FinishArgs, captured?: Captured, log?: HostLog | null): Promise<SessionEnd> {
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
async function readLog(deps: LocalRunDeps, sandboxId: string): Promise<HostLog | null> {
  try {
    return await deps.host.entrypointLog(sandboxId, deps.logMaxBytes);
  } catch {
    return null;
  }
}

/** The exit of an entrypoint's exited status (oomKilled only when set, to keep histories small). */
export function exitOf(st: Extract<EntrypointStatus, { state: 'exited' }>): EntrypointExit {
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

/**
 * Provisioning of this run was claimed by another host, which may have started the entrypoint: the
 * workflow sends the provisioning there (idempotent on that host); a claimant that is lost makes the
 * session's host lost (workflows/session.ts).
 */
async function backToClaimant(deps: LocalRunDeps, sandboxId: string, claimant: string): Promise<Provisioned> {
  const doc = await findHost(deps.store, claimant);
  if (!doc || (await checkHostLost(deps.store, claimant, deps.hostDeadAfterMs ?? 15_000, deps.hostToken ?? ''))) {
    throw new StepFailure('host_lost', `sandbox host ${claimant} that provisioned this session is lost`, claimant);
  }
  return { sandboxId, taskQueue: doc.taskQueue, exit: null, end: null, redirect: doc.taskQueue };
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

async function captureResult(deps: LocalRunDeps, sandboxId: string): Promise<Captured> {
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
