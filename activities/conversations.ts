import { Context } from '@temporalio/activity';
import type { TurnOutcome } from '../contract/conversations';
import type { AgentRunSpec } from '../contract/workflows';
import type { RunTurnArgs } from '../services/conversations/turns';
import type { ConversationProvision } from '../services/conversations/runs';
import { withFailureTypes } from './failures';
import type { ActivityDeps } from './deps';

/**
 * The conversation activities: adapters from Temporal's calls to the conversation-run service
 * (services/conversations/runs.ts). Each is idempotent (Temporal may run it again after a crash).
 */
export const createConversationActivities = (deps: ActivityDeps) => {
  const runs = deps.services.conversationRuns;
  return {
    /** Creates the conversation's sandbox on this worker's host, from the agent's image or over a fork's turn checkpoint. */
    async provisionConversation(args: ConversationProvision): Promise<{ sandboxId: string; taskQueue: string }> {
      Context.current().heartbeat();
      return withFailureTypes(runs.provision(args));
    },

    /** The sandbox is up: the conversation is `idle` (or `running` when a message waits). */
    async markConversationReady(args: { conversationId: string; sandboxId: string; queued: boolean }): Promise<void> {
      await withFailureTypes(runs.markReady(args));
    },

    /** Runs one turn, heartbeating; a retry is the next attempt. */
    async runConversationTurn(args: Omit<RunTurnArgs, 'attempt' | 'scrub' | 'heartbeat'> & { agentId: string; run: AgentRunSpec }): Promise<TurnOutcome> {
      const ctx = Context.current();
      return withFailureTypes(runs.runTurn({ ...args, attempt: ctx.info.attempt, heartbeat: () => ctx.heartbeat() }));
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
      return withFailureTypes(runs.checkpointTurn(args));
    },

    /** Records a turn's end on the conversation (status, head, tokens). */
    async recordTurnEnd(args: { conversationId: string; turn: number; outcome: TurnOutcome; tokensUsed: number; queued: boolean }): Promise<void> {
      await withFailureTypes(runs.recordTurnEnd(args));
    },

    /** Best-of-N: the evaluation command in the sandbox, its exit code and output tail recorded on the turn. */
    async evaluateConversationTurn(args: { conversationId: string; orgId: string; sandboxId: string; turn: number; command: string }) {
      return withFailureTypes(runs.evaluateTurn(args));
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
      await withFailureTypes(runs.rewind(args));
    },

    /** Frees the checkpoints of left turns that nothing reaches; answers their turns. */
    async collectConversationCheckpoints(args: { conversationId: string }): Promise<number[]> {
      return withFailureTypes(runs.collectCheckpoints(args));
    },

    /** Hibernates the idle conversation's sandbox to disk. */
    async sleepConversation(args: { conversationId: string; sandboxId: string }): Promise<void> {
      await withFailureTypes(runs.sleep(args));
    },

    /** Wakes the conversation's hibernated sandbox. */
    async wakeConversation(args: { conversationId: string; sandboxId: string }): Promise<void> {
      await withFailureTypes(runs.wake(args));
    },

    /** Destroys the conversation's sandbox (its turn checkpoints stay) and records it archived. */
    async endConversation(args: { conversationId: string; sandboxId: string; sleeping: boolean }): Promise<void> {
      await withFailureTypes(runs.end(args));
    },

    /** Records a conversation that ended without a sandbox. */
    async recordConversationEnd(args: { conversationId: string; status: 'failed' | 'archived'; error: string | null }): Promise<void> {
      await withFailureTypes(runs.recordEnd(args));
    },
  };
};
