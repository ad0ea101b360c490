import { ApplicationFailure } from '@temporalio/activity';
import { readSession } from '../store/sessions';
import { batchesOf } from '../store/batches';
import { sessionView } from '../api/routes/sessions';
import { batchView } from '../api/routes/batches';
import { signature, webhookContext, type StoredWebhook } from '../lib/webhooks';
import type { ActivityDeps } from './deps';

/** How long one delivery attempt may take before it counts as failed (and is retried). */
const ATTEMPT_TIMEOUT_MS = 10_000;

/** What a delivery is about: a session that ended, or a batch that completed. */
export interface WebhookEvent {
  event: 'session.ended' | 'batch.completed';
  orgId: string;
  /** The session's or the batch's id. */
  subjectId: string;
  /** Stable across retries: X-SAP-Delivery (the delivery workflow's id). */
  deliveryId: string;
}

export const createWebhookActivities = (deps: ActivityDeps) => ({
  /**
   * One delivery attempt: POSTs the session's (or batch's) public form, as GET returns it, signed
   * when the webhook has a secret. A 2xx answer delivers it; anything else (another status, no
   * answer within 10 s, a refused connection) throws, and Temporal retries it with backoff.
   */
  async deliverWebhook(args: WebhookEvent & { webhook: StoredWebhook }): Promise<{ status: number }> {
    let data: unknown;
    if (args.event === 'session.ended') {
      const s = await readSession(deps.store, args.subjectId);
      if (!s) throw ApplicationFailure.nonRetryable(`session ${args.subjectId} not found`, 'NotFound');
      data = sessionView(s);
    } else {
      const b = await batchesOf(deps.store).batches.findOne({ _id: args.subjectId });
      if (!b) throw ApplicationFailure.nonRetryable(`batch ${args.subjectId} not found`, 'NotFound');
      data = batchView(b);
    }
    const body = JSON.stringify({ event: args.event, delivery_id: args.deliveryId, data });
    const headers: Record<string, string> = {
      'content-type': 'application/json',
      'user-agent': 'sap-webhooks/1',
      'x-sap-event': args.event,
      'x-sap-delivery': args.deliveryId,
    };
    if (args.webhook.secretSealed) {
      const secret = deps.secrets.open(args.webhook.secretSealed, webhookContext(args.orgId));
      headers['x-sap-signature'] = signature(secret, body, Math.floor(Date.now() / 1000));
    }
    let res: Response;
    try {
      res = await fetch(args.webhook.url, { method: 'POST', headers, body, redirect: 'manual', signal: AbortSignal.timeout(ATTEMPT_TIMEOUT_MS) });
    } catch (err) {
      // The URL only: it is the caller's, while the error's details could name internal addresses.
      throw ApplicationFailure.retryable(`no answer from the webhook receiver: ${(err as Error).name}`, 'WebhookUnreachable');
    }
    await res.arrayBuffer().catch(() => undefined);
    if (res.status < 200 || res.status > 299) throw ApplicationFailure.retryable(`the webhook receiver answered ${res.status}`, 'WebhookRefused');
    return { status: res.status };
  },
});
