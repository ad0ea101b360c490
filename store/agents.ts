import type { AgentDoc, Store } from './index';
import { addToList, listName, listUnlisted, pageListed, removeFromList } from './listing';
import type { SecretBox } from '../lib/secret-box';
import { sealAgentEnv } from './agent-env';

/** The `_id` of an agent: its organisation and its id. */
export const agentKey = (orgId: string, agentId: string): string => `${orgId}/${agentId}`;

/** Reads an agent of an organisation; null when there is none. */
export function findAgent(store: Store, orgId: string, agentId: string): Promise<AgentDoc | null> {
  return store.agents.findOne({ _id: agentKey(orgId, agentId) });
}

/** The list of an organisation's agents (store/listing.ts). */
const agentList = (orgId: string) => listName('agents', orgId);

/** Stores a new agent and lists it; throws MongoDB's duplicate-key error when its id is taken. */
export async function insertAgent(store: Store, doc: AgentDoc): Promise<void> {
  await store.agents.insertOne(doc);
  await addToList(store, agentList(doc.orgId), [{ _id: doc.id, created_at: doc.created_at }]);
}

/** Sets fields of an agent and returns it as updated; null when there is none. */
export function updateAgent(store: Store, _id: string, set: Record<string, unknown>): Promise<AgentDoc | null> {
  return store.agents.findOneAndUpdate({ _id }, { $set: set }, { returnDocument: 'after' });
}

/** Deletes an agent and its listing key. */
export async function deleteAgent(store: Store, agent: AgentDoc): Promise<void> {
  await store.agents.deleteOne({ _id: agent._id });
  await removeFromList(store, agentList(agent.orgId), { _id: agent.id, created_at: agent.created_at });
}

/** One page of an organisation's agents, newest first (a range of listing keys: its cost does not grow with the list). */
export function listAgents(store: Store, orgId: string, limit: number, cursor: string | undefined): Promise<{ page: AgentDoc[]; next_cursor: string | null }> {
  return pageListed(store, agentList(orgId), cursor, limit, (id) => findAgent(store, orgId, id));
}

/** Lists the agents stored before agents were listed by key, once per database; returns how many it read. */
export function listUnlistedAgents(store: Store): Promise<number> {
  return listUnlisted(store, 'migrated:agents-listed', store.agents.find({}, { projection: { orgId: 1, id: 1, created_at: 1 } }), (a) => ({
    list: agentList(a.orgId),
    id: a.id,
  }));
}

/** The ids of up to `limit` agents of an organisation that name the secret store `storeName`. */
export async function agentsNamingStore(store: Store, orgId: string, storeName: string, limit: number): Promise<string[]> {
  const users = await store.agents
    .find({ orgId, secret_store: storeName }, { projection: { id: 1 } })
    .limit(limit)
    .toArray();
  return users.map((a) => a.id);
}

/**
 * Seals the env of agents written before env values were sealed (run once at the API's start).
 * Each update matches only a doc still unsealed, so API processes starting together seal each once.
 * Returns how many agents it sealed.
 */
export async function sealLegacyAgentEnvs(store: Store, box: SecretBox): Promise<number> {
  let n = 0;
  for await (const a of store.agents.find({ envSealed: { $ne: true } }, { projection: { _id: 1, orgId: 1, id: 1, env: 1 } })) {
    const env = sealAgentEnv(box, a.orgId, a.id, a.env ?? {});
    const r = await store.agents.updateOne({ _id: a._id, envSealed: { $ne: true } }, { $set: { env, envSealed: true } });
    n += r.modifiedCount;
  }
  return n;
}
