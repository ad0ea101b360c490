/**
 * Conversations, their turns and their event log: the documents and the queries (the decisions
 * are in services/conversations/). Every id is derived, so a retried write lands on the same
 * document: a turn is `<conversation id>:t<n>`, an event `<conversation id>:<seq, 10 digits>`.
 */
import type { ConversationLimits, ConversationStatus, EventLevel, RunnerOptions, YieldReason } from '../contract/conversations';
import { isDuplicateKey, type Store } from './index';

export interface ConversationDoc {
  _id: string;
  orgId: string;
  agentId: string;
  status: ConversationStatus;
  sleeping: boolean;
  sandboxId: string | null;
  /** The id of the host its sandbox is on. */
  hostId: string | null;
  limits: ConversationLimits;
  options: RunnerOptions;
  runner: string[] | null;
  metadata: Record<string, string>;
  /** Turns run, left ones included (the last turn's number). */
  turns: number;
  /** The turn the next message continues from. */
  headTurn: number;
  tokensUsed: number;
  forkedFrom: { conversationId: string; turn: number; seq: number } | null;
  /** Best-of-N: the fork group it belongs to, and the evaluation command. */
  forkGroup: string | null;
  error: string | null;
  /** Set by an interrupt request for the turn of this number; the running turn's activity reads it. */
  interruptTurn: number | null;
  createdAt: Date;
  updatedAt: Date;
}

export interface TurnDoc {
  _id: string;
  conversationId: string;
  orgId: string;
  turn: number;
  /** The message, bounded (contract CONVERSATION_BOUNDS.messageChars). */
  message: string;
  status: 'running' | 'completed' | 'failed';
  yieldReason: YieldReason | null;
  usage: { inputTokens: number; outputTokens: number } | null;
  /** The turn this one continued from (its checkpoint is the start state). */
  after: number;
  left: boolean;
  attempt: number;
  /** The checkpoint taken at its end (record id and layer). */
  checkpointId: string | null;
  layerId: string | null;
  /**
   * Its checkpoint was freed by the checkpoint garbage collection (services/conversations/checkpoint-gc.ts):
   * a rewind left the turn and nothing stood on its checkpoint. The turn stays; it can no longer be
   * forked or rewound to. Absent: false.
   */
  checkpointFreed?: boolean;
  startSeq: number;
  endSeq: number | null;
  result: string | null;
  evaluation: { exitCode: number; outputTail: string } | null;
  startedAt: Date;
  endedAt: Date | null;
}

export interface EventDoc {
  _id: string;
  conversationId: string;
  seq: number;
  turn: number;
  attempt: number;
  level: EventLevel;
  type: string;
  /** The event's JSON text, bounded. */
  data: string;
  superseded?: boolean;
  at: Date;
}

/** The turn-0 record of a conversation holds its starting layer (the checkpoint after provisioning, or the one it was forked from). */
export const turnId = (conversationId: string, turn: number): string => `${conversationId}:t${turn}`;
export const eventId = (conversationId: string, seq: number): string => `${conversationId}:${String(seq).padStart(10, '0')}`;

const conversationsOf = (s: Store) => s.db.collection<ConversationDoc>('conversations');
const turnsOf = (s: Store) => s.db.collection<TurnDoc>('conversation_turns');
const eventsOf = (s: Store) => s.db.collection<EventDoc>('conversation_events');
const turnLocksOf = (s: Store) => s.db.collection<TurnLockDoc>('conversation_turn_locks');

/**
 * Who holds a turn's checkpoint: the garbage collection freeing it (kept for good: the mark that it
 * is freed), or a rewind to the turn (removed once the rewind is done). `_id` is the turn's id: the
 * unique index is what lets only one of them have it (FerretDB runs a conditional update as a read
 * and a write, so an insert is the one atomic claim).
 */
export interface TurnLockDoc {
  _id: string;
  conversationId: string;
  turn: number;
  by: 'gc' | 'rewind';
  at: Date;
}

/** The indexes conversations are read by. */
export async function ensureConversationIndexes(store: Store): Promise<void> {
  await Promise.all([
    conversationsOf(store).createIndex({ orgId: 1, agentId: 1, createdAt: -1 }),
    conversationsOf(store).createIndex({ 'forkedFrom.conversationId': 1 }),
    turnsOf(store).createIndex({ conversationId: 1, turn: 1 }),
    eventsOf(store).createIndex({ conversationId: 1, seq: 1 }),
  ]);
}

