/** The webhook of a create body and of an answer (their rules are services/webhooks/webhook-rules.ts, the delivery activities/webhooks.ts). */
import { z } from './zod';

const MAX_URL = 2048;

/** `webhook` of a create body: an absolute http(s) URL without credentials, and an optional secret. */
export const WebhookInput = z
  .object({
    url: z
      .string()
      .max(MAX_URL)
      .refine((v) => {
        try {
          const u = new URL(v);
          return (u.protocol === 'http:' || u.protocol === 'https:') && !u.username && !u.password && !!u.hostname;
        } catch {
          return false;
        }
      }, 'must be an absolute http(s) URL without credentials'),
    secret: z.string().min(8).max(256).optional().describe('HMAC-SHA256 key of the X-SAP-Signature header; never returned'),
  })
  .strict();

/** What answers show of a webhook: never the secret. */
export const WebhookView = z.object({ url: z.string(), has_secret: z.boolean() }).nullable();
