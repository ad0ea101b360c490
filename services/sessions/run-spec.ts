/** What a session's workflow is given to run an agent: built from the agent's record. */
import type { AgentRunSpec } from '../../contract/workflows';
import type { SecretBox } from '../../lib/secret-box';
import type { AgentDoc } from '../../store';
import { sealAgentEnv } from '../../store/agent-env';

/**
 * The run spec of an agent, as a session's workflow receives it. Its env values are sealed (an
 * agent written before they were sealed has them sealed here): the workflow's arguments, which
 * Temporal keeps in its history, never hold a value.
 */
export function runSpecOf(a: AgentDoc, box: SecretBox): AgentRunSpec {
  return {
    core: a.core,
    entrypoint: a.entrypoint,
    files: Object.fromEntries(a.files.map((f) => [f.path, f.content])),
    env: a.envSealed ? a.env : sealAgentEnv(box, a.orgId, a.id, a.env ?? {}),
    envSealed: true,
    snapshot: a.snapshot,
    timeoutSeconds: a.timeoutSeconds,
    // The name only: values are read by the worker when it creates the sandbox, never carried in
    // workflow arguments (Temporal's history would keep them).
    ...(a.secret_store ? { secretStore: a.secret_store } : {}),
    // Only when set: the run spec travels in every session's workflow arguments.
    ...(a.memoryMB != null ? { memoryMB: a.memoryMB } : {}),
    ...(a.cpuCount != null ? { cpuCount: a.cpuCount } : {}),
    ...(a.diskMB != null ? { diskMB: a.diskMB } : {}),
    ...(a.network != null ? { network: a.network } : {}),
    ...(a.retryOnHostLoss ? { retryOnHostLoss: true } : {}),
    ...(a.user != null ? { user: a.user } : {}),
  };
}
