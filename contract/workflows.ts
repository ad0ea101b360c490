/**
 * The workflows' arguments and results, and the domain types they carry (an agent's run spec, a
 * session's end, a webhook as workflows carry it): the bottom layer, imported by the workflows, the
 * activities, the services that start them and the store that keeps them. Types only.
 */

/** How a webhook is stored and carried: its secret sealed. */
export interface StoredWebhook {
  url: string;
  secretSealed?: string;
}

/** A webhook as workflows carry it: stored form plus the retry schedule the API set when it started them. */
export interface WebhookSpec extends StoredWebhook {
  /** attemptMs: WEBHOOK_TIMEOUT_MS, which bounds the activity's own time limit (absent in specs from before it existed). */
  retry: { initialMs: number; maxIntervalMs: number; maxHours: number; attemptMs?: number };
}

/** What a session needs to run an agent; copied into each session's workflow arguments. */
export interface AgentRunSpec {
  core: string;
  entrypoint: string[];
  files: Record<string, string>;
  /** Names and values; each value sealed (store/agent-env.ts) when envSealed is set. */
  env: Record<string, string>;
  /** The env values are sealed; absent: plain values, written before they were sealed. */
  envSealed?: boolean;
  snapshot: string | null;
  timeoutSeconds: number;
  /** Limits of the agent's sandboxes; absent: the operator's defaults (config/limits.ts). */
  memoryMB?: number;
  cpuCount?: number;
  diskMB?: number;
  /** The agent's secret store (its secrets become environment variables when the sandbox is created). */
  secretStore?: string;
  /** What its sandboxes may reach (sandbox/network.ts); absent: the default, `internet`. */
  network?: { egress: 'internet' | 'none' | { allow: string[] } };
  /** Set at session creation when `snapshot` is: the snapshot's id and the task queue of the host that has its layer. */
  snapshotRef?: { snapshotId: string; taskQueue: string };
  /** Set at session (or batch) start when a webhook applies: the session's own, else the agent's. */
  webhook?: WebhookSpec;
  /** Run again from the start on another host when the sandbox's host is lost (else: failed, host_lost). */
  retryOnHostLoss?: boolean;
  /** Who its sandboxes' processes run as; absent: the operator's default (SANDBOX_USER, else root). */
  user?: 'root' | 'sandbox';
}

/** Why a session ended (null while it runs, and for a clean exit 0). */
export interface SessionOutcome {
  reason: 'exit_code' | 'timeout' | 'cancelled' | 'invalid_result' | 'oom' | 'provisioning_failed' | 'host_lost' | null;
  exit_code: number | null;
  message: string | null;
}

/** How a session ended: what the activities hand back to the workflow and record. */
export interface SessionEnd {
  status: 'completed' | 'failed';
  result: Record<string, unknown> | null;
  outcome: SessionOutcome | null;
}

/** How many of a batch's items are in each state. */
export interface BatchCounts {
  pending: number;
  running: number;
  completed: number;
  failed: number;
}

/** Arguments of one session's workflow. The workflow id is the session id. */
export interface SessionWorkflowArgs {
  sessionId: string;
  orgId: string;
  agentId: string;
  run: AgentRunSpec;
  /** The session's input (JSON text) when it is small; a larger one is read from MongoDB by provisioning. */
  input?: string;
}

/** What a batch carries from one run to the next when it continues as new. */
export interface BatchProgress {
  /** Items `0 … next-1` have been started at least once. */
  next: number;
  completed: number;
  failed: number;
  /** Items `0 … prepared-1` have their first attempt's session document. */
  prepared: number;
  /** Failed items waiting for another attempt. */
  retries: { index: number; attempt: number }[];
}

/** Arguments of a batch's workflow. The workflow id is the batch id. */
export interface BatchWorkflowArgs {
  batchId: string;
  orgId: string;
  agentId: string;
  run: AgentRunSpec;
  total: number;
  concurrency: number;
  maxAttempts: number;
  progress?: BatchProgress;
  /** The batch's own webhook, called once when it completes or is cancelled. */
  webhook?: WebhookSpec;
}

/** Arguments of an instance's workflow. The workflow id is the instance id (`inst_<id>`). */
export interface InstanceWorkflowArgs {
  instanceId: string;
  orgId: string;
  agentId: string;
  run: AgentRunSpec;
}

export interface InstanceWorkflowResult {
  instanceId: string;
  status: 'failed' | 'stopped';
  error: string | null;
}

/** Arguments of a webhook delivery's workflow. */
export interface WebhookWorkflowArgs {
  event: 'session.ended' | 'batch.completed';
  orgId: string;
  subjectId: string;
  webhook: WebhookSpec;
}

/** What a session workflow returns (visible in the Temporal UI); the result data stays in MongoDB. */
export interface SessionWorkflowResult {
  sessionId: string;
  workflowId: string;
  status: 'completed' | 'failed';
  outcome: SessionOutcome | null;
}
