/**
 * The conversation workflow's messages (workflows/conversation.ts), which the service sending them
 * imports too: a message is an Update (validated before it is accepted; its Update id is the
 * request's Idempotency-Key, so a repeated request is answered once), rewind and cancel are
 * Updates, archive and the fork notice are Signals.
 */
import { defineQuery, defineSignal, defineUpdate } from '@temporalio/workflow';
import type { MessageAccepted } from '../contract/conversations';

/** Sends a message: it becomes the next turn (run at once, or after the turns queued before it). */
export const messageUpdate = defineUpdate<MessageAccepted, [{ text: string }]>('message');

/** Goes back to the end of turn `turn`: the sandbox is put back to its checkpoint, later turns are marked left. Waits for a running turn to end. */
export const rewindUpdate = defineUpdate<{ headTurn: number; left: number[] }, [{ turn: number }]>('rewind');

/** Drops the queued messages (the API interrupts the running turn beside it); answers how many were dropped. */
export const cancelUpdate = defineUpdate<{ dropped: number }, []>('cancel');

/** Ends the conversation: its sandbox is destroyed (its checkpoints stay for forks), status archived. */
export const archiveSignal = defineSignal('archive');

/** A fork was made from this conversation (shown in its memo, so the Temporal UI links both ways). */
export const forkedSignal = defineSignal<[{ conversationId: string; turn: number }]>('forked');

/** The workflow's live state. */
export const conversationStateQuery = defineQuery<{ running: number | null; queued: number[]; headTurn: number; sleeping: boolean }>('conversationState');
