import type { z } from 'zod';
import type { Agent, Session, SessionResult } from '../contract/schemas';
import type { Batch } from '../contract/batch-schemas';
import { DEFAULT_INJECT_INTO } from '../contract/sealed';
import { fromJsonText, type AgentDoc, type SessionDoc } from '../store';
import type { BatchDoc } from '../store/batches';
import type { InstanceDoc } from '../store/instances';
import type { SecretEntryDoc, SecretStoreDoc } from '../store/secrets';
import type { ReservationDoc } from '../store/capacity';
import { webhookView } from './webhooks/webhook-rules';
import type { SandboxView } from '../contract/sandboxes';
import type { SandboxDoc } from '../store/sandboxes';
import { patchFields } from './checkpoints/patch-state';

/** The public form of a session (2.1), plus `outcome` once it has ended: what GET answers and a webhook carries. */
export function sessionView(s: SessionDoc): z.infer<typeof Session> {
  return {
    id: s._id,
    agent_id: s.agent_id,
    status: s.status,
    input: fromJsonText(s.input) ?? {},
    result: fromJsonText(s.result),
    preview_url: s.preview_url,
    metadata: fromJsonText(s.metadata) ?? {},
    outcome: s.outcome,
    created_at: s.created_at.toISOString(),
    updated_at: s.updated_at.toISOString(),
  };
}

/** The public form of a batch: what GET answers and a webhook carries. */
export function batchView(b: BatchDoc): z.infer<typeof Batch> {
  return {
    id: b._id,
    agent_id: b.agent_id,
    status: b.status,
    total: b.total,
    concurrency: b.concurrency,
    max_attempts: b.max_attempts,
    counts: b.counts,
    created_at: b.created_at.toISOString(),
    updated_at: b.updated_at.toISOString(),
    completed_at: b.completed_at ? b.completed_at.toISOString() : null,
    webhook: webhookView(b.webhook),
  };
}

/** A finished session's result (GET …/sessions/{id}/result): its data and how it ended. */
export function sessionResultView(s: SessionDoc): z.infer<typeof SessionResult> {
  return {
    status: s.status as 'completed' | 'failed',
    data: fromJsonText(s.result),
    completed_at: (s.completed_at ?? s.updated_at).toISOString(),
    reason: s.outcome?.reason ?? null,
    exit_code: s.outcome?.exit_code ?? null,
    message: s.outcome?.message ?? null,
  };
}

/** The public form of an agent. Environment values are secrets: they are never returned. */
export function agentView(a: AgentDoc): z.infer<typeof Agent> {
  return {
    id: a.id,
    display_name: a.display_name,
    core: a.core,
    channels: a.channels,
    packages: a.packages,
    secret_store: a.secret_store,
    config: fromJsonText(a.config),
    entrypoint: a.entrypoint,
    files: Object.fromEntries(a.files.map((f) => [f.path, f.content])),
    env: Object.fromEntries(Object.keys(a.env ?? {}).map((k) => [k, '[set]'])),
    snapshot: a.snapshot,
    timeoutSeconds: a.timeoutSeconds,
    memoryMB: a.memoryMB ?? null,
    cpuCount: a.cpuCount ?? null,
    diskMB: a.diskMB ?? null,
    network: a.network ?? null,
    user: a.user ?? null,
    webhook: webhookView(a.webhook),
    retryOnHostLoss: a.retryOnHostLoss ?? false,
    created_at: a.created_at.toISOString(),
    updated_at: a.updated_at.toISOString(),
  };
}

/** The public form of an instance (2.2), plus its sandbox, snapshot and failure reason. */
export function instanceView(i: InstanceDoc) {
  return {
    id: i._id,
    agent_id: i.agent_id,
    status: i.status,
    metadata: fromJsonText(i.metadata) ?? {},
    sandbox_id: i.sandbox_id,
    snapshot_id: i.snapshot_id,
    error: i.error,
    created_at: i.created_at.toISOString(),
    updated_at: i.updated_at.toISOString(),
  };
}

/** The public form of a secret store (no secrets). */
export const secretStoreView = (d: SecretStoreDoc) => ({
  id: d.id,
  name: d.name,
  egressAllowlist: d.egressAllowlist ?? [],
  createdAt: d.createdAt.toISOString(),
  updatedAt: d.updatedAt.toISOString(),
});

/** The public form of a secret: never its value. */
export const secretEntryView = (e: SecretEntryDoc) => ({
  storeId: e.storeId,
  name: e.name,
  allowedHosts: e.allowedHosts ?? [],
  injectInto: e.injectInto?.length ? e.injectInto : [...DEFAULT_INJECT_INTO],
  createdAt: e.createdAt.toISOString(),
  updatedAt: e.updatedAt.toISOString(),
});

/** The public form of a capacity reservation. */
export const reservationView = (r: ReservationDoc) => ({
  id: r._id,
  startsAt: r.startsAt.toISOString(),
  endsAt: r.endsAt.toISOString(),
  capacityGb: r.capacityGb,
  createdAt: r.createdAt.toISOString(),
});

/** The public form of a sandbox (OpenComputer's shape: `sandboxID`, camelCase fields). */
export function sandboxView(deps: { cfg: { PREVIEW_DOMAIN: string } }, s: SandboxDoc & { hostLost?: boolean }): z.infer<typeof SandboxView> {
  return {
    sandboxID: s._id,
    status: s.hostLost ? 'lost' : s.status,
    templateID: s.templateID,
    metadata: (JSON.parse(s.metadata) as Record<string, string> | null) ?? {},
    timeout: s.timeout,
    onTimeout: s.onTimeout ?? 'kill',
    hibernatedAt: s.status === 'hibernated' && s.hibernation ? s.hibernation.at.toISOString() : null,
    memoryMB: s.memoryMB,
    cpuCount: s.cpuCount,
    diskMB: s.diskMB ?? null,
    fromCheckpoint: s.fromCheckpoint,
    snapshot: s.snapshot,
    sandboxDomain: deps.cfg.PREVIEW_DOMAIN,
    network: s.network ?? { egress: 'internet' },
    user: s.user ?? 'root',
    createdAt: s.createdAt.toISOString(),
    ...patchFields(s),
  };
}
