import type { Store } from './index';

export type InstanceStatus = 'creating' | 'running' | 'failed' | 'stopped';

/**
 * An instance: a persistent sandbox of an agent, provisioned and destroyed by its workflow
 * (workflow id = `_id` = `inst_<id>`). Metadata is kept as JSON text, and as `key=value` strings
 * (`metaPairs`, for top-level string/number/boolean values) so that it can be filtered on
 * (keys with `.` or `$` cannot be stored as object keys on FerretDB).
 */
export interface InstanceDoc {
  _id: string;
  orgId: string;
  agent_id: string;
  status: InstanceStatus;
  metadata: string;
  metaPairs: string[];
  sandbox_id: string | null;
  snapshot_id: string | null;
  /** Why provisioning failed (status `failed`). */
  error: string | null;
  created_at: Date;
  updated_at: Date;
}

export const instancesOf = (store: Store) => store.db.collection<InstanceDoc>('instances');

/** `key=value` strings for the filterable (scalar) values of a metadata object. */
export function metaPairsOf(metadata: Record<string, unknown>): string[] {
  return Object.entries(metadata)
    .filter(([, v]) => typeof v === 'string' || typeof v === 'number' || typeof v === 'boolean')
    .map(([k, v]) => `${k}=${String(v)}`);
}

/** The sandbox of an instance: derived from the instance id so a retried provision finds it again. */
export function sandboxIdForInstance(instanceId: string): string {
  return `sb-${instanceId.replace(/^inst_/, 'i')}`;
}

/** Reads an instance; null when there is none. */
export function findInstance(store: Store, id: string): Promise<InstanceDoc | null> {
  return instancesOf(store).findOne({ _id: id });
}

/** Stores a new instance. */
export async function insertInstance(store: Store, doc: InstanceDoc): Promise<void> {
  await instancesOf(store).insertOne(doc);
}

/** Deletes an instance document (its workflow could not be started). */
export async function deleteInstance(store: Store, id: string): Promise<void> {
  await instancesOf(store).deleteOne({ _id: id });
}

/** Up to `limit` instances matching `filter`, newest first. */
export function listInstances(store: Store, filter: Record<string, unknown>, limit: number): Promise<InstanceDoc[]> {
  return instancesOf(store).find(filter).sort({ created_at: -1, _id: -1 }).limit(limit).toArray();
}

/** Records an instance stopped (nothing owns a sandbox for it any more). */
export async function markInstanceStopped(store: Store, id: string): Promise<void> {
  await markInstanceStoppedAt(store, id, new Date());
}

/** Records an instance stopped at `at`. */
export async function markInstanceStoppedAt(store: Store, id: string, at: Date): Promise<void> {
  await instancesOf(store).updateOne({ _id: id }, { $set: { status: 'stopped', updated_at: at } });
}

/** Records an instance running in sandbox `sandboxId` (made from `snapshotId`, if any). */
export async function markInstanceRunning(store: Store, id: string, sandboxId: string, snapshotId: string | null): Promise<void> {
  await instancesOf(store).updateOne({ _id: id }, { $set: { status: 'running', sandbox_id: sandboxId, snapshot_id: snapshotId, updated_at: new Date() } });
}

/** Records an instance's end: `failed` with its reason, or `stopped`. */
export async function recordInstanceStatus(store: Store, id: string, status: 'failed' | 'stopped', error: string | null, at = new Date()): Promise<void> {
  await instancesOf(store).updateOne({ _id: id }, { $set: { status, error, updated_at: at } });
}
