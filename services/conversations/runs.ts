/**
 * The steps of a conversation's workflow on the host beside the worker: its sandbox (provision,
 * rewind, sleep, wake, end), its turns (services/conversations/turns.ts) and what its record says
 * as it moves (services/conversations/lifecycle.ts). Each is idempotent (Temporal may run its
 * activity again after a crash).
 */
import type { TurnOutcome } from '../../contract/conversations';
import { ApiError, StepFailure } from '../../contract/errors';
import type { AgentRunSpec } from '../../contract/workflows';
import { HIBERNATION_LAYER_MARK } from '../../sandbox';
import { updateConversation } from '../../store/conversations';
import { findSandbox, markSandboxStopped, recordHibernation, updateSandbox } from '../../store/sandboxes';
import { agentEnvOrFail, createAgentSandbox, secretEnvOrFail } from '../agents/agent-sandbox';
import type { LocalRunDeps } from '../hosts/local-host';
import { claimRewindTarget, rewindTo, turnEnded } from './lifecycle';
import { collectConversationCheckpoints, type GcDeps } from './checkpoint-gc';
import { checkpointTurn, evaluateTurn, runTurn, type RunTurnArgs, type TurnDeps } from './turns';

/** What a conversation's sandbox is made from: the agent's run spec, or a fork's parent turn checkpoint (`fromLayer`). */
export interface ConversationProvision {
  conversationId: string;
  orgId: string;
  agentId: string;
  run: AgentRunSpec;
  fromLayer: string | null;
}

/** A conversation's sandbox id (derived, so a retried provisioning finds the one it made). */
export const sandboxIdForConversation = (conversationId: string): string => `sb-${conversationId.replace(/^conv_/, 'c')}`;

async function turnDeps(deps: LocalRunDeps): Promise<TurnDeps> {
  return { store: deps.store, host: deps.host, hostId: deps.hostId ?? (await deps.host.health()).hostId };
}

/**
 * The conversation steps' service: `gcDeps` (the hosts' directory, a released layer is released on
 * every live host) for the checkpoint garbage collection.
 */