export async function insertConversation(store: Store, doc: ConversationDoc): Promise<void> {
  await conversationsOf(store).insertOne(doc);
}

export function findConversation(store: Store, id: string): Promise<ConversationDoc | null> {
  return conversationsOf(store).findOne({ _id: id });
}

export async function updateConversation(store: Store, id: string, set: Partial<ConversationDoc>): Promise<void> {
  await conversationsOf(store).updateOne({ _id: id }, { $set: { ...set, updatedAt: new Date() } });
}

export async function deleteConversation(store: Store, id: string): Promise<void> {
  await conversationsOf(store).deleteOne({ _id: id });
}

export function listConversations(store: Store, orgId: string, agentId: string, limit: number): Promise<ConversationDoc[]> {
  return conversationsOf(store).find({ orgId, agentId }).sort({ createdAt: -1 }).limit(limit).toArray();
}

export function listForks(store: Store, conversationId: string): Promise<ConversationDoc[]> {
  return conversationsOf(store).find({ 'forkedFrom.conversationId': conversationId }).sort({ createdAt: 1 }).limit(200).toArray();
}

export function listGroup(store: Store, orgId: string, group: string): Promise<ConversationDoc[]> {
  return conversationsOf(store).find({ orgId, forkGroup: group }).limit(50).toArray();
}

export async function upsertTurn(store: Store, doc: TurnDoc): Promise<void> {
  await turnsOf(store).replaceOne({ _id: doc._id }, doc, { upsert: true });
}

export function findTurn(store: Store, conversationId: string, turn: number): Promise<TurnDoc | null> {
  return turnsOf(store).findOne({ _id: turnId(conversationId, turn) });
}

export async function updateTurn(store: Store, conversationId: string, turn: number, set: Partial<TurnDoc>): Promise<void> {
  await turnsOf(store).updateOne({ _id: turnId(conversationId, turn) }, { $set: set });
}

/**
 * All of a conversation's own turn records, turn 0 included, in order. Read as the range of their
 * `_id`s (`<conversation>:t<turn>`): FerretDB serves that through its index, where a filter on
 * `conversationId` would scan every conversation's turns. (`_id` order is not turn order: sorted here.)
 */
export async function listAllTurns(store: Store, conversationId: string): Promise<TurnDoc[]> {
  const docs = await turnsOf(store)
    .find({ _id: { $gt: `${conversationId}:t`, $lt: `${conversationId}:u` } })
    .sort({ _id: 1 })
    .limit(1001)
    .toArray();
  return docs.sort((a, b) => a.turn - b.turn);
}

/** The organisation's conversations with a left turn whose checkpoint is not freed (ids, at most `limit`). */
export async function conversationsWithLeftCheckpoints(store: Store, orgId: string, limit: number): Promise<string[]> {
  const docs = await turnsOf(store)
    .find({ orgId, left: true, checkpointFreed: { $ne: true }, layerId: { $ne: null } }, { projection: { conversationId: 1 } })
    .limit(1000)
    .toArray();
  return [...new Set(docs.map((d) => d.conversationId))].slice(0, limit);
}

/** Sets turns of a conversation back on its line (a rewind to a turn a rewind had left). */
export async function markTurnsLive(store: Store, conversationId: string, turns: number[]): Promise<void> {
  if (turns.length) await turnsOf(store).updateMany({ conversationId, turn: { $in: turns } }, { $set: { left: false } });
}

/**
 * Claims turn `turn`'s checkpoint for `by`: answers who holds it now (`by` itself when the claim was
 * taken now or was its already, the other holder when not).
 */
export async function lockTurn(store: Store, conversationId: string, turn: number, by: TurnLockDoc['by']): Promise<TurnLockDoc['by']> {
  const _id = turnId(conversationId, turn);
  for (let attempt = 0; ; attempt++) {
    try {
      await turnLocksOf(store).insertOne({ _id, conversationId, turn, by, at: new Date() });
      return by;
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
    }
    const held = await turnLocksOf(store).findOne({ _id });
    // Removed meanwhile (a rewind finished): try again, a few times.
    if (held) return held.by;
    if (attempt >= 4) throw new Error(`turn ${turn} of ${conversationId}: its checkpoint's claim keeps changing hands`);
  }
}

