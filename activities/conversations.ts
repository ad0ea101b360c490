import { Context } from '@temporalio/activity';
import type { TurnOutcome } from '../contract/conversations';
import { effectiveResources } from '../config/limits';
import { withoutOverridden, type SealedSecretSpec } from '../contract/sealed';
import type { AgentRunSpec } from '../contract/workflows';
import { updateConversation } from '../store/conversations';
import { deleteSandboxRecord, findSandbox, insertSandboxOnce, markSandboxStopped, recordHibernation, updateSandbox, type SandboxDoc } from '../store/sandboxes';
import { HIBERNATION_LAYER_MARK } from '../sandbox';
import { checkpointTurn, evaluateTurn, runTurn, type RunTurnArgs, type TurnDeps } from '../services/conversations/turns';
import { rewindTo, turnEnded } from '../services/conversations/lifecycle';
import type { ActivityDeps } from './deps';
import { agentEnvOrFail, createOrExplain, imageOrFail, secretEnvOrFail, userOf } from './sessions';

const sealedField = (s: SealedSecretSpec[]) => (s.length ? { sealedSecrets: s } : {});

/** A conversation's sandbox id (derived, so a retried provisioning finds the one it made). */
export const sandboxIdForConversation = (conversationId: string): string => `sb-${conversationId.replace(/^conv_/, 'c')}`;

async function turnDeps(deps: ActivityDeps): Promise<TurnDeps> {
  return { store: deps.store, host: deps.host, hostId: deps.hostId ?? (await deps.host.health()).hostId };
}

/**
 * The conversation activities: adapters from Temporal's calls to services/conversations/. Each is
 * idempotent (Temporal may run it again after a crash).
 */
