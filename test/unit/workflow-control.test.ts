import { WorkflowExecutionAlreadyStartedError, WorkflowNotFoundError, type Client } from '@temporalio/client';
import { endWorkflowAndWait, startWorkflowOnce } from '../../services/workflow-control';
import type { SessionWorkflowArgs } from '../../contract/workflows';

/** A Temporal client of which only what the functions use is real: start and a handle's result. */
function fakeClient(o: { start?: (...a: unknown[]) => Promise<unknown>; result?: () => Promise<unknown> }): { client: Client; asked: string[] } {
  const asked: string[] = [];
  const handle = { workflowId: 'wf', result: o.result ?? (() => Promise.resolve(undefined)) };
  const client = {
    workflow: {
      start: o.start ?? (() => Promise.resolve(undefined)),
      getHandle: (id: string) => {
        asked.push(id);
        return handle;
      },
    },
  } as unknown as Client;
  return { client, asked };
}

describe('workflow control', () => {
  const sessionArgs: SessionWorkflowArgs = {
    sessionId: 'sess_1',
    orgId: 'org',
    agentId: 'a',
    run: { core: 'bash', entrypoint: ['true'], files: {}, env: {}, snapshot: null, timeoutSeconds: 60 },
  };

  it('starts a workflow once: an existing one is not an error, another failure is thrown', async () => {
    const exists = fakeClient({ start: () => Promise.reject(new WorkflowExecutionAlreadyStartedError('started', 'wf', 'sessionWorkflow')) });
    await expect(startWorkflowOnce(exists.client, 'sessionWorkflow', { taskQueue: 'q', workflowId: 'wf', args: [sessionArgs] })).resolves.toBeUndefined();
    const down = fakeClient({ start: () => Promise.reject(new Error('unavailable')) });
    await expect(startWorkflowOnce(down.client, 'sessionWorkflow', { taskQueue: 'q', workflowId: 'wf', args: [sessionArgs] })).rejects.toThrow('unavailable');
  });

  it("names the workflow and passes its own arguments: the compiler refuses another workflow's, or a name no workflow has", async () => {
    const started: unknown[] = [];
    const { client } = fakeClient({ start: (...a: unknown[]) => Promise.resolve(started.push(a)) });
    // @ts-expect-error a session workflow takes SessionWorkflowArgs, not a batch's
    await startWorkflowOnce(client, 'sessionWorkflow', { taskQueue: 'q', workflowId: 'wf', args: [{ batchId: 'b' }] });
    // @ts-expect-error no workflow is registered under this name
    await startWorkflowOnce(client, 'sessionWorkflw', { taskQueue: 'q', workflowId: 'wf', args: [sessionArgs] });
    await startWorkflowOnce(client, 'sessionWorkflow', { taskQueue: 'q', workflowId: 'wf', args: [sessionArgs] });
    expect(started).toHaveLength(3);
    expect(started[2]).toEqual([
      'sessionWorkflow',
      expect.objectContaining({ workflowId: 'wf', args: [sessionArgs], workflowIdReusePolicy: expect.anything() }),
    ]);
  });

  it('asks a workflow to end and waits for it; false when Temporal knows no such workflow', async () => {
    const ended = fakeClient({ result: () => Promise.reject(new Error('cancelled')) });
    const asks: string[] = [];
    await expect(endWorkflowAndWait(ended.client, 'wf', async () => void asks.push('cancel'))).resolves.toBe(true);
    expect(asks).toEqual(['cancel']);
    expect(ended.asked).toEqual(['wf']);
    const unknown = fakeClient({});
    await expect(endWorkflowAndWait(unknown.client, 'wf', () => Promise.reject(new WorkflowNotFoundError('not found', 'wf', undefined)))).resolves.toBe(false);
    await expect(endWorkflowAndWait(unknown.client, 'wf', () => Promise.reject(new Error('boom')))).rejects.toThrow('boom');
  });
});
