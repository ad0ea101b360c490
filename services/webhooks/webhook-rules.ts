import { createHmac } from 'node:crypto';
import type { z } from 'zod';
import { WebhookInput, WebhookView } from '../../contract/webhooks';
import type { SecretBox } from '../../lib/secret-box';
import type { StoredWebhook, WebhookSpec } from '../../contract/workflows';
import { invalid } from '../../contract/errors';
import { refusedUrl, targetPolicy, type LookupAll } from './webhook-target';

/**
 * Webhooks: an agent, a session or a batch may name a URL that is POSTed to when a session ends
 * (or a batch completes). The secret is kept sealed (lib/secret-box.ts, context `webhook:<org>`):
 * it travels sealed in workflow arguments and is opened only by the activity that signs a delivery.
 */

export function webhookView(w: StoredWebhook | null | undefined): z.infer<typeof WebhookView> {
  return w ? { url: w.url, has_secret: !!w.secretSealed } : null;
}

export const webhookContext = (orgId: string): string => `webhook:${orgId}`;

/** The spec workflows carry: the stored webhook with the operator's retry schedule (WEBHOOK_* settings). */
export function webhookSpec(
  w: StoredWebhook,
  cfg: { WEBHOOK_RETRY_INITIAL_MS: number; WEBHOOK_RETRY_MAX_INTERVAL_MS: number; WEBHOOK_MAX_HOURS: number; WEBHOOK_TIMEOUT_MS: number },
): WebhookSpec {
  return {
    ...w,
    retry: {
      initialMs: cfg.WEBHOOK_RETRY_INITIAL_MS,
      maxIntervalMs: cfg.WEBHOOK_RETRY_MAX_INTERVAL_MS,
      maxHours: cfg.WEBHOOK_MAX_HOURS,
      attemptMs: cfg.WEBHOOK_TIMEOUT_MS,
    },
  };
}

/** The stored form of a webhook of organisation `orgId`: its secret sealed. */
export function sealWebhook(box: SecretBox, orgId: string, w: z.infer<typeof WebhookInput>): StoredWebhook {
  return { url: w.url, ...(w.secret !== undefined ? { secretSealed: box.seal(w.secret, webhookContext(orgId)) } : {}) };
}

/**
 * Refuses (400) a webhook URL whose literal address, or whose name's current addresses, the
 * operator's policy refuses (WEBHOOK_ALLOWED_CIDRS; services/webhooks/webhook-target.ts). Each delivery checks again.
 */
export async function assertWebhookTarget(
  cfg: { WEBHOOK_ALLOWED_CIDRS: string; WEBHOOK_RESOLVE_TIMEOUT_MS: number },
  url: string,
  where: string,
  lookup?: LookupAll,
): Promise<void> {
  const why = await refusedUrl(targetPolicy(cfg.WEBHOOK_ALLOWED_CIDRS), url, cfg.WEBHOOK_RESOLVE_TIMEOUT_MS, lookup);
  if (why) throw invalid(`${where}: ${why}`);
}

/** The signature header of a delivery: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`. */
export function signature(secret: string, body: string, unixSeconds: number): string {
  const mac = createHmac('sha256', secret).update(`${unixSeconds}.${body}`).digest('hex');
  return `t=${unixSeconds},v1=${mac}`;
}
