/**
 * A conversation's statuses, yield reasons, event levels, bounds and the small rules over them,
 * without zod: the conversation workflow imports these, and what it imports is in its bundle
 * (zod would double the bundle and cost the worker CPU on every workflow of every kind, sessions
 * too). contract/conversations.ts re-exports them beside the schemas.
 */

/** A conversation's status (OpenComputer's Durable Agent Sessions statuses). */
export const CONVERSATION_STATUSES = ['queued', 'running', 'awaiting_input', 'idle', 'failed', 'archived'] as const;
export type ConversationStatus = (typeof CONVERSATION_STATUSES)[number];

/** Why a turn ended. */
export const YIELD_REASONS = ['completed', 'needs_input', 'interrupted', 'deadline_exceeded', 'budget_exceeded', 'max_turns', 'error', 'canceled'] as const;
export type YieldReason = (typeof YIELD_REASONS)[number];

/** Event levels, most to least visible: a reader asking for `progress` gets `user` too, `internal` gets all. */
export const EVENT_LEVELS = ['user', 'progress', 'internal'] as const;
export type EventLevel = (typeof EVENT_LEVELS)[number];

/** Bounds of everything a conversation holds. */
export const CONVERSATION_BOUNDS = {
  /** Characters of one message. */
  messageChars: 64 * 1024,
  /** Messages accepted but not yet run. */
  pendingMessages: 16,
  /** Turns of one conversation (the `limits.turns` maximum). */
  maxTurns: 500,
  /** Seconds of one turn (the `limits.turnSeconds` maximum). */
  maxTurnSeconds: 3600,
  /** Bytes of one stored event's JSON; a larger one is stored as a `truncated` stub. */
  eventBytes: 64 * 1024,
  /** Events one conversation stores (its own, not counting what a fork shares); past it a turn's events are dropped (one `event_log_full` marker). */
  eventsPerConversation: 20_000,
  /** Events in one JSON page. */
  eventsPage: 500,
  /** Forks made by one fork request. */
  forkCount: 8,
  /** Characters of an evaluation's output tail kept. */
  evaluateTail: 2000,
  /** Bytes of metadata JSON. */
  metadataBytes: 16 * 1024,
} as const;

/** The level of an event the runner printed, by its type. */
export function eventLevel(type: string): EventLevel {
  if (['assistant', 'result', 'message', 'turn_started', 'turn_complete', 'error', 'interrupted', 'turn_restarted', 'evaluation'].includes(type)) return 'user';
  if (['ready', 'configured', 'stderr', 'event_log_full'].includes(type)) return 'internal';
  return 'progress';
}

/** Levels a reader at `level` sees. */
export function levelsUpTo(level: EventLevel): EventLevel[] {
  return EVENT_LEVELS.slice(0, EVENT_LEVELS.indexOf(level) + 1);
}

/** The one-line summary of a turn in the Temporal UI: its message's first line and, once known, why it ended. Never more than 120 characters. */
export function turnSummary(turn: number, message: string, yieldReason?: string): string {
  const first = (message.split('\n', 1)[0] ?? '').trim();
  const line = first.length > 80 ? `${first.slice(0, 79)}…` : first;
  return `turn ${turn}: ${line}${yieldReason ? ` · ${yieldReason}` : ''}`;
}
