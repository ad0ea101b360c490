import { control, eventually, T } from '../../helpers/env';

/**
 * /readyz tells the truth: the API's says 503 while no worker polls the shared task queue or the
 * sandbox host is gone, and the worker's own (on its metrics port) while its host is gone. Every
 * test brings back what it stopped, so later test files see a whole stack.
 */

interface Probe {
  status: number;
  body: any;
}

const apiReadyz = (): Promise<Probe> => probe(`${T.api()}/readyz`);
const workerUrl = (p: string): string => {
  const metrics = process.env.SAP_TEST_WORKER_METRICS_URL;
  if (!metrics) throw new Error('SAP_TEST_WORKER_METRICS_URL is not set: run the tests with npm test');
  return metrics.replace(/\/metrics$/, p);
};
const workerReadyz = (): Promise<Probe> => probe(workerUrl('/readyz'));

async function probe(url: string): Promise<Probe> {
  const res = await fetch(url);
  return { status: res.status, body: await res.json() };
}

/** Detection can take READY_WORKER_MAX_AGE_MS (12 s) plus the cache: the deadline leaves room for a busy machine. */
const DEADLINE_MS = 120_000;

/** Waits until `get` answers `status`, and returns that answer. */
const until = (get: () => Promise<Probe>, status: number): Promise<Probe> =>
  eventually(
    async () => {
      const r = await get();
      return r.status === status ? r : null;
    },
    DEADLINE_MS,
    500,
  );

const timings: Record<string, number> = {};

/** Stops `proc`, runs `body`, and always starts `proc` again (then waits until both probes are 200). */
async function whileStopped(proc: 'worker' | 'host', signal: string, body: (stoppedAt: number) => Promise<void>): Promise<void> {
  await control('kill', proc, signal);
  const stoppedAt = Date.now();
  try {
    await body(stoppedAt);
  } finally {
    await control('start', proc);
    await until(apiReadyz, 200);
    await until(workerReadyz, 200);
  }
}

beforeAll(async () => {
  // A previous file may have restarted something: start from a ready stack.
  await until(apiReadyz, 200);
  await until(workerReadyz, 200);
}, DEADLINE_MS + 10_000);

afterAll(() => {
  if (process.env.SAP_READINESS_TIMINGS) process.stdout.write(`readiness detection (ms): ${JSON.stringify(timings)}\n`);
});

describe('API /readyz', () => {
  it('is 200 with every check named when the stack is whole; /healthz is liveness only', async () => {
    const r = await apiReadyz();
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ status: 'ok', mongo: 'ok', temporal: 'ok', worker: 'ok', host: 'ok' });
    expect(r.body.checks.worker.details.alive.length).toBeGreaterThan(0);
    expect(Object.values(r.body.checks.host.details.hosts)).toContain('ok');
    const h = await probe(`${T.api()}/healthz`);
    expect(h).toEqual({ status: 200, body: { status: 'ok' } });
  });

  it(
    'is 503 naming the worker after the worker is killed (SIGKILL), and 200 once it is back',
    async () => {
      await whileStopped('worker', 'SIGKILL', async (stoppedAt) => {
        const r = await until(apiReadyz, 503);
        timings.workerSigkill = Date.now() - stoppedAt;
        expect(r.body).toEqual({ error: { type: 'unavailable', message: expect.stringMatching(/worker: no worker is polling task queue \S+/) } });
        expect(r.body.error.message).not.toMatch(/host:|mongo:|temporal:/);
        // /healthz does not care.
        expect((await probe(`${T.api()}/healthz`)).status).toBe(200);
      });
      const back = await apiReadyz();
      expect(back.status).toBe(200);
      expect(back.body.worker).toBe('ok');
    },
    3 * DEADLINE_MS,
  );

  it(
    'is 503 naming the worker after the worker is stopped (SIGTERM), and 200 once it is back',
    async () => {
      await whileStopped('worker', 'SIGTERM', async (stoppedAt) => {
        const r = await until(apiReadyz, 503);
        timings.workerSigterm = Date.now() - stoppedAt;
        expect(r.body).toEqual({ error: { type: 'unavailable', message: expect.stringMatching(/worker: no worker is polling task queue/) } });
      });
      expect((await apiReadyz()).status).toBe(200);
    },
    3 * DEADLINE_MS,
  );

  it(
    'is 503 naming the sandbox host while the host is stopped; so is the worker’s own /readyz',
    async () => {
      await whileStopped('host', 'SIGTERM', async (stoppedAt) => {
        const r = await until(apiReadyz, 503);
        timings.hostApi = Date.now() - stoppedAt;
        expect(r.body).toEqual({ error: { type: 'unavailable', message: expect.stringMatching(/host: sandbox host does not answer: \S+ \(/) } });
        expect(r.body.error.message).not.toMatch(/worker:/);
        const w = await until(workerReadyz, 503);
        timings.hostWorker = Date.now() - stoppedAt;
        expect(w.body).toEqual({ error: { type: 'unavailable', message: expect.stringMatching(/sandbox host does not answer/) } });
        expect(w.body.error.message).not.toMatch(/Temporal worker/);
        expect((await probe(workerUrl('/healthz'))).status).toBe(200);
      });
      expect((await apiReadyz()).status).toBe(200);
      expect((await workerReadyz()).status).toBe(200);
    },
    3 * DEADLINE_MS,
  );
});

describe('worker /readyz (metrics port)', () => {
  it('is 200 with both Temporal workers running and the host answering', async () => {
    const r = await workerReadyz();
    expect(r.status).toBe(200);
    expect(r.body.status).toBe('ok');
    expect(r.body.host).toBe('ok');
    const states = Object.values(r.body.workers);
    expect(states).toEqual(['RUNNING', 'RUNNING']);
    expect(await probe(workerUrl('/healthz'))).toEqual({ status: 200, body: { status: 'ok' } });
  });
});
