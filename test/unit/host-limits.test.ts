/**
 * The sandbox host's create fills in the default limits and refuses values over the maxima, before
 * its provider is asked for anything (a fake provider records what it is asked).
 */
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import pino from 'pino';
import { loadLimits } from '../../config/limits';
import { ExecManager } from '../../sandbox/host/exec';
import { createApp } from '../../sandbox/host/server';
import type { SandboxProvider } from '../../sandbox/driver';
import type { CreateSandboxRequest } from '../../sandbox/host-contract/types';

const TOKEN = 'unit-test-token-0123456789';
const logger = pino({ level: 'silent' });
const limits = loadLimits({ SANDBOX_MEMORY_MB: '1024', SANDBOX_MAX_MEMORY_MB: '4096', SANDBOX_MAX_CPU_COUNT: '2' }, { totalMemoryMB: 8000, cores: 4 });

let server: http.Server;
let url: string;
const created: CreateSandboxRequest[] = [];
/** How many sandboxes the fake provider says are live (HOST_MAX_SANDBOXES is 3 here). */
let live = 0;

beforeAll(async () => {
  const provider = {
    kind: 'fake',
    list: () => [],
    get: (id: string) => (id === 'sb-existing' ? { id } : undefined),
    load: () => ({ sandboxes: live, reservedMB: live * 1024 }),
    create: async (spec: CreateSandboxRequest) => {
      created.push(spec);
      return {
        info: {
          id: spec.id,
          orgId: spec.orgId,
          hostId: 'h',
          status: 'running',
          createdAt: new Date().toISOString(),
          metadata: {},
          patches: [],
          provider: 'fake',
        },
        created: true,
      };
    },
  } as unknown as SandboxProvider;
  const app = createApp({ provider, token: TOKEN, logger, hostId: 'h', exec: new ExecManager(provider, logger), limits, maxSandboxes: 3 });
  server = http.createServer(app);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await new Promise<void>((r) => server.close(() => r()));
});

const create = (body: Record<string, unknown>) =>
  fetch(`${url}/sandboxes`, { method: 'POST', headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });

describe('host create limits', () => {
  beforeEach(() => {
    created.length = 0;
    live = 0;
  });

  it('refuses a new sandbox at HOST_MAX_SANDBOXES with 503, but answers an existing one (create is idempotent)', async () => {
    live = 3;
    const full = await create({ id: 'sb-new', orgId: 'o' });
    expect(full.status).toBe(503);
    expect(await full.json()).toEqual({ error: { type: 'unavailable', message: expect.stringContaining('limit of 3 sandboxes (HOST_MAX_SANDBOXES)') } });
    expect(created).toEqual([]);
    expect((await create({ id: 'sb-existing', orgId: 'o' })).status).toBe(201);
    live = 2;
    expect((await create({ id: 'sb-new', orgId: 'o' })).status).toBe(201);
  });

  it('reports its load on /healthz', async () => {
    live = 2;
    expect(await (await fetch(`${url}/healthz`)).json()).toMatchObject({
      ok: true,
      hostId: 'h',
      sandboxes: 2,
      maxSandboxes: 3,
      reservedMB: 2048,
      memoryMB: expect.any(Number),
    });
  });

  it('fills absent limits with its defaults', async () => {
    expect((await create({ id: 'sb-a', orgId: 'o' })).status).toBe(201);
    expect(created[0]).toMatchObject({ id: 'sb-a', memoryMB: 1024, diskMB: 20480, cpuCount: 0, maxProcesses: 512 });
  });

  it("keeps the caller's limits", async () => {
    expect((await create({ id: 'sb-b', orgId: 'o', memoryMB: 64, diskMB: 32, cpuCount: 0.5, maxProcesses: 40 })).status).toBe(201);
    expect(created[0]).toMatchObject({ memoryMB: 64, diskMB: 32, cpuCount: 0.5, maxProcesses: 40 });
  });

  it.each([
    [{ memoryMB: 4097 }, 'body.memoryMB: 4097 is above the maximum of 4096 MB (SANDBOX_MAX_MEMORY_MB)'],
    [{ diskMB: 20481 }, 'body.diskMB: 20481 is above the maximum of 20480 MB (SANDBOX_MAX_DISK_MB)'],
    [{ cpuCount: 3 }, 'body.cpuCount: 3 is above the maximum of 2 (SANDBOX_MAX_CPU_COUNT)'],
  ])('refuses %j with 400 naming the field and the maximum, creating nothing', async (over, message) => {
    const r = await create({ id: 'sb-c', orgId: 'o', ...over });
    expect(r.status).toBe(400);
    expect(await r.json()).toEqual({ error: { type: 'invalid_request', message } });
    expect(created).toHaveLength(0);
  });

  it('refuses malformed limits', async () => {
    for (const bad of [{ diskMB: 0 }, { diskMB: 1.5 }, { memoryMB: -1 }, { cpuCount: -1 }, { diskMB: 'big' }]) {
      const r = await create({ id: 'sb-d', orgId: 'o', ...bad });
      expect(r.status).toBe(400);
    }
    expect(created).toHaveLength(0);
  });
});
