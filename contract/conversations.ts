/**
 * Conversations: durable multi-turn agent sessions (docs/api/conversations.md). The HTTP schemas,
 * the public views, the bounds, and the arguments and results of the conversation workflow, which
 * the service that starts it and the workflow itself both import.
 */
import { z } from './zod';
import { CONVERSATION_BOUNDS, CONVERSATION_STATUSES, EVENT_LEVELS, YIELD_REASONS, type YieldReason } from './conversation-rules';

export * from './conversation-rules';

/** Per-conversation limits (OpenComputer's `limits`). */
export const ConversationLimits = z
  .object({
    tokens: z
      .number()
      .int()
      .positive()
      .max(1e10)
      .optional()
      .describe('Tokens (input + output) over all turns, when the runner reports usage; past it the turn ends budget_exceeded'),
    turnSeconds: z
      .number()
      .int()
      .min(1)
      .max(CONVERSATION_BOUNDS.maxTurnSeconds)
      .default(600)
      .describe('Seconds one turn may run; then it is interrupted (yieldReason deadline_exceeded)'),
    turns: z
      .number()
      .int()
      .min(1)
      .max(CONVERSATION_BOUNDS.maxTurns)
      .default(100)
      .describe('Turns the conversation may have; the next message is refused (max_turns)'),
  })
  .openapi('ConversationLimits');
export type ConversationLimits = z.infer<typeof ConversationLimits>;

const MessageText = z.string().min(1).max(CONVERSATION_BOUNDS.messageChars);

/** Options given to the runner (the built-in Claude Agent SDK runner reads them; another runner gets them in SAP_AGENT_CONFIG). */
export const RunnerOptions = z
  .object({
    model: z.string().min(1).max(200).optional(),
    systemPrompt: z
      .string()
      .max(64 * 1024)
      .optional(),
    allowedTools: z.array(z.string().min(1).max(200)).max(200).optional(),
    permissionMode: z.enum(['default', 'acceptEdits', 'bypassPermissions', 'plan']).optional(),
    maxTurns: z.number().int().positive().max(10_000).optional(),
    cwd: z.string().startsWith('/', 'must be an absolute path').max(4096).optional(),
  })
  .openapi('ConversationRunnerOptions');
export type RunnerOptions = z.infer<typeof RunnerOptions>;

export const CreateConversationBody = z
  .object({
    input: MessageText.optional().describe('The first message (the first turn starts at once)'),
    limits: ConversationLimits.default({ turnSeconds: 600, turns: 100 }),
    metadata: z
      .record(z.string().max(256), z.string().max(4096))
      .refine((m) => Object.keys(m).length <= 64, 'at most 64 keys')
      .default({}),
    runner: z
      .array(z.string().min(1).max(4096))
      .min(1)
      .max(64)
      .optional()
      .describe('Program (argv) speaking the JSON-lines protocol; default: the Claude Agent SDK runner'),
    options: RunnerOptions.default({}),
    idleSeconds: z.number().int().min(1).max(86_400).optional().describe('Idle seconds before the sandbox hibernates (default CONVERSATION_IDLE_SECONDS)'),
  })
  .openapi('CreateConversation');

export const MessageBody = z.object({ text: MessageText }).openapi('ConversationMessage');

export const ForkBody = z
  .object({
    turn: z.number().int().min(0).describe('Fork from the end of this turn (0: the conversation before its first turn)'),
    input: MessageText.optional().describe('The first message of each fork'),
    count: z.number().int().min(1).max(CONVERSATION_BOUNDS.forkCount).default(1),
    evaluate: z
      .string()
      .min(1)
      .max(4096)
      .optional()
      .describe("A bash command run in each fork's sandbox when its first turn ends; forks are ranked by its exit code (0 first)"),
    metadata: z.record(z.string().max(256), z.string().max(4096)).optional(),
  })
  .refine((b) => !b.evaluate || b.input, { message: 'evaluate needs input (the message each fork runs before it is evaluated)' })
  .openapi('ForkConversation');

export const RewindBody = z.object({ turn: z.number().int().min(0) }).openapi('RewindConversation');

export const EventsQuery = z.object({
  after: z.coerce.number().int().min(0).default(0).describe('Events with a larger sequence number (default 0: from the start; the first event is 1)'),
  level: z.enum(EVENT_LEVELS).default('progress').describe('user: what a person reads; progress: also tool use and progress; internal: everything'),
  limit: z.coerce.number().int().min(1).max(CONVERSATION_BOUNDS.eventsPage).default(200),
});

