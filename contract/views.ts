/**
 * The public API's answers and bodies as types, inferred from the zod schemas the server validates
 * and documents with (so a client cannot drift from the server).
 */
import type { z } from 'zod';
import type { Agent, CreateAgentBody, Outcome, Session, SessionResult, UpdateAgentBody } from './schemas';
import type { Batch, BatchItem, BatchResultLine } from './batch-schemas';
import type { WebhookView as WebhookViewSchema } from './webhooks';
import type { ConsoleConfig, Host } from './console';

export type AgentView = z.infer<typeof Agent>;
export type CreateAgentInput = z.input<typeof CreateAgentBody>;
export type UpdateAgentInput = z.input<typeof UpdateAgentBody>;
export type SessionView = z.infer<typeof Session>;
export type SessionOutcomeView = z.infer<typeof Outcome>;
export type SessionResultView = z.infer<typeof SessionResult>;
export type BatchView = z.infer<typeof Batch>;
export type BatchResult = z.infer<typeof BatchResultLine>;
export type BatchItemInput = z.input<typeof BatchItem>;
/** A webhook as answers show it (never its secret), or null. */
export type WebhookView = z.infer<typeof WebhookViewSchema>;

/**
 * An instance (SPEC 2.2). The server has no zod schema for instances yet, so this one type is
 * written here; replace it with `z.infer<typeof Instance>` once contract/schemas.ts has one.
 */
export interface InstanceView {
  id: string;
  agent_id: string;
  status: string;
  metadata: Record<string, unknown>;
  created_at: string;
  updated_at: string;
}
/** A sandbox host as GET /api/hosts shows it (the web console's hosts page). */
export type HostView = z.infer<typeof Host>;
export type ConsoleConfigView = z.infer<typeof ConsoleConfig>;
