import type { SecretBox } from '../lib/secret-box';

/**
 * An agent's `env` values are secrets. They are sealed (lib/secret-box.ts, under SECRETS_KEY)
 * with the context `agent-env:<orgId>/<agentId>/<NAME>` when the agent is written, stay sealed in
 * MongoDB and in every workflow's arguments (so Temporal's history and database, and its Web UI,
 * show the names and a ciphertext, never a value), and are opened only by the worker's activity
 * that creates the sandbox. A value copied to another organisation, agent or name does not open.
 */
export const agentEnvContext = (orgId: string, agentId: string, name: string): string => `agent-env:${orgId}/${agentId}/${name}`;

/** `env` with each value sealed for the agent `agentId` of `orgId`. */
export function sealAgentEnv(box: SecretBox, orgId: string, agentId: string, env: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(env).map(([name, value]) => [name, box.seal(value, agentEnvContext(orgId, agentId, name))]));
}

/** An agent's env values do not open with this process's key. */
export class AgentEnvUnreadable extends Error {
  override name = 'AgentEnvUnreadable';
  constructor(agentId: string, envName: string) {
    super(
      `env ${envName} of agent ${agentId} does not open with this SECRETS_KEY; set it again (PATCH the agent's env), or give every process the key it was set with`,
    );
  }
}

/**
 * The plain values of a sealed env (as runSpecOf carries it). `sealed` false: a value written
 * before env values were sealed (an agent or a workflow started by an older version), used as is.
 * Throws AgentEnvUnreadable, without the value or its ciphertext, when one does not open.
 */
export function openAgentEnv(
  box: SecretBox,
  orgId: string,
  agentId: string,
  env: Record<string, string> | undefined,
  sealed: boolean | undefined,
): Record<string, string> {
  if (!env) return {};
  if (!sealed) return { ...env };
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(env)) {
    try {
      out[name] = box.open(value, agentEnvContext(orgId, agentId, name));
    } catch {
      throw new AgentEnvUnreadable(agentId, name);
    }
  }
  return out;
}
