import { z } from 'zod';
import type { Response } from 'express';
import type { RouteTable } from '../http';
import { idempotencyKeyOf } from '../idempotency';
import { AgentParams, Limit } from '../../contract/schemas';
import {
  ConversationParams,
  ConversationView,
  CreateConversationBody,
  EventsQuery,
  EventView,
  ForkBody,
  MessageBody,
  RewindBody,
  TurnView,
} from '../../contract/conversations';
import type { ConversationService } from '../../services/conversations';

/** How often a followed event stream looks for new events. */
const FOLLOW_POLL_MS = 150;

/**
 * Follows a conversation's events as Server-Sent Events, each with `id: <seq>` (a reconnecting
 * client sends it back as Last-Event-ID, or `after=<seq>`): every stored event after it, in order,
 * once. Events are read from MongoDB, so another API process (or this one restarted) resumes the same.
 */
async function followEvents(
  svc: ConversationService,
  orgId: string,
  id: string,
  after: number,
  level: z.infer<typeof EventsQuery>['level'],
  res: Response,
): Promise<void> {
  let closed = false;
  res.on('close', () => (closed = true));
  res.status(200);
  res.setHeader('content-type', 'text/event-stream; charset=utf-8');
  res.setHeader('cache-control', 'no-cache');
  res.setHeader('x-accel-buffering', 'no');
  res.flushHeaders();
  let last = after;
  let idle = 0;
  while (!closed) {
    const page = await svc.events(orgId, id, last, level, 200);
    for (const e of page) {
      res.write(`id: ${e.seq}\nevent: ${e.type.replace(/[\r\n]/g, '')}\ndata: ${JSON.stringify(e)}\n\n`);
      last = e.seq;
    }
    if (page.length) {
      idle = 0;
      continue;
    }
    if (++idle % 20 === 0) {
      const c = await svc.get(orgId, id);
      if (c.status === 'archived' || c.status === 'failed') break;
      res.write(': keepalive\n\n');
    }
    await new Promise((r) => setTimeout(r, FOLLOW_POLL_MS));
  }
  if (!res.writableEnded) res.end();
}

