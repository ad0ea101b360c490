/**
 * Provisioning heartbeats only when it runs as a regular activity (placed on another host's queue,
 * where the workflow reads the heartbeat to tell a started attempt from one never taken). As a local
 * activity, the usual path, it cannot heartbeat: Temporal's core refused each call with a warning in
 * the worker's log, one per session. Against fakes of the store and the host.
 */
import { MockActivityEnvironment } from '@temporalio/testing';
import { createSessionActivities, type Provisioned } from '../../activities/sessions';
import type { ActivityDeps } from '../../activities/deps';
import { createSessionRunService } from '../../services/sessions/session-runs';
import type { LocalRunDeps } from '../../services/hosts/local-host';
import { loadLimits } from '../../config/limits';
import type { AgentRunSpec } from '../../contract/workflows';

function fakeDeps(): { deps: ActivityDeps; inserted: string[] } {
  const inserted: string[] = [];
  const collection = {
    findOne: async () => null,
    insertOne: async (doc: { _id: string }) => {
      inserted.push(doc._id);
      return { insertedId: doc._id };
    },
  };
  const host = {
    // A quick entrypoint: over when the host answers the create, its result file read along.
    createSandbox: async () => ({
      entrypoint: { state: 'exited', exitCode: 0, timedOut: false, signal: null, startedAt: new Date().toISOString() },
      file: { content: Buffer.from('{"ok":true}').toString('base64') },
      log: { chunks: [], truncated: { stdout: false, stderr: false }, bytes: { stdout: 0, stderr: 0 } },
    }),
    destroySandbox: async () => true,
  };
  const runDeps = {
    store: { db: { collection: () => collection }, sessions: collection },
    host,
    hostTaskQueue: 'q@h1',
    resultMaxBytes: 1024,
    logMaxBytes: 1024,
    limits: loadLimits({}),
    secrets: {},
  } as unknown as LocalRunDeps;
  const deps = { services: { sessionRuns: createSessionRunService(runDeps) }, host } as unknown as ActivityDeps;
  return { deps, inserted };
}

const run = { entrypoint: ['true'], timeoutSeconds: 60 } as unknown as AgentRunSpec;

async function provisionIn(isLocal: boolean): Promise<{ beats: unknown[]; status: string | undefined; inserted: string[] }> {
  const { deps, inserted } = fakeDeps();
  const env = new MockActivityEnvironment({ isLocal });
  const beats: unknown[] = [];
  env.on('heartbeat', (d: unknown) => beats.push(d));
  const out: Provisioned = await env.run(createSessionActivities(deps).provisionSandboxAndRunEntrypoint, {
    sessionId: 'sess_1',
    orgId: 'org1',
    agentId: 'a1',
    run,
    input: '{}',
    placed: true,
  });
  return { beats, status: out.end?.status, inserted };
}

describe('provisionSandboxAndRunEntrypoint', () => {
  it('does not heartbeat as a local activity', async () => {
    const { beats, status, inserted } = await provisionIn(true);
    expect(status).toBe('completed');
    expect(inserted).toEqual(['sess_1']);
    expect(beats).toEqual([]);
  });

  it('heartbeats "provisioning" as a regular activity', async () => {
    const { beats, status } = await provisionIn(false);
    expect(status).toBe('completed');
    expect(beats).toEqual(['provisioning']);
  });
});
