/**
 * What a conversation's record says as its workflow moves: a turn's end, a rewind. The worker's
 * activities call these; the workflow decides when.
 */
import type { TurnOutcome } from '../../contract/conversations';
import type { Store } from '../../store';
import { conflict } from '../../contract/errors';
import { findConversation, listAllTurns, lockTurn, markTurnsLeft, markTurnsLive, unlockTurn, updateConversation } from '../../store/conversations';
import { checkpointFreedMessage } from './checkpoint-gc';

/** A turn ended: the conversation's head moves to it; it waits for input, or runs the next queued message. */
export async function turnEnded(
  store: Store,
  a: { conversationId: string; turn: number; outcome: TurnOutcome; tokensUsed: number; queued: boolean },
): Promise<void> {
  await updateConversation(store, a.conversationId, {
    status: a.queued ? 'running' : a.outcome.yieldReason === 'needs_input' ? 'awaiting_input' : 'idle',
    headTurn: a.turn,
    tokensUsed: a.tokensUsed,
    interruptTurn: null,
  });
}

/**
 * Claims turn `turn`'s checkpoint for a rewind to it, so that the checkpoint garbage collection
 * cannot free it meanwhile (services/conversations/checkpoint-gc.ts); answers the release. 409 when
 * it was freed (or is being freed). A turn at or before a fork's fork point is its parent's: the fork
 * itself keeps it.
 */
export async function claimRewindTarget(store: Store, conversationId: string, turn: number): Promise<() => Promise<void>> {
  const doc = await findConversation(store, conversationId);
  if (!doc || turn <= (doc.forkedFrom?.turn ?? -1)) return async () => undefined;
  if ((await lockTurn(store, conversationId, turn, 'rewind')) === 'gc') throw conflict(checkpointFreedMessage(conversationId, turn));
  return () => unlockTurn(store, conversationId, turn, 'rewind');
}

/**
 * A rewind to `turn`: the turns after it are kept, marked left; `turn` and the turns it continued
 * from are on the conversation's line again (a rewind to a turn an earlier rewind had left); the head is `turn`.
 */
export async function rewindTo(store: Store, conversationId: string, turn: number): Promise<void> {
  await markTurnsLeft(store, conversationId, turn);
  const byTurn = new Map((await listAllTurns(store, conversationId)).map((t) => [t.turn, t]));
  const line: number[] = [];
  for (let t = byTurn.get(turn); t && t.left && !line.includes(t.turn); t = byTurn.get(t.after)) line.push(t.turn);
  await markTurnsLive(store, conversationId, line);
  await updateConversation(store, conversationId, { headTurn: turn, status: 'idle', sleeping: false });
}
