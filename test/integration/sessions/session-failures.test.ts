/**
 * A failed session fails its workflow: the Temporal UI shows it red and its Failures view counts it.
 * The failure is a non-retryable ApplicationFailure whose type is the outcome's reason and whose
 * message is the outcome's message; a session whose workflow was cancelled ends Canceled. MongoDB
 * stays the source of the session's state, and `?wait=` still answers as soon as it ends.
 * Each workflow carries a summary (its user metadata) that the UI shows in its list.
 */
import { ApplicationFailure, Client, Connection, WorkflowFailedError } from '@temporalio/client';
import { api, eventually, T } from '../../helpers/env';
import { bashAgentsDeletedAfterAll, startSession, waitForStatus } from '../../helpers/sessions';

jest.setTimeout(120_000);

let connection: Connection;
let client: Client;
const agents: string[] = [];
const agent = bashAgentsDeletedAfterAll(agents);

beforeAll(async () => {
  connection = await Connection.connect({ address: T.temporal() });
  client = new Client({ connection });
});

afterAll(async () => {
  await connection?.close();
});

/** The failure the session's workflow ended with (its result() rejects with it). */
async function workflowFailure(sessionId: string): Promise<{ status: string; cause: unknown }> {
  const handle = client.workflow.getHandle(sessionId);
  const cause = await handle.result().then(
    () => null,
    (err: unknown) => (err instanceof WorkflowFailedError ? err.cause : err),
  );
  return { status: (await handle.describe()).status.name, cause };
}

describe('failed sessions in Temporal', () => {
  it("a non-zero exit fails the workflow with type exit_code and the outcome's message; ?wait answers at once", async () => {
    const id = await agent('echo oops >&2; exit 3');
    const s = await startSession(id, { input: { task: 'fail please' } });
    const waited = await api('GET', `/v1/agents/${id}/sessions/${s.id}?wait=60`);
    expect(waited.status).toBe(200);
    expect(waited.body).toMatchObject({ status: 'failed', outcome: { reason: 'exit_code', exit_code: 3 } });
    const { status, cause } = await workflowFailure(s.id);
    expect(status).toBe('FAILED');
    expect(cause).toBeInstanceOf(ApplicationFailure);
    const failure = cause as ApplicationFailure;
    expect(failure.type).toBe('exit_code');
    expect(failure.details).toEqual([expect.objectContaining({ sessionId: s.id, status: 'failed', outcome: waited.body.outcome })]);
    expect(failure.nonRetryable).toBe(true);
    expect(failure.message).toBe(waited.body.outcome.message);
    // The summary the UI lists: agent and session, never the input (readable without the payload codec).
    const summary = await (await client.workflow.getHandle(s.id).describe()).staticSummary();
    expect(summary).toContain(`agent ${id}`);
    expect(summary).toContain(`session ${s.id}`);
    expect(summary).not.toContain('fail please');
  });

  it('a timeout fails the workflow with type timeout; a completed session completes it', async () => {
    const slow = await agent('sleep 30', { timeoutSeconds: 1 });
    const s = await startSession(slow);
    await waitForStatus(slow, s.id, ['failed']);
    const { status, cause } = await workflowFailure(s.id);
    expect([status, (cause as ApplicationFailure).type]).toEqual(['FAILED', 'timeout']);

    const ok = await agent('echo "{}" > /tmp/agent_result.json');
    const done = await startSession(ok);
    await waitForStatus(ok, done.id, ['completed']);
    const handle = client.workflow.getHandle(done.id);
    expect(await handle.result()).toMatchObject({ status: 'completed' });
    expect((await handle.describe()).status.name).toBe('COMPLETED');
  });

  it('a session deleted while running ends its workflow Canceled, and is failed/cancelled in the API', async () => {
    const id = await agent('sleep 60');
    const s = await startSession(id);
    await waitForStatus(id, s.id, ['running']);
    const del = await api('DELETE', `/v1/agents/${id}/sessions/${s.id}`);
    expect(del.status).toBe(200);
    expect(del.body).toMatchObject({ status: 'failed', outcome: { reason: 'cancelled' } });
    const status = await eventually(
      async () => {
        const d = await client.workflow.getHandle(s.id).describe();
        return d.status.name === 'RUNNING' ? undefined : d.status.name;
      },
      30_000,
      200,
    );
    expect(status).toBe('CANCELLED');
  });

  it('the Failures view finds failed sessions: ExecutionStatus = "Failed" with the agent id', async () => {
    const id = await agent('exit 7');
    const s = await startSession(id);
    await waitForStatus(id, s.id, ['failed']);
    const ids = await eventually(
      async () => {
        const found: string[] = [];
        for await (const wf of client.workflow.list({ query: `AgentId = "${id}" AND ExecutionStatus = "Failed"` })) found.push(wf.workflowId);
        return found.length ? found : undefined;
      },
      30_000,
      500,
    );
    expect(ids).toEqual([s.id]);
  });
});
