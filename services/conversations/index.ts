/**
 * Conversations (docs/api/conversations.md): durable multi-turn agent sessions, each one workflow
 * (workflows/conversation.ts) that owns one sandbox. This is the API's side: create, message (a
 * Workflow Update), read turns, events and results, interrupt, cancel, archive, fork, rewind.
 */
import { WorkflowNotFoundError, WorkflowUpdateFailedError, WorkflowExecutionAlreadyStartedError } from '@temporalio/client';
import { WorkflowIdReusePolicy } from '@temporalio/common';
import type { z } from 'zod';
import {
  CONVERSATION_BOUNDS,
  levelsUpTo,
  type ConversationView,
  type ConversationWorkflow,
  type CreateConversationBody,
  type EventLevel,
  type EventView,
  type ForkBody,
  type ForkOrigin,
  type MessageAccepted,
  type TurnView,
} from '../../contract/conversations';
import { ApiError, conflict, invalid, notFound } from '../../contract/errors';
import { derivedId, randomId } from '../../lib/ids';
import { isDuplicateKey } from '../../store';
import { runSpecOf } from '../sessions/run-spec';
import type { AgentRunSpec } from '../../contract/workflows';
import {
  deleteConversation,
  findConversation,
  findTurn,
  insertConversation,
  turnLockHolder,
  listConversations,
  listForks,
  listGroup,
  listTurns,
  readEvents,
  updateConversation,
  type ConversationDoc,
  type EventDoc,
  ensureConversationIndexes,
  deleteConversationData,
  type TurnDoc,
} from '../../store/conversations';
import { findHost } from '../../store/hosts';
import { AGENT_ID, ORG_ID } from '../../workflows/defs';
import { archiveSignal, cancelUpdate, conversationStateQuery, forkedSignal, messageUpdate, rewindUpdate } from '../../workflows/conversation.defs';
import type { AgentService } from '../agents/agents';
import type { ServiceDeps } from '../deps';
import { snapshotRefOf } from '../checkpoints/snapshots';
import { endWorkflowAndWait } from '../workflow-control';
import { deleteCheckpoint } from '../checkpoints/checkpoints';
import { listSandboxCheckpoints } from '../../store/checkpoints';
import { assertTurnRoom, checkpointFreedMessage } from './checkpoint-gc';

/** Default idle seconds before a conversation's sandbox hibernates (CONVERSATION_IDLE_SECONDS). */
const DEFAULT_IDLE_SECONDS = 300;

const iso = (d: Date | null | undefined): string | null => (d ? d.toISOString() : null);

function turnView(t: TurnDoc): TurnView {
  return {
    turn: t.turn,
    status: t.status,
    message: t.message.slice(0, 200),
    yieldReason: t.yieldReason,
    usage: t.usage,
    after: t.after,
    left: t.left,
    attempt: t.attempt,
    checkpointId: t.checkpointId,
    checkpointFreed: t.checkpointFreed === true,
    startSeq: t.startSeq,
    endSeq: t.endSeq,
    result: t.result,
    evaluation: t.evaluation,
    startedAt: t.startedAt.toISOString(),
    endedAt: iso(t.endedAt),
  };
}

function eventView(e: EventDoc): EventView {
  let data: unknown;
  try {
    data = JSON.parse(e.data);
  } catch {
    data = e.data;
  }
  return { seq: e.seq, turn: e.turn, level: e.level, type: e.type, data, superseded: e.superseded === true, at: e.at.toISOString() };
}

/** Maps a refused Update to the API's answer: bad input 400, a state that forbids it 409. */
function updateRefused(err: unknown): never {
  if (err instanceof WorkflowUpdateFailedError) {
    const cause = err.cause as { type?: string; message?: string } | undefined;
    const message = cause?.message ?? err.message;
    if (cause?.type === 'InvalidMessage' || cause?.type === 'InvalidRewind') throw invalid(message);
    throw conflict(message);
  }
  if (err instanceof WorkflowNotFoundError) throw conflict('the conversation has ended');
  throw err;
}

