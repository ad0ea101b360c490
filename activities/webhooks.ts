import { failure } from './failures';
import { signature, webhookContext } from '../services/webhooks/webhook-rules';
import type { StoredWebhook } from '../contract/workflows';
import { postChecked, targetPolicy, WebhookTargetRefused } from '../services/webhooks/webhook-target';
import type { ActivityDeps } from './deps';

/** WEBHOOK_TIMEOUT_MS, WEBHOOK_ANSWER_MAX_BYTES and WEBHOOK_ALLOWED_CIDRS when the worker passes none. */
const DEFAULTS = { allowedCidrs: '', timeoutMs: 10_000, answerMaxBytes: 4096 };

/** What a delivery is about: a session that ended, or a batch that completed. */
export interface WebhookEvent {
  event: 'session.ended' | 'batch.completed';
  orgId: string;
  /** The session's or the batch's id. */
  subjectId: string;
  /** Stable across retries: X-SAP-Delivery (the delivery workflow's id). */
  deliveryId: string;
}

export const createWebhookActivities = (deps: ActivityDeps, webhooks = deps.services.webhooks) => ({
  /**
   * One delivery attempt: POSTs the session's (or batch's) public form, as GET returns it, signed
   * when the webhook has a secret, to an address the operator's policy allows (checked after
   * resolving the name; the connection goes to the checked address). A 2xx answer delivers it;
   * anything else (another status, no whole exchange within WEBHOOK_TIMEOUT_MS, a refused
   * connection) throws, and Temporal retries it with backoff. A refused address fails it for good
   * (WebhookTargetRefused). Only WEBHOOK_ANSWER_MAX_BYTES of the answer are read; redirects are not followed.
   */
  async deliverWebhook(args: WebhookEvent & { webhook: StoredWebhook }): Promise<{ status: number }> {
    const data = await webhooks.payloadData(args.event, args.subjectId);
    if (data === null) throw failure('webhook_subject_not_found', `${args.event === 'session.ended' ? 'session' : 'batch'} ${args.subjectId} not found`);
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
    const opts = deps.webhooks ?? DEFAULTS;
    let res: { status: number };
    try {
      res = await postChecked(targetPolicy(opts.allowedCidrs), args.webhook.url, {
        headers,
        body,
        timeoutMs: opts.timeoutMs,
        maxAnswerBytes: opts.answerMaxBytes,
      });
    } catch (err) {
      if (err instanceof WebhookTargetRefused) throw failure('webhook_target_refused', `webhook refused: ${err.message}`);
      // The error's code (or name) only: its message could name internal addresses.
      throw failure('webhook_unreachable', `no answer from the webhook receiver: ${(err as NodeJS.ErrnoException).code ?? (err as Error).name}`);
    }
    if (res.status < 200 || res.status > 299) throw failure('webhook_refused', `the webhook receiver answered ${res.status}`);
    return { status: res.status };
  },
});
