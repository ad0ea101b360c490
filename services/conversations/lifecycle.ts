/**
 * What a conversation's record says as its workflow moves: a turn's end, a rewind. The worker's
 * activities call these; the workflow decides when.
 */
import type { TurnOutcome } from '../../contract/conversations';
import type { Store } from '../../store';
import { markTurnsLeft, updateConversation } from '../../store/conversations';

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

/** A rewind to `turn`: the turns after it are kept, marked left; the head is `turn`. */
export async function rewindTo(store: Store, conversationId: string, turn: number): Promise<void> {
  await markTurnsLeft(store, conversationId, turn);
  await updateConversation(store, conversationId, { headTurn: turn, status: 'idle', sleeping: false });
}
