import { api, eventually, unique } from './env';

/** Registers an agent (bash core unless given) and returns its id. */
export async function createAgent(entrypoint: string[], extra: Record<string, unknown> = {}): Promise<string> {
  const id = unique('agent');
  const r = await api('POST', '/v1/agents', { body: { id, core: 'bash', entrypoint, ...extra } });
  if (r.status !== 201) throw new Error(`create agent: ${r.status} ${JSON.stringify(r.body)}`);
  return id;
}

/** A bash agent running `script`. */
export const bashAgent = (script: string, extra: Record<string, unknown> = {}) => createAgent(['bash', '-c', script], extra);

/**
 * A `bashAgent` whose agents are deleted after the calling file's tests (it registers the afterAll);
 * each id is also pushed on `ids` when given (a list the file adds other agents to).
 */
export function bashAgentsDeletedAfterAll(ids: string[] = []) {
  afterAll(async () => {
    for (const id of ids) await api('DELETE', `/v1/agents/${id}`).catch(() => undefined);
  });
  return async (script: string, extra: Record<string, unknown> = {}): Promise<string> => {
    const id = await bashAgent(script, extra);
    ids.push(id);
    return id;
  };
}

export async function startSession(agentId: string, body: Record<string, unknown> = {}, headers: Record<string, string> = {}) {
  const r = await api('POST', `/v1/agents/${agentId}/sessions`, { body, headers });
  if (r.status !== 201 && r.status !== 200) throw new Error(`create session: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body as { id: string; status: string; [k: string]: unknown };
}

/** Waits until the session reaches one of `statuses` and returns it. */
export async function waitForStatus(agentId: string, id: string, statuses: string[], timeoutMs = 60_000) {
  return eventually(
    async () => {
      const r = await api('GET', `/v1/agents/${agentId}/sessions/${id}`);
      return statuses.includes(r.body.status) ? r.body : undefined;
    },
    timeoutMs,
    100,
  );
}

/** Starts a session and waits for it to end; returns the session and its result answer. */
export async function runSession(agentId: string, input: Record<string, unknown> = {}) {
  const s = await startSession(agentId, { input });
  const done = await waitForStatus(agentId, s.id, ['completed', 'failed']);
  const result = await api('GET', `/v1/agents/${agentId}/sessions/${s.id}/result`);
  return { session: done, result: result.body, resultStatus: result.status };
}

/** Asks the sandbox host whether a sandbox still exists. */
export async function hostHasSandbox(sandboxId: string): Promise<boolean> {
  const r = await fetch(`${process.env.SAP_TEST_HOST_URL}/sandboxes/${sandboxId}`, { headers: { authorization: `Bearer ${process.env.SAP_TEST_HOST_TOKEN}` } });
  return r.status === 200;
}

export const sandboxOf = (sessionId: string): string => `sb-${sessionId.replace(/^sess_/, 's')}`;