/** /v1/agents/{agentId}/conversations and /v1/conversations/{id}/…: durable multi-turn agent sessions. */
export function registerConversationRoutes(t: RouteTable, svc: ConversationService): void {
  t.add({
    method: 'post',
    path: '/v1/agents/:agentId/conversations',
    tag: 'conversations',
    summary: 'Start a conversation: one workflow owning one sandbox; `input` is its first message. Send Idempotency-Key to make retries safe.',
    params: AgentParams,
    body: CreateConversationBody,
    responses: {
      201: { description: 'The conversation', schema: ConversationView },
      200: { description: 'The conversation an earlier request with the same Idempotency-Key created', schema: ConversationView },
    },
    errors: [409, 507],
    handler: async ({ params, body, org, req, res }) => {
      const { conversation, created } = await svc.create(org.id, params.agentId, body, idempotencyKeyOf(req));
      res.status(created ? 201 : 200).json(conversation);
    },
  });

  t.add({
    method: 'get',
    path: '/v1/agents/:agentId/conversations',
    tag: 'conversations',
    summary: "The agent's conversations, newest first",
    params: AgentParams,
    query: z.object({ limit: Limit }),
    responses: { 200: { description: 'Conversations', schema: z.object({ conversations: z.array(ConversationView) }) } },
    handler: async ({ params, query, org, res }) => {
      res.json({ conversations: await svc.list(org.id, params.agentId, query.limit) });
    },
  });

  t.add({
    method: 'get',
    path: '/v1/conversations/:conversationId',
    tag: 'conversations',
    summary: 'Get a conversation (status, head turn, forks both ways)',
    params: ConversationParams,
    responses: { 200: { description: 'The conversation', schema: ConversationView } },
    handler: async ({ params, org, res }) => {
      res.json(await svc.get(org.id, params.conversationId));
    },
  });

  t.add({
    method: 'post',
    path: '/v1/conversations/:conversationId/messages',
    tag: 'conversations',
    summary:
      'Send a message: a Workflow Update, validated before it is accepted; the next turn. Idempotency-Key makes a repeat answer the first. ' +
      '507 when the organisation is at its storage quota after garbage collection (nothing is stored).',
    params: ConversationParams,
    body: MessageBody,
    responses: {
      202: {
        description: 'Accepted: its turn number and how many messages are queued',
        schema: z.object({ turn: z.number().int(), queued: z.number().int() }),
      },
    },
    errors: [409, 507],
    handler: async ({ params, body, org, req, res }) => {
      res.status(202).json(await svc.message(org.id, params.conversationId, body.text, idempotencyKeyOf(req)));
    },
  });

  t.add({
    method: 'get',
    path: '/v1/conversations/:conversationId/turns',
    tag: 'conversations',
    summary: "The turns in order (a fork's first ones are its parent's, up to the fork point)",
    params: ConversationParams,
    responses: { 200: { description: 'Turns', schema: z.object({ turns: z.array(TurnView) }) } },
    handler: async ({ params, org, res }) => {
      res.json({ turns: await svc.turns(org.id, params.conversationId) });
    },
  });

  t.add({
    method: 'get',
    path: '/v1/conversations/:conversationId/result',
    tag: 'conversations',
    summary: "The head turn's yield reason, usage and result text",
    params: ConversationParams,
    responses: {
      200: {
        description: 'The result',
        schema: z.object({ status: z.string(), turn: z.number().int(), yieldReason: z.string().nullable(), result: z.string().nullable(), usage: z.unknown() }),
      },
    },
    handler: async ({ params, org, res }) => {
      res.json(await svc.result(org.id, params.conversationId));
    },
  });

  t.add({
    method: 'get',
    path: '/v1/conversations/:conversationId/events',
    tag: 'conversations',
    summary: 'Events after a sequence number: a JSON page, or Server-Sent Events (Accept: text/event-stream; Last-Event-ID resumes) that follow',
    params: ConversationParams,
    query: EventsQuery,
    responses: {
      200: {
        description: 'A page of events; `next` is the `after` of the next page',
        schema: z.object({ events: z.array(EventView), next: z.number().int() }),
      },
    },
    handler: async ({ params, query, org, req, res }) => {
      const lastId = req.header('last-event-id');
      const after = lastId !== undefined && /^\d{1,15}$/.test(lastId) ? Number(lastId) : query.after;
      if ((req.header('accept') ?? '').includes('text/event-stream')) {
        await svc.get(org.id, params.conversationId);
        return followEvents(svc, org.id, params.conversationId, after, query.level, res);
      }
      const events = await svc.events(org.id, params.conversationId, after, query.level, query.limit);
      res.json({ events, next: events.at(-1)?.seq ?? after });
    },
  });

  t.add({
    method: 'post',
    path: '/v1/conversations/:conversationId/interrupt',
    tag: 'conversations',
    summary: 'Interrupt the running turn (it ends with yieldReason interrupted); queued messages stay',
    params: ConversationParams,
    responses: { 200: { description: 'The turn interrupted (null: none was running)', schema: z.object({ turn: z.number().int().nullable() }) } },
    errors: [409],
    handler: async ({ params, org, res }) => {
      res.json(await svc.interrupt(org.id, params.conversationId));
    },
  });

  t.add({
    method: 'post',
    path: '/v1/conversations/:conversationId/cancel',
    tag: 'conversations',
    summary: 'Cancel: drop the queued messages and interrupt the running turn; the conversation stays open',
    params: ConversationParams,
    responses: {
      200: { description: 'What was dropped and interrupted', schema: z.object({ dropped: z.number().int(), interrupted: z.number().int().nullable() }) },
    },
    errors: [409],
    handler: async ({ params, org, res }) => {
      res.json(await svc.cancel(org.id, params.conversationId));
    },
  });

  t.add({
    method: 'post',
    path: '/v1/conversations/:conversationId/archive',
    tag: 'conversations',
    summary: 'Archive: the workflow ends and destroys the sandbox; turns, events and checkpoints stay, so it can still be forked',
    params: ConversationParams,
    responses: { 200: { description: 'The conversation', schema: ConversationView } },
    handler: async ({ params, org, res }) => {
      res.json(await svc.archive(org.id, params.conversationId));
    },
  });

  t.add({
    method: 'delete',
    path: '/v1/conversations/:conversationId',
    tag: 'conversations',
    summary: 'Delete an archived conversation with its turns, events and turn checkpoints (409 while it is not archived or has forks)',
    params: ConversationParams,
    responses: { 200: { description: 'Deleted', schema: z.object({ id: z.string(), deleted: z.literal(true) }) } },
    errors: [409],
    handler: async ({ params, org, res }) => {
      res.json(await svc.remove(org.id, params.conversationId));
    },
  });

  t.add({
    method: 'post',
    path: '/v1/conversations/:conversationId/rewind',
    tag: 'conversations',
    summary:
      'Rewind to the end of a turn: the sandbox (files and agent memory) goes back to its checkpoint; later turns are kept, marked left. ' +
      'Behind the answer, the checkpoints of left turns nothing stands on are freed; 409 for a turn whose checkpoint was freed.',
    params: ConversationParams,
    body: RewindBody,
    responses: { 200: { description: 'The new head and the turns left', schema: z.object({ headTurn: z.number().int(), left: z.array(z.number().int()) }) } },
    errors: [409],
    handler: async ({ params, body, org, res }) => {
      res.json(await svc.rewind(org.id, params.conversationId, body.turn));
    },
  });

  t.add({
    method: 'post',
    path: '/v1/conversations/:conversationId/fork',
    tag: 'conversations',
    summary: 'Fork at the end of a turn: `count` new conversations over its checkpoint, sharing the event log up to it; `evaluate` ranks them (best-of-N)',
    params: ConversationParams,
    body: ForkBody,
    responses: {
      201: {
        description: 'The forks, and their group when count > 1 or evaluate',
        schema: z.object({ group: z.string().nullable(), forks: z.array(ConversationView) }),
      },
    },
    errors: [409, 507],
    handler: async ({ params, body, org, req, res }) => {
      res.status(201).json(await svc.fork(org.id, params.conversationId, body, idempotencyKeyOf(req)));
    },
  });

  t.add({
    method: 'get',
    path: '/v1/conversations/forks/:group',
    tag: 'conversations',
    summary: "A best-of-N fork group: each fork's first turn and its evaluation's exit code and output tail, ranked (exit code 0 first)",
    params: z.object({ group: z.string().regex(/^fg_[a-z0-9]{1,40}$/, 'must be a fork group id (fg_…)') }),
    responses: {
      200: {
        description: 'The ranking; done once every fork was evaluated',
        schema: z.object({ group: z.string(), done: z.boolean(), ranked: z.array(z.unknown()) }),
      },
    },
    handler: async ({ params, org, res }) => {
      res.json(await svc.forkGroup(org.id, params.group));
    },
  });
}