export function createConversationService(deps: ServiceDeps, agents: Pick<AgentService, 'get'>) {
  ensureConversationIndexes(deps.store).catch((err: unknown) => deps.logger.warn({ err: String(err) }, 'could not create the conversations indexes'));
  const idleSeconds = Number(process.env.CONVERSATION_IDLE_SECONDS) > 0 ? Number(process.env.CONVERSATION_IDLE_SECONDS) : DEFAULT_IDLE_SECONDS;

  async function own(orgId: string, id: string): Promise<ConversationDoc> {
    const doc = await findConversation(deps.store, id);
    if (!doc || doc.orgId !== orgId) throw notFound(`conversation ${id}`);
    return doc;
  }

  async function view(doc: ConversationDoc): Promise<ConversationView> {
    const forks = await listForks(deps.store, doc._id);
    return {
      id: doc._id,
      agentId: doc.agentId,
      status: doc.status,
      sleeping: doc.sleeping,
      sandboxId: doc.sandboxId,
      turns: doc.turns,
      headTurn: doc.headTurn,
      tokensUsed: doc.tokensUsed,
      limits: doc.limits,
      metadata: doc.metadata,
      forkedFrom: doc.forkedFrom ? { conversationId: doc.forkedFrom.conversationId, turn: doc.forkedFrom.turn } : null,
      forks: forks.map((f) => ({ conversationId: f._id, turn: f.forkedFrom!.turn })),
      error: doc.error,
      createdAt: doc.createdAt.toISOString(),
      updatedAt: doc.updatedAt.toISOString(),
    };
  }

  /** A turn's record with its checkpoint: the conversation's own, or (at or before its fork point) its parent's. */
  async function turnWithCheckpoint(doc: ConversationDoc, turn: number): Promise<{ turn: TurnDoc; owner: ConversationDoc }> {
    let cur: ConversationDoc | null = doc;
    for (let depth = 0; cur && depth < 100; depth++) {
      if (!cur.forkedFrom || turn > cur.forkedFrom.turn) {
        const t = await findTurn(deps.store, cur._id, turn);
        if (!t || !t.layerId) throw invalid(`turn ${turn} of conversation ${doc._id} has no checkpoint (yet)`);
        if (t.checkpointFreed) throw conflict(checkpointFreedMessage(cur._id, turn));
        return { turn: t, owner: cur };
      }
      cur = await findConversation(deps.store, cur.forkedFrom.conversationId);
    }
    throw notFound(`turn ${turn} of conversation ${doc._id}`);
  }

  interface StartSpec {
    orgId: string;
    agentId: string;
    body: z.infer<typeof CreateConversationBody>;
    id: string;
    from?: ForkOrigin;
    /** A fork's base: the conversation that owns the checkpoint it stands on (the fork is refused once garbage collection claimed it). */
    base?: { conversationId: string; turn: number };
    evaluate?: string;
    forkGroup?: string;
  }

  /** Records a conversation and starts its workflow; a second start of the same id answers the first (created false). */
  async function start(s: StartSpec): Promise<{ doc: ConversationDoc; created: boolean }> {
    const agent = await agents.get(s.orgId, s.agentId);
    const run: AgentRunSpec = runSpecOf(agent, deps.secrets);
    if (agent.snapshot && !s.from) run.snapshotRef = await snapshotRefOf(deps, s.orgId, agent.snapshot);
    if (Buffer.byteLength(JSON.stringify(s.body.metadata)) > CONVERSATION_BOUNDS.metadataBytes)
      throw invalid(`metadata: at most ${CONVERSATION_BOUNDS.metadataBytes} bytes`);
    const now = new Date();
    const doc: ConversationDoc = {
      _id: s.id,
      orgId: s.orgId,
      agentId: agent.id,
      status: 'queued',
      sleeping: false,
      sandboxId: null,
      hostId: null,
      limits: s.body.limits,
      options: s.body.options,
      runner: s.body.runner ?? null,
      metadata: s.body.metadata,
      turns: s.from?.turn ?? 0,
      headTurn: s.from?.turn ?? 0,
      tokensUsed: 0,
      forkedFrom: s.from ? { conversationId: s.from.conversationId, turn: s.from.turn, seq: s.from.seq } : null,
      forkGroup: s.forkGroup ?? null,
      error: null,
      interruptTurn: null,
      createdAt: now,
      updatedAt: now,
    };
    try {
      await insertConversation(deps.store, doc);
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
      const known = await own(s.orgId, s.id);
      if (known.agentId !== agent.id) throw conflict('Idempotency-Key was used for a conversation of another agent');
      return { doc: known, created: false };
    }
    // Recorded first, then looked at: a garbage collection of the base turn either sees this fork or has claimed the turn (services/conversations/checkpoint-gc.ts).
    if (s.base && (await turnLockHolder(deps.store, s.base.conversationId, s.base.turn)) === 'gc') {
      await deleteConversation(deps.store, doc._id);
      throw conflict(checkpointFreedMessage(s.base.conversationId, s.base.turn));
    }
    try {
      await deps.temporal.workflow.start<ConversationWorkflow<AgentRunSpec>>('conversationWorkflow', {
        taskQueue: deps.cfg.TASK_QUEUE,
        workflowId: doc._id,
        workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
        args: [
          {
            conversationId: doc._id,
            orgId: s.orgId,
            agentId: agent.id,
            run,
            limits: s.body.limits,
            ...(s.body.runner ? { runner: s.body.runner } : {}),
            options: s.body.options,
            idleSeconds: s.body.idleSeconds ?? idleSeconds,
            ...(s.from ? { from: s.from } : {}),
            ...(s.body.input ? { input: s.body.input } : {}),
            ...(s.evaluate ? { evaluate: s.evaluate } : {}),
          },
        ],
        staticSummary: `agent ${agent.id} · conversation ${doc._id}${s.from ? ` · fork of ${s.from.conversationId} at turn ${s.from.turn}` : ''}`,
        memo: s.from ? { forkedFrom: { conversationId: s.from.conversationId, turn: s.from.turn } } : {},
        typedSearchAttributes: [
          { key: AGENT_ID, value: agent.id },
          { key: ORG_ID, value: s.orgId },
        ],
      });
    } catch (err) {
      if (!(err instanceof WorkflowExecutionAlreadyStartedError)) {
        await deleteConversation(deps.store, doc._id);
        throw new ApiError('unavailable', `could not start the conversation workflow: ${(err as Error).message}`);
      }
    }
    return { doc, created: true };
  }

  const handle = (id: string) => deps.temporal.workflow.getHandle(id);

  /** The answer to the message sent before with Idempotency-Key `key`, or null when none was accepted. */
  async function acceptedBefore(id: string, key: string): Promise<MessageAccepted | null> {
    try {
      return await handle(id).getUpdateHandle<MessageAccepted>(`msg-${key}`).result();
    } catch {
      return null;
    }
  }

  return {
    /** Creates a conversation; with an Idempotency-Key a repeat answers the first (created false). */
    async create(orgId: string, agentId: string, body: z.infer<typeof CreateConversationBody>, key: string | undefined) {
      const id = key ? `conv_${derivedId('conversation', orgId, key)}` : `conv_${randomId()}`;
      // A new conversation stores checkpoints from its start: none at the storage quota (after garbage
      // collection). A repeat of a create (its Idempotency-Key) stores nothing: it is answered the first.
      if (!(key && (await findConversation(deps.store, id)))) await assertTurnRoom(deps, orgId);
      const { doc, created } = await start({ orgId, agentId, body, id });
      return { conversation: await view(doc), created };
    },

    async get(orgId: string, id: string): Promise<ConversationView> {
      return view(await own(orgId, id));
    },

    async list(orgId: string, agentId: string, limit: number): Promise<ConversationView[]> {
      await agents.get(orgId, agentId);
      return Promise.all((await listConversations(deps.store, orgId, agentId, limit)).map(view));
    },

    /** Sends a message (the Update's id is the Idempotency-Key: a repeat is answered with the first's turn). */
    async message(orgId: string, id: string, text: string, key: string | undefined): Promise<MessageAccepted> {
      // At the storage quota (after garbage collection) the turn is refused (507) before anything of it is stored.
      const [found, room] = await Promise.allSettled([own(orgId, id), assertTurnRoom(deps, orgId)]);
      if (found.status === 'rejected') throw found.reason;
      const doc = found.value;
      // A repeat of a message that was accepted (its Idempotency-Key) is answered its turn, even at the quota.
      if (room.status === 'rejected') {
        const before = key ? await acceptedBefore(id, key) : null;
        if (before) return before;
        throw room.reason;
      }
      if (doc.status === 'archived' || doc.status === 'failed') throw conflict(`the conversation is ${doc.status}`);
      try {
        return await handle(id).executeUpdate(messageUpdate, { args: [{ text }], ...(key ? { updateId: `msg-${key}` } : {}) });
      } catch (err) {
        return updateRefused(err);
      }
    },

    /** The turns, in order: a fork's first are its parent's up to the fork point (by reference). */
    async turns(orgId: string, id: string): Promise<TurnView[]> {
      const doc = await own(orgId, id);
      const chain: TurnView[][] = [];
      let cur: ConversationDoc | null = doc;
      let upTo = Infinity;
      for (let depth = 0; cur && depth < 100; depth++) {
        const limit = upTo;
        chain.unshift((await listTurns(deps.store, cur._id)).filter((t) => t.turn <= limit).map(turnView));
        if (!cur.forkedFrom) break;
        upTo = cur.forkedFrom.turn;
        cur = await findConversation(deps.store, cur.forkedFrom.conversationId);
      }
      return chain.flat();
    },

    /** The result: the head turn's yield reason and the runner's last result text. */
    async result(orgId: string, id: string) {
      const doc = await own(orgId, id);
      const t = doc.headTurn > 0 ? await turnWithCheckpoint(doc, doc.headTurn).catch(() => null) : null;
      return { status: doc.status, turn: doc.headTurn, yieldReason: t?.turn.yieldReason ?? null, result: t?.turn.result ?? null, usage: t?.turn.usage ?? null };
    },

    /**
     * Events after `after`, of `level` and above, in order, at most `limit`: a fork's events up to its
     * fork point are read from its parent (shared, not copied), its own after.
     */
    async events(orgId: string, id: string, after: number, level: EventLevel, limit: number): Promise<EventView[]> {
      const doc = await own(orgId, id);
      const levels = levelsUpTo(level);
      // The chain of (conversation, highest seq read from it), oldest ancestor first.
      const chain: { id: string; upTo: number | null }[] = [];
      let cur: ConversationDoc | null = doc;
      let upTo: number | null = null;
      for (let depth = 0; cur && depth < 100; depth++) {
        chain.unshift({ id: cur._id, upTo });
        if (!cur.forkedFrom) break;
        upTo = cur.forkedFrom.seq;
        cur = await findConversation(deps.store, cur.forkedFrom.conversationId);
      }
      const out: EventDoc[] = [];
      for (const c of chain) {
        if (out.length >= limit) break;
        if (c.upTo !== null && c.upTo <= after) continue;
        out.push(...(await readEvents(deps.store, c.id, Math.max(after, out.at(-1)?.seq ?? 0), c.upTo, levels, limit - out.length)));
      }
      return out.map(eventView);
    },

    /** Interrupts the running turn (its runner gets `interrupt`; the turn ends `interrupted`). */
    async interrupt(orgId: string, id: string): Promise<{ turn: number | null }> {
      const doc = await own(orgId, id);
      if (doc.status === 'archived' || doc.status === 'failed') throw conflict(`the conversation is ${doc.status}`);
      const state = await handle(id).query(conversationStateQuery);
      if (state.running !== null) await updateConversation(deps.store, id, { interruptTurn: state.running });
      return { turn: state.running };
    },

    /** Cancels: drops the queued messages and interrupts the running turn; the conversation stays open. */
    async cancel(orgId: string, id: string): Promise<{ dropped: number; interrupted: number | null }> {
      const doc = await own(orgId, id);
      if (doc.status === 'archived' || doc.status === 'failed') throw conflict(`the conversation is ${doc.status}`);
      let dropped: { dropped: number };
      try {
        dropped = await handle(id).executeUpdate(cancelUpdate);
      } catch (err) {
        return updateRefused(err);
      }
      const { turn } = await this.interrupt(orgId, id);
      return { dropped: dropped.dropped, interrupted: turn };
    },

    /** Archives: the workflow ends and destroys the sandbox; turns, events and checkpoints stay (forks still work). */
    async archive(orgId: string, id: string): Promise<ConversationView> {
      const doc = await own(orgId, id);
      if (doc.status !== 'archived') {
        const found = await endWorkflowAndWait(deps.temporal, id, (h) => h.signal(archiveSignal));
        if (!found) await updateConversation(deps.store, id, { status: 'archived' });
      }
      return view(await own(orgId, id));
    },

    /**
     * Deletes an archived conversation and what it stores: its turns, events and turn checkpoints
     * (each layer stays on its host while a sandbox or layer still stands on it). 409 while it is not
     * archived, or while a fork of it exists (a fork reads its parent's events and stands on its checkpoints).
     */
    async remove(orgId: string, id: string): Promise<{ id: string; deleted: true }> {
      const doc = await own(orgId, id);
      if (doc.status !== 'archived' && doc.status !== 'failed') throw conflict(`conversation ${id} is ${doc.status}: archive it first`);
      const forks = await listForks(deps.store, id);
      if (forks.length) throw conflict(`conversation ${id} has forks (${forks.map((f) => f._id).join(', ')}): delete them first`);
      if (doc.sandboxId) for (const cp of await listSandboxCheckpoints(deps.store, doc.sandboxId)) if (cp.orgId === orgId) await deleteCheckpoint(deps, cp);
      await deleteConversationData(deps.store, id);
      return { id, deleted: true };
    },

    /** Rewinds to the end of `turn`: the sandbox goes back to its checkpoint; later turns are kept, marked left. */
    async rewind(orgId: string, id: string, turn: number) {
      const doc = await own(orgId, id);
      if (doc.status === 'archived' || doc.status === 'failed') throw conflict(`the conversation is ${doc.status}`);
      if (turn > (doc.forkedFrom?.turn ?? -1) && (await findTurn(deps.store, id, turn))?.checkpointFreed) throw conflict(checkpointFreedMessage(id, turn));
      try {
        return await handle(id).executeUpdate(rewindUpdate, { args: [{ turn }] });
      } catch (err) {
        return updateRefused(err);
      }
    },

    /**
     * Forks at the end of `turn`: `count` new conversations, each over that turn's checkpoint, its
     * event log sharing the parent's up to there. With `input` each runs it as its first turn; with
     * `evaluate` that command then runs in each, and `group` ranks them (GET /v1/conversations/forks/{group}).
     */
    async fork(orgId: string, id: string, body: z.infer<typeof ForkBody>, key: string | undefined) {
      const doc = await own(orgId, id);
      const { turn, owner } = await turnWithCheckpoint(doc, body.turn);
      await assertTurnRoom(deps, orgId);
      const host = await findHost(deps.store, owner.hostId ?? '');
      if (!host) throw conflict(`the host that has turn ${body.turn}'s checkpoint is gone`);
      // The sequence number the fork's own events start after: the turn's last event (turn 0: the start of the owner's log).
      const seq = body.turn === 0 ? (owner.forkedFrom?.seq ?? 0) : (turn.endSeq ?? 0);
      const from: ForkOrigin = { conversationId: doc._id, turn: body.turn, layerId: turn.layerId!, taskQueue: host.taskQueue, seq };
      const group = body.count > 1 || body.evaluate ? `fg_${key ? derivedId('fork-group', orgId, id, key) : randomId()}` : undefined;
      const forks: ConversationView[] = [];
      for (let i = 0; i < body.count; i++) {
        const forkId = key ? `conv_${derivedId('fork', orgId, id, key, String(i))}` : `conv_${randomId()}`;
        const { doc: f } = await start({
          orgId,
          agentId: doc.agentId,
          id: forkId,
          body: {
            ...(body.input ? { input: body.input } : {}),
            limits: doc.limits,
            metadata: body.metadata ?? doc.metadata,
            ...(doc.runner ? { runner: doc.runner } : {}),
            options: doc.options,
          },
          from,
          base: { conversationId: owner._id, turn: body.turn },
          ...(body.evaluate ? { evaluate: body.evaluate } : {}),
          ...(group ? { forkGroup: group } : {}),
        });
        await handle(id)
          .signal(forkedSignal, { conversationId: forkId, turn: body.turn })
          .catch(() => undefined);
        forks.push(await view(f));
      }
      return { group: group ?? null, forks };
    },

    /** A fork group (best-of-N): each fork's first turn and evaluation, ranked: exit code 0 first, then by exit code; not yet evaluated last. */
    async forkGroup(orgId: string, group: string) {
      const members = await listGroup(deps.store, orgId, group);
      if (!members.length) throw notFound(`fork group ${group}`);
      const rows = await Promise.all(
        members.map(async (m) => {
          const t = await findTurn(deps.store, m._id, (m.forkedFrom?.turn ?? 0) + 1);
          return {
            conversationId: m._id,
            status: m.status,
            turn: t ? turnView(t) : null,
            exitCode: t?.evaluation?.exitCode ?? null,
            outputTail: t?.evaluation?.outputTail ?? null,
          };
        }),
      );
      rows.sort((a, b) => (a.exitCode ?? Infinity) - (b.exitCode ?? Infinity) || a.conversationId.localeCompare(b.conversationId));
      const done = rows.every((r) => r.exitCode !== null);
      return { group, done, ranked: rows };
    },
  };
}

/** The conversation operations (see createConversationService). */
export type ConversationService = ReturnType<typeof createConversationService>;
