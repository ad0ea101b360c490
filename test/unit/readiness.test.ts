import { judgeWorkers } from '../../services/ops/readiness';
import { workerReadiness } from '../../worker/readiness';

const NOW = 1_000_000;
const MAX = 15_000;

describe('judgeWorkers', () => {
  it('counts a worker whose poll is recent, without heartbeats', () => {
    const r = judgeWorkers({ pollers: [{ identity: 'w1', lastAccessMs: NOW - 4_000 }], heartbeats: null, nowMs: NOW, maxAgeMs: MAX });
    expect(r).toEqual({ alive: ['w1'], lastSeenMsAgo: 4_000, stopping: [] });
  });

  it('takes a worker unseen for longer than the limit for gone (Temporal keeps dead pollers listed)', () => {
    const r = judgeWorkers({
      pollers: [{ identity: 'w1', lastAccessMs: NOW - 40_000 }],
      heartbeats: [{ identity: 'w1', running: true, atMs: NOW - 20_000 }],
      nowMs: NOW,
      maxAgeMs: MAX,
    });
    expect(r.alive).toEqual([]);
    expect(r.lastSeenMsAgo).toBe(20_000);
  });

  it('counts an idle worker by its heartbeat while its long poll is old', () => {
    const r = judgeWorkers({
      pollers: [{ identity: 'w1', lastAccessMs: NOW - 50_000 }],
      heartbeats: [{ identity: 'w1', running: true, atMs: NOW - 3_000 }],
      nowMs: NOW,
      maxAgeMs: MAX,
    });
    expect(r.alive).toEqual(['w1']);
  });

  it('does not count a worker whose newest heartbeat says it is shutting down, even with a recent poll', () => {
    const r = judgeWorkers({
      pollers: [
        { identity: 'w1', lastAccessMs: NOW - 1_000 },
        { identity: 'w2', lastAccessMs: NOW - 60_000 },
      ],
      heartbeats: [
        { identity: 'w1', running: true, atMs: NOW - 6_000 },
        { identity: 'w1', running: false, atMs: NOW - 500 },
      ],
      nowMs: NOW,
      maxAgeMs: MAX,
    });
    expect(r.alive).toEqual([]);
    expect(r.stopping).toEqual(['w1']);
    expect(r.lastSeenMsAgo).toBe(60_000);
  });

  it('counts a worker that restarted under the same identity once it heartbeats as running', () => {
    const r = judgeWorkers({
      pollers: [{ identity: 'w1', lastAccessMs: NOW - 1_000 }],
      heartbeats: [
        { identity: 'w1', running: false, atMs: NOW - 30_000 },
        { identity: 'w1', running: true, atMs: NOW - 2_000 },
      ],
      nowMs: NOW,
      maxAgeMs: MAX,
    });
    expect(r.alive).toEqual(['w1']);
  });

  it('reports nothing seen when the queue has no pollers', () => {
    expect(judgeWorkers({ pollers: [], heartbeats: [], nowMs: NOW, maxAgeMs: MAX })).toEqual({ alive: [], lastSeenMsAgo: null, stopping: [] });
  });
});

describe('workerReadiness', () => {
  const worker = (state: string) => ({ getState: () => state as never });
  const hostUp = { health: async () => ({ ok: true, hostId: 'h', provider: 'process', sandboxes: 0, maxSandboxes: 16, reservedMB: 0, memoryMB: 1024 }) };
  const hostDown = {
    health: async () => {
      throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:7300'), { code: 'ECONNREFUSED' });
    },
  };

  it('is ready when every Temporal worker runs and the host answers', async () => {
    const r = await workerReadiness({
      workers: () => [
        { name: 'q', worker: worker('RUNNING') },
        { name: 'q@h', worker: worker('RUNNING') },
      ],
      host: hostUp,
    })();
    expect(r).toEqual({ ok: true, message: 'ok', workers: { q: 'RUNNING', 'q@h': 'RUNNING' }, host: 'ok' });
  });

  it('names a Temporal worker that is not running', async () => {
    const r = await workerReadiness({
      workers: () => [
        { name: 'q', worker: worker('RUNNING') },
        { name: 'q@h', worker: worker('DRAINING') },
      ],
      host: hostUp,
    })();
    expect(r.ok).toBe(false);
    expect(r.message).toMatch(/Temporal worker q@h is DRAINING/);
  });

  it('names the sandbox host when it does not answer', async () => {
    const r = await workerReadiness({ workers: () => [{ name: 'q', worker: worker('RUNNING') }], host: hostDown })();
    expect(r.ok).toBe(false);
    expect(r.message).toMatch(/sandbox host does not answer.*ECONNREFUSED/);
  });

  it('is not ready before the Temporal workers exist', async () => {
    const r = await workerReadiness({ workers: () => [], host: hostUp })();
    expect(r.ok).toBe(false);
    expect(r.message).toMatch(/not created yet/);
  });
});
