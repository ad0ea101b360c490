import type { Store } from '../../store';
import { readSession } from '../../store/sessions';
import { findBatch } from '../../store/batches';
import { batchView, sessionView } from '../views';

/** The events a webhook is called for. */
export type WebhookEventName = 'session.ended' | 'batch.completed';

/** Shapes what webhook deliveries carry. */
export interface WebhookService {
  /** The public form of the event's subject (the session, or the batch), as GET returns it; null when it does not exist. */
  payloadData(event: WebhookEventName, subjectId: string): Promise<unknown>;
}

export function createWebhookService(deps: { store: Store }): WebhookService {
  return {
    async payloadData(event, subjectId) {
      if (event === 'session.ended') {
        const s = await readSession(deps.store, subjectId);
        return s ? sessionView(s) : null;
      }
      const b = await findBatch(deps.store, subjectId);
      return b ? batchView(b) : null;
    },
  };
}