export function createConversationRunService(deps: LocalRunDeps, gcDeps: GcDeps) {
  return {
    /**
     * Creates the conversation's sandbox on this worker's host, from the agent's image, or over a
     * parent's turn checkpoint (`fromLayer`) for a fork; recorded as a sandbox of the organisation
     * (owner `instance`, no idle timeout) before it is created.
     */
    async provision(args: ConversationProvision): Promise<{ sandboxId: string; taskQueue: string }> {
      const sandboxId = sandboxIdForConversation(args.conversationId);
      const { hostId } = await turnDeps(deps);
      const owner = { envName: 'CONVERSATION_ID', id: args.conversationId, instanceId: null, metadataKey: 'conversationId' } as const;
      await createAgentSandbox(deps, { ...args, sandboxId, hostId, owner });
      await updateConversation(deps.store, args.conversationId, { sandboxId, hostId });
      return { sandboxId, taskQueue: deps.hostTaskQueue };
    },

    /** The sandbox is up: the conversation is `idle` (or `running` when a message waits). */
    async markReady(args: { conversationId: string; sandboxId: string; queued: boolean }): Promise<void> {
      await updateConversation(deps.store, args.conversationId, { status: args.queued ? 'running' : 'idle' });
    },

    /**
     * Runs one turn (services/conversations/turns.ts runTurn); `attempt` is the activity's attempt.
     * What the sandbox was given as secrets (its store's and the agent's env) is never stored in an event.
     */
    async runTurn(args: Omit<RunTurnArgs, 'scrub'> & { agentId: string; run: AgentRunSpec }): Promise<TurnOutcome> {
      const { agentId, run, ...turn } = args;
      const { env: secretEnv } = await secretEnvOrFail(deps, args.orgId, run.secretStore);
      const agentEnv = agentEnvOrFail(deps, args.orgId, agentId, run);
      const scrub = [...Object.values(secretEnv), ...Object.values(agentEnv)].filter((v) => v.length >= 8);
      return runTurn(await turnDeps(deps), { ...turn, scrub });
    },

    /** The checkpoint at a turn's end (turn 0: the conversation's starting point). */
    async checkpointTurn(args: { conversationId: string; orgId: string; sandboxId: string; turn: number; after: number; outcome: TurnOutcome | null }) {
      return checkpointTurn(await turnDeps(deps), args);
    },

    /** Records a turn's end on the conversation (status, head, tokens). */
    async recordTurnEnd(args: { conversationId: string; turn: number; outcome: TurnOutcome; tokensUsed: number; queued: boolean }): Promise<void> {
      await turnEnded(deps.store, args);
    },

    /** Best-of-N: the evaluation command in the sandbox, its exit code and output tail recorded on the turn. */
    async evaluateTurn(args: { conversationId: string; orgId: string; sandboxId: string; turn: number; command: string }) {
      return evaluateTurn(await turnDeps(deps), args);
    },

    /** Puts the sandbox back to a turn's checkpoint; later turns are marked left. */
    async rewind(args: { conversationId: string; orgId: string; sandboxId: string; turn: number; layerId: string; sleeping: boolean }): Promise<void> {
      // The turn's checkpoint is claimed first: the garbage collection cannot free it under the rewind (409 when it was freed).
      const release = await claimRewindTarget(deps.store, args.conversationId, args.turn).catch((err: unknown) => {
        if (err instanceof ApiError && err.type === 'conflict') throw new StepFailure('checkpoint_freed', err.message);
        throw err;
      });
      try {
        if (args.sleeping) await deps.host.wake(args.sandboxId);
        await deps.host.restore(args.sandboxId, args.layerId);
        await updateSandbox(deps.store, args.sandboxId, { status: 'running', updatedAt: new Date() });
        await rewindTo(deps.store, args.conversationId, args.turn);
      } finally {
        await release();
      }
    },

    /** Frees the checkpoints of left turns that nothing reaches (./checkpoint-gc.ts); answers their turns. */
    collectCheckpoints(args: { conversationId: string }): Promise<number[]> {
      return collectConversationCheckpoints(gcDeps, args.conversationId);
    },

    /** Hibernates the idle conversation's sandbox to disk. */
    async sleep(args: { conversationId: string; sandboxId: string }): Promise<void> {
      const doc = await findSandbox(deps.store, args.sandboxId);
      if (doc && doc.status === 'running') {
        const r = await deps.host.hibernate(args.sandboxId, `${args.sandboxId}${HIBERNATION_LAYER_MARK}${Date.now().toString(36)}`);
        await recordHibernation(deps.store, doc, r.layerId);
      }
      await updateConversation(deps.store, args.conversationId, { sleeping: true });
    },

    /** Wakes the conversation's hibernated sandbox. */
    async wake(args: { conversationId: string; sandboxId: string }): Promise<void> {
      await deps.host.wake(args.sandboxId);
      await updateSandbox(deps.store, args.sandboxId, { status: 'running', updatedAt: new Date() });
      await updateConversation(deps.store, args.conversationId, { sleeping: false });
    },

    /** Destroys the conversation's sandbox (its turn checkpoints stay) and records it archived. */
    async end(args: { conversationId: string; sandboxId: string; sleeping: boolean }): Promise<void> {
      await deps.host.destroySandbox(args.sandboxId);
      await markSandboxStopped(deps.store, args.sandboxId);
      await updateConversation(deps.store, args.conversationId, { status: 'archived', sleeping: false });
    },

    /** Records a conversation that ended without a sandbox. */
    async recordEnd(args: { conversationId: string; status: 'failed' | 'archived'; error: string | null }): Promise<void> {
      await updateConversation(deps.store, args.conversationId, { status: args.status, error: args.error });
    },
  };
}

export type ConversationRunService = ReturnType<typeof createConversationRunService>;