/** Who holds turn `turn`'s checkpoint, or null. */
export async function turnLockHolder(store: Store, conversationId: string, turn: number): Promise<TurnLockDoc['by'] | null> {
  return (await turnLocksOf(store).findOne({ _id: turnId(conversationId, turn) }))?.by ?? null;
}

/** Gives up `by`'s claim of turn `turn`'s checkpoint. */
export async function unlockTurn(store: Store, conversationId: string, turn: number, by: TurnLockDoc['by']): Promise<void> {
  await turnLocksOf(store).deleteOne({ _id: turnId(conversationId, turn), by });
}

/** A conversation's turns from 1 on, in order (turn 0, its start, is not listed). */
export async function listTurns(store: Store, conversationId: string): Promise<TurnDoc[]> {
  return (await listAllTurns(store, conversationId)).filter((t) => t.turn > 0);
}

export async function markTurnsLeft(store: Store, conversationId: string, afterTurn: number): Promise<void> {
  await turnsOf(store).updateMany({ conversationId, turn: { $gt: afterTurn } }, { $set: { left: true } });
}

/** Inserts an event; false when its sequence number is taken. */
export async function insertEvent(store: Store, doc: EventDoc): Promise<boolean> {
  try {
    await eventsOf(store).insertOne(doc);
    return true;
  } catch (err) {
    if (isDuplicateKey(err)) return false;
    throw err;
  }
}

/**
 * A conversation's own events are read as ranges of their `_id`s (`<conversation>:<seq, 10 digits>`),
 * which FerretDB serves through its index; a filter on `conversationId` would scan every
 * conversation's events, and grow with all of them. `;` is the character after `:`.
 */
const eventRange = (conversationId: string, after: number, upTo: number | null) => ({
  $gt: eventId(conversationId, after),
  ...(upTo === null ? { $lt: `${conversationId};` } : { $lte: eventId(conversationId, upTo) }),
});

/** The highest sequence number among a conversation's own events, or null. */
export async function lastEventSeq(store: Store, conversationId: string): Promise<number | null> {
  const last = await eventsOf(store)
    .find({ _id: eventRange(conversationId, 0, null) })
    .sort({ _id: -1 })
    .limit(1)
    .toArray();
  return last[0]?.seq ?? null;
}

/** Marks the events of a turn's earlier attempts superseded. */
export async function supersedeAttempts(store: Store, conversationId: string, turn: number, beforeAttempt: number): Promise<void> {
  await eventsOf(store).updateMany({ conversationId, turn, attempt: { $lt: beforeAttempt } }, { $set: { superseded: true } });
}

/**
 * A conversation's own events with after < seq ≤ upTo, of the given levels, in order (at most
 * `limit`). The levels are filtered here, page by page, so that the read stays an `_id` range.
 */
export async function readEvents(
  store: Store,
  conversationId: string,
  after: number,
  upTo: number | null,
  levels: EventLevel[],
  limit: number,
): Promise<EventDoc[]> {
  const out: EventDoc[] = [];
  if (limit <= 0) return out;
  const page = Math.max(limit, 100);
  for (let from = after; ;) {
    const docs = await eventsOf(store)
      .find({ _id: eventRange(conversationId, from, upTo) })
      .sort({ _id: 1 })
      .limit(page)
      .toArray();
    for (const d of docs) {
      if (!levels.includes(d.level)) continue;
      out.push(d);
      if (out.length === limit) return out;
    }
    if (docs.length < page) return out;
    from = docs[docs.length - 1]!.seq;
  }
}

/** Removes a conversation's turns and events (its record last, so a retry finds it). */
export async function deleteConversationData(store: Store, conversationId: string): Promise<void> {
  await eventsOf(store).deleteMany({ conversationId });
  await turnLocksOf(store).deleteMany({ conversationId });
  await turnsOf(store).deleteMany({ conversationId });
  await conversationsOf(store).deleteOne({ _id: conversationId });
}