export const ConversationParams = z.object({ conversationId: z.string().regex(/^conv_[a-z0-9]{1,40}$/, 'must be a conversation id (conv_…)') });

export const TurnView = z
  .object({
    turn: z.number().int(),
    status: z.enum(['running', 'completed', 'failed']),
    message: z.string().describe('The message (its first 200 characters)'),
    yieldReason: z.enum(YIELD_REASONS).nullable(),
    usage: z.object({ inputTokens: z.number(), outputTokens: z.number() }).nullable(),
    after: z.number().int().describe('The turn this one continued from'),
    left: z.boolean().describe('A rewind went back past it: kept, no longer on the conversation’s line'),
    attempt: z.number().int(),
    checkpointId: z.string().nullable().describe('The checkpoint taken at its end (a copy-on-write layer over the one before)'),
    checkpointFreed: z
      .boolean()
      .describe(
        'Its checkpoint was freed by garbage collection (a rewind left the turn and nothing stood on it): the turn stays in the history, but a fork of it or a rewind to it is refused (409)',
      ),
    startSeq: z.number().int(),
    endSeq: z.number().int().nullable(),
    result: z.string().nullable(),
    evaluation: z.object({ exitCode: z.number().int(), outputTail: z.string() }).nullable(),
    startedAt: z.string(),
    endedAt: z.string().nullable(),
  })
  .openapi('ConversationTurn');
export type TurnView = z.infer<typeof TurnView>;

export const ConversationView = z
  .object({
    id: z.string(),
    agentId: z.string(),
    status: z.enum(CONVERSATION_STATUSES),
    sleeping: z.boolean().describe('Its sandbox is hibernated; the next message wakes it'),
    sandboxId: z.string().nullable(),
    turns: z.number().int().describe('Turns run (left ones included)'),
    headTurn: z.number().int().describe('The turn the next message continues from'),
    tokensUsed: z.number(),
    limits: ConversationLimits,
    metadata: z.record(z.string(), z.string()),
    forkedFrom: z.object({ conversationId: z.string(), turn: z.number().int() }).nullable(),
    forks: z.array(z.object({ conversationId: z.string(), turn: z.number().int() })),
    error: z.string().nullable(),
    createdAt: z.string(),
    updatedAt: z.string(),
  })
  .openapi('Conversation');
export type ConversationView = z.infer<typeof ConversationView>;

export const EventView = z
  .object({
    seq: z.number().int(),
    turn: z.number().int(),
    level: z.enum(EVENT_LEVELS),
    type: z.string(),
    data: z.unknown(),
    superseded: z.boolean().describe('From an attempt of the turn that a crash cut short; the turn ran again'),
    at: z.string(),
  })
  .openapi('ConversationEvent');
export type EventView = z.infer<typeof EventView>;

/** Where a forked conversation starts: a checkpoint of its parent, on the parent's host. */
export interface ForkOrigin {
  conversationId: string;
  turn: number;
  /** The checkpoint's layer and the task queue of the host that has it. */
  layerId: string;
  taskQueue: string;
  /** The parent's last event sequence number at that turn: the fork's own events start after it (0: none). */
  seq: number;
}

/** Arguments of a conversation's workflow (the workflow id is the conversation id). `Run` is the agent's run spec. */
export interface ConversationWorkflowArgs<Run = unknown> {
  conversationId: string;
  orgId: string;
  agentId: string;
  run: Run;
  limits: ConversationLimits;
  runner?: string[];
  options: RunnerOptions;
  idleSeconds: number;
  from?: ForkOrigin;
  /** The first message, run as turn 1 (after `from.turn` for a fork). */
  input?: string;
  /** Run in the sandbox after the first turn ends (best-of-N); its exit code and output tail go on the turn. */
  evaluate?: string;
}

export interface ConversationWorkflowResult {
  conversationId: string;
  status: 'archived' | 'failed';
  turns: number;
  error: string | null;
}

/** The conversation workflow's signature, so that starting it is type-checked against its arguments. */
export type ConversationWorkflow<Run = unknown> = (args: ConversationWorkflowArgs<Run>) => Promise<ConversationWorkflowResult>;

/** What a message Update answers once accepted. */
export interface MessageAccepted {
  turn: number;
  queued: number;
}

/** What the runTurn activity reports. */
export interface TurnOutcome {
  yieldReason: YieldReason;
  usage: { inputTokens: number; outputTokens: number } | null;
  endSeq: number;
  error: string | null;
}
