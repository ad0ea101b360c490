import type { StepServices } from '../services/step-services';
import type { HostClient } from '../sandbox';
import type { SecretBox } from '../lib/secret-box';

/** What the activities need from the process that runs them (the worker beside a sandbox host). */
export interface ActivityDeps {
  /** The services of the workflows' steps, as the worker built them (services/index.ts createWorkerServices): each activity calls one. */
  services: StepServices;
  /** The sandbox host on this machine (an entrypoint's exit is awaited on it). */
  host: HostClient;
  /** Webhook deliveries: the allow list (WEBHOOK_ALLOWED_CIDRS), the attempt's time limit and how much of the answer is read. Absent: the defaults. */
  webhooks?: { allowedCidrs: string; timeoutMs: number; answerMaxBytes: number };
  /** Opens webhook secrets (the same SECRETS_KEY as the API's). */
  secrets: SecretBox;
}
