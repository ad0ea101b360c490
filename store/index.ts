import { Collection, Db, MongoClient, MongoServerError } from 'mongodb';
import type { AgentRunSpec, SessionOutcome, StoredWebhook } from '../contract/workflows';

/** An organisation: the unit that owns every resource. */
export interface OrgDoc {
  _id: string;
  name: string;
  createdAt: Date;
  /** Per-organisation overrides of operator defaults: RESERVATION_LIMIT_GB, ORG_STORAGE_QUOTA_MB (0: unlimited). */
  settings: { reservationLimitGb?: number; storageQuotaMB?: number };
}

/** An API key, stored by the sha256 of the key (never the key itself). */
/** What a key may see: its organisation's resources (tenant), or also the fleet's views (operator; docs/threat-model.md). */
export type KeyRole = 'tenant' | 'operator';

export interface ApiKeyDoc {
  _id: string;
  orgId: string;
  label: string;
  /** Absent on keys stored before roles existed: tenant. `operator` is set only by `npm run keys` (scripts/keys.ts). */
  role?: KeyRole;
  prefix: string;
  createdAt: Date;
}

/**
 * A registered agent. `_id` is `<orgId>/<agentId>` so every read is an `_id` lookup.
 * Caller-supplied JSON (config) and file paths are stored as JSON text / arrays, since keys with
 * `.` or a leading `$` are not storable on every MongoDB-wire server.
 */
export interface AgentDoc extends Omit<
  AgentRunSpec,
  'files' | 'memoryMB' | 'cpuCount' | 'diskMB' | 'secretStore' | 'network' | 'webhook' | 'retryOnHostLoss' | 'user'
> {
  _id: string;
  orgId: string;
  id: string;
  display_name: string;
  channels: string[];
  packages: string[];
  secret_store: string;
  /** JSON text of the config object, or null. */
  config: string | null;
  files: { path: string; content: string }[];
  /** Limits of its sandboxes; absent or null: the operator's defaults. */
  memoryMB?: number | null;
  cpuCount?: number | null;
  diskMB?: number | null;
  /** Network policy of its sandboxes; absent or null: the default. */
  network?: { egress: 'internet' | 'none' | { allow: string[] } } | null;
  /** Called when each of its sessions ends; absent or null: none. */
  webhook?: StoredWebhook | null;
  /** See AgentRunSpec.retryOnHostLoss; absent: false. */
  retryOnHostLoss?: boolean;
  /** See AgentRunSpec.user; absent or null: the operator's default. */
  user?: 'root' | 'sandbox' | null;
  created_at: Date;
  updated_at: Date;
}

export type SessionStatus = 'creating' | 'running' | 'completed' | 'failed';

/** A session. input, metadata and result are kept as JSON text (see AgentDoc). */
export interface SessionDoc {
  _id: string;
  orgId: string;
  agent_id: string;
  status: SessionStatus;
  input: string;
  metadata: string;
  result: string | null;
  preview_url: string | null;
  outcome: SessionOutcome | null;
  sandbox_id: string | null;
  idempotency_key: string | null;
  /** The session's own webhook (overrides its agent's); absent: the agent's, if any. */
  webhook?: StoredWebhook | null;
  created_at: Date;
  updated_at: Date;
  started_at: Date | null;
  completed_at: Date | null;
}

/** The MongoDB collections, and the one client they share. */
export interface Store {
  client: MongoClient;
  db: Db;
  orgs: Collection<OrgDoc>;
  apiKeys: Collection<ApiKeyDoc>;
  agents: Collection<AgentDoc>;
  sessions: Collection<SessionDoc>;
  close(): Promise<void>;
  ping(): Promise<void>;
}

/**
 * Connects to MongoDB (or a wire-compatible server such as FerretDB) and makes sure the
 * indexes exist. Uses only what both MongoDB 7 and FerretDB support.
 */
export async function connectStore(url: string, opts: { ensureIndexes?: boolean } = {}): Promise<Store> {
  const client = new MongoClient(url, {
    serverSelectionTimeoutMS: 5000,
    maxPoolSize: 50,
    appName: 'sandbox-agent-platform',
  });
  await client.connect();
  const db = client.db();
  const store: Store = {
    client,
    db,
    orgs: db.collection<OrgDoc>('orgs'),
    apiKeys: db.collection<ApiKeyDoc>('api_keys'),
    agents: db.collection<AgentDoc>('agents'),
    sessions: db.collection<SessionDoc>('sessions'),
    close: () => client.close(),
    ping: async () => {
      await db.command({ ping: 1 });
    },
  };
  if (opts.ensureIndexes !== false) await ensureIndexes(store);
  return store;
}

async function ensureIndexes(store: Store): Promise<void> {
  await Promise.all([
    store.agents.createIndex({ orgId: 1, created_at: 1 }),
    store.sessions.createIndex({ orgId: 1, agent_id: 1, created_at: -1 }),
    store.apiKeys.createIndex({ orgId: 1 }),
    store.db.collection('secret_stores').createIndex({ orgId: 1, id: 1 }),
    store.db.collection('secret_entries').createIndex({ storeId: 1 }),
  ]);
}

/** Parses JSON text written by this service; null stays null. */
export function fromJsonText<T = Record<string, unknown>>(text: string | null): T | null {
  return text === null ? null : (JSON.parse(text) as T);
}

/** True when `err` is a duplicate-key error (code 11000), as an insert of an existing `_id` gives. */
export function isDuplicateKey(err: unknown): boolean {
  return err instanceof MongoServerError && err.code === 11000;
}