export const createConversationActivities = (deps: ActivityDeps) => ({
  /**
   * Creates the conversation's sandbox on this worker's host, from the agent's image, or over a
   * parent's turn checkpoint (`fromLayer`) for a fork; recorded as a sandbox of the organisation
   * (owner `instance`, no idle timeout) before it is created.
   */
  async provisionConversation(args: {
    conversationId: string;
    orgId: string;
    agentId: string;
    run: AgentRunSpec;
    fromLayer: string | null;
  }): Promise<{ sandboxId: string; taskQueue: string }> {
    Context.current().heartbeat();
    const sandboxId = sandboxIdForConversation(args.conversationId);
    const image = !args.fromLayer && args.run.snapshot ? await imageOrFail(deps, args.orgId, args.run.snapshotRef?.snapshotId ?? args.run.snapshot) : null;
    const { env: secretEnv, sealed } = await secretEnvOrFail(deps, args.orgId, args.run.secretStore);
    const agentEnv = agentEnvOrFail(deps, args.orgId, args.agentId, args.run);
    const { hostId } = await turnDeps(deps);
    const { memoryMB, cpuCount, diskMB } = effectiveResources(deps.limits, args.run);
    const now = new Date();
    const record: SandboxDoc = {
      _id: sandboxId,
      orgId: args.orgId,
      hostId,
      status: 'running',
      templateID: 'base',
      metadata: JSON.stringify({ conversationId: args.conversationId, agentId: args.agentId }),
      fromCheckpoint: null,
      snapshot: image?.snapshotId ?? null,
      timeout: 0,
      memoryMB,
      cpuCount,
      diskMB,
      instanceId: null,
      createdAt: now,
      updatedAt: now,
    };
    await insertSandboxOnce(deps.store, record);
    const layers = args.fromLayer ? [args.fromLayer] : (image?.layers ?? null);
    try {
      await createOrExplain(deps, {
        id: sandboxId,
        orgId: args.orgId,
        owner: { kind: 'instance', id: args.conversationId },
        envs: { ...image?.env, ...secretEnv, ...agentEnv, CONVERSATION_ID: args.conversationId, AGENT_ID: args.agentId },
        ...sealedField(withoutOverridden(sealed, agentEnv, { CONVERSATION_ID: '', AGENT_ID: '' })),
        // A fork's files are its parent's at the turn: the agent's files are already in the layer.
        ...(args.fromLayer ? {} : { files: args.run.files }),
        ...(layers ? { layers } : {}),
        ...(image ? { patches: image.patches, ...(image.workdir ? { cwd: image.workdir } : {}) } : {}),
        memoryMB,
        cpuCount,
        diskMB,
        ...(args.run.network ? { network: args.run.network } : {}),
        ...userOf(deps, args.run),
        metadata: { conversationId: args.conversationId, agentId: args.agentId },
      });
    } catch (err) {
      await deleteSandboxRecord(deps.store, sandboxId);
      throw err;
    }
    await updateConversation(deps.store, args.conversationId, { sandboxId, hostId });
    return { sandboxId, taskQueue: deps.hostTaskQueue };
  },

  /** The sandbox is up: the conversation is `idle` (or `running` when a message waits). */
  async markConversationReady(args: { conversationId: string; sandboxId: string; queued: boolean }): Promise<void> {
    await updateConversation(deps.store, args.conversationId, { status: args.queued ? 'running' : 'idle' });
  },

  /** Runs one turn (services/conversations/turns.ts runTurn), heartbeating; a retry is the next attempt. */
  async runConversationTurn(args: Omit<RunTurnArgs, 'attempt' | 'scrub' | 'heartbeat'> & { agentId: string; run: AgentRunSpec }): Promise<TurnOutcome> {
    const ctx = Context.current();
    const { agentId, run, ...turn } = args;
    // What the sandbox was given as secrets (its store's and the agent's env) is never stored in an event.
    const { env: secretEnv } = await secretEnvOrFail(deps, args.orgId, run.secretStore);
    const agentEnv = agentEnvOrFail(deps, args.orgId, agentId, run);
    const scrub = [...Object.values(secretEnv), ...Object.values(agentEnv)].filter((v) => v.length >= 8);
    return runTurn(await turnDeps(deps), { ...turn, attempt: ctx.info.attempt, scrub, heartbeat: () => ctx.heartbeat() });
  },

  /** The checkpoint at a turn's end (turn 0: the conversation's starting point). */
  async checkpointConversationTurn(args: {
    conversationId: string;
    orgId: string;
    sandboxId: string;
    turn: number;
    after: number;
    outcome: TurnOutcome | null;
  }) {
    return checkpointTurn(await turnDeps(deps), args);
  },

  /** Records a turn's end on the conversation (status, head, tokens). */
  async recordTurnEnd(args: { conversationId: string; turn: number; outcome: TurnOutcome; tokensUsed: number; queued: boolean }): Promise<void> {
    await turnEnded(deps.store, args);
  },

  /** Best-of-N: the evaluation command in the sandbox, its exit code and output tail recorded on the turn. */
  async evaluateConversationTurn(args: { conversationId: string; orgId: string; sandboxId: string; turn: number; command: string }) {
    return evaluateTurn(await turnDeps(deps), args);
  },

  /** Puts the sandbox back to a turn's checkpoint; later turns are marked left. */
  async rewindConversation(args: {
    conversationId: string;
    orgId: string;
    sandboxId: string;
    turn: number;
    layerId: string;
    sleeping: boolean;
  }): Promise<void> {
    if (args.sleeping) await deps.host.wake(args.sandboxId);
    await deps.host.restore(args.sandboxId, args.layerId);
    await updateSandbox(deps.store, args.sandboxId, { status: 'running', updatedAt: new Date() });
    await rewindTo(deps.store, args.conversationId, args.turn);
  },

  /** Hibernates the idle conversation's sandbox to disk. */
  async sleepConversation(args: { conversationId: string; sandboxId: string }): Promise<void> {
    const doc = await findSandbox(deps.store, args.sandboxId);
    if (doc && doc.status === 'running') {
      const r = await deps.host.hibernate(args.sandboxId, `${args.sandboxId}${HIBERNATION_LAYER_MARK}${Date.now().toString(36)}`);
      await recordHibernation(deps.store, doc, r.layerId);
    }
    await updateConversation(deps.store, args.conversationId, { sleeping: true });
  },

  /** Wakes the conversation's hibernated sandbox. */
  async wakeConversation(args: { conversationId: string; sandboxId: string }): Promise<void> {
    await deps.host.wake(args.sandboxId);
    await updateSandbox(deps.store, args.sandboxId, { status: 'running', updatedAt: new Date() });
    await updateConversation(deps.store, args.conversationId, { sleeping: false });
  },

  /** Destroys the conversation's sandbox (its turn checkpoints stay) and records it archived. */
  async endConversation(args: { conversationId: string; sandboxId: string; sleeping: boolean }): Promise<void> {
    await deps.host.destroySandbox(args.sandboxId);
    await markSandboxStopped(deps.store, args.sandboxId);
    await updateConversation(deps.store, args.conversationId, { status: 'archived', sleeping: false });
  },

  /** Records a conversation that ended without a sandbox. */
  async recordConversationEnd(args: { conversationId: string; status: 'failed' | 'archived'; error: string | null }): Promise<void> {
    await updateConversation(deps.store, args.conversationId, { status: args.status, error: args.error });
  },
});
