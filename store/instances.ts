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
