import type { Res } from './env';
import { eventually } from './env';

type Call = (method: string, path: string, body?: unknown) => Promise<Res>;

/**
 * A conversation of `agentId` (as `call`'s organisation) and a fork group made from it at turn 0
 * (forking waits for its starting checkpoint); `archive` archives all three.
 */
export async function conversationWithForkGroup(call: Call, agentId: string): Promise<{ conversation: string; group: string; archive: () => Promise<void> }> {
  const c = await call('POST', `/v1/agents/${agentId}/conversations`, { runner: ['true'] });
  if (c.status !== 201) throw new Error(`conversation: ${c.status} ${JSON.stringify(c.body)}`);
  const conversation = c.body.id as string;
  const group = await eventually(
    async () => {
      const r = await call('POST', `/v1/conversations/${conversation}/fork`, { turn: 0, count: 2 });
      return r.status === 201 ? (r.body as { group: string; forks: { id: string }[] }) : undefined;
    },
    120_000,
    250,
  );
  return {
    conversation,
    group: group.group,
    archive: async () => {
      for (const id of [conversation, ...group.forks.map((f) => f.id)]) await call('POST', `/v1/conversations/${id}/archive`);
    },
  };
}
