/**
 * provisionSandbox records a sandbox and creates it on its host at the same time; the reaper leaves a
 * young sandbox without a record alone. Both against fakes of the store, the host and Temporal.
 */
import pino from 'pino';
import type { ApiDeps } from '../../api/deps';
import { CreateSandboxBody } from '../../contract/sandboxes';
import { provisionSandbox } from '../../services/sandboxes/sandboxes';
import { loadLimits } from '../../config/limits';
import { ApiError } from '../../contract/errors';
import { HostError } from '../../sandbox/host-contract/client';
import type { SandboxInfo } from '../../sandbox/host-contract/types';
import { startReaper } from '../../services/sandboxes/reaper';

const logger = pino({ level: 'silent' });

/** A deferred promise: settle it from the test. */
function deferred<T>(): { promise: Promise<T>; resolve(v: T): void; reject(e: unknown): void } {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

function fakes(opts: { insert: () => Promise<unknown>; create: () => Promise<unknown> }) {
  const collection = {
    insertOne: jest.fn((_doc: { _id: string }) => opts.insert()),
    deleteOne: jest.fn(async (_filter: unknown) => ({ deletedCount: 1 })),
  };
  const client = {
    createSandbox: jest.fn((_req: unknown) => opts.create()),
    destroySandbox: jest.fn(async (_id: string) => true),
  };
  const deps = {
    cfg: { limits: loadLimits({}) },
    store: { db: { collection: () => collection } },
    hosts: { pick: async () => ({ hostId: 'h1', client, taskQueue: 'q' }), get: async () => client },
    logger,
  } as unknown as ApiDeps;
  return { deps, collection, client };
}

const body = CreateSandboxBody.parse({});

describe('provisionSandbox', () => {
  it('asks the host while the record is being written, and answers once both are done', async () => {
    const insert = deferred<unknown>();
    const { deps, collection, client } = fakes({ insert: () => insert.promise, create: async () => ({}) });
    const done = provisionSandbox(deps, 'org1', body);
    await new Promise((r) => setImmediate(r));
    expect(collection.insertOne).toHaveBeenCalledTimes(1);
    expect(client.createSandbox).toHaveBeenCalledTimes(1);
    const doc = collection.insertOne.mock.calls[0]![0];
    expect(client.createSandbox.mock.calls[0]![0]).toMatchObject({ id: doc._id, orgId: 'org1', owner: { kind: 'api', id: doc._id } });
    insert.resolve({});
    await expect(done).resolves.toMatchObject({ _id: doc._id, orgId: 'org1', hostId: 'h1', status: 'running' });
    expect(client.destroySandbox).not.toHaveBeenCalled();
    expect(collection.deleteOne).not.toHaveBeenCalled();
  });

  it('destroys the host sandbox when the record could not be written', async () => {
    const { deps, collection, client } = fakes({ insert: async () => Promise.reject(new Error('store down')), create: async () => ({}) });
    await expect(provisionSandbox(deps, 'org1', body)).rejects.toThrow('store down');
    const doc = collection.insertOne.mock.calls[0]![0];
    expect(client.destroySandbox).toHaveBeenCalledWith(doc._id);
  });

  it('removes the record when the host fails, and maps the host error', async () => {
    const { deps, collection } = fakes({
      insert: async () => ({}),
      create: async () => Promise.reject(new HostError('patch_failed', 409, 'patch pa-1 failed')),
    });
    const err = await provisionSandbox(deps, 'org1', body).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect(err).toMatchObject({ type: 'conflict', message: 'patch pa-1 failed' });
    const doc = collection.insertOne.mock.calls[0]![0];
    expect(collection.deleteOne).toHaveBeenCalledWith({ _id: doc._id });
  });
});

describe('reaper', () => {
  it('leaves a young API sandbox without a record alone, and destroys an old one', async () => {
    const now = Date.now();
    const sandboxes: Partial<SandboxInfo>[] = [
      { id: 'sb-young', owner: { kind: 'api', id: 'sb-young' }, createdAt: new Date(now - 1_000).toISOString() },
      { id: 'sb-old', owner: { kind: 'api', id: 'sb-old' }, createdAt: new Date(now - 120_000).toISOString() },
    ];
    const host = { listSandboxes: jest.fn(async () => sandboxes), destroySandbox: jest.fn(async (_id: string) => true) };
    const store = { db: { collection: () => ({ findOne: async () => null }) } };
    const reaper = startReaper({ host, store, client: {}, logger, intervalMs: 3_600_000 } as never);
    reaper.stop();
    await reaper.sweep();
    expect(host.destroySandbox).toHaveBeenCalledWith('sb-old');
    expect(host.destroySandbox).not.toHaveBeenCalledWith('sb-young');
  });
});
