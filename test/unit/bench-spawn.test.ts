/**
 * The spawn bench's bookkeeping, against a fake API (`call`): which requests each part sends, what
 * it counts, and that it deletes every sandbox it made. The figures themselves come from runs against
 * a real stack (`npm run bench -- spawn`).
 */
import { benchSpawn, parseSpawnParts, type BenchCall } from '../../scripts/bench-spawn';

/** A fake API: records each request; exec/run of `node -v` answers v20 except in sandboxes listed in `failIn`. */
function fakeApi(failIn: Set<number> = new Set()) {
  const log: string[] = [];
  const live = new Set<string>();
  let next = 0;
  const call: BenchCall = async (method, path) => {
    log.push(`${method} ${path}`);
    await new Promise((res) => setImmediate(res));
    if (method === 'POST' && path === '/api/sandboxes') {
      const id = `sb-${next++}`;
      live.add(id);
      return { status: 201, body: { sandboxID: id } };
    }
    const exec = /^\/api\/sandboxes\/sb-(\d+)\/exec\/run$/.exec(path);
    if (method === 'POST' && exec) {
      if (failIn.has(Number(exec[1]))) return { status: 500, body: { error: { type: 'internal', message: 'boom' } } };
      return { status: 200, body: { exitCode: 0, stdout: 'v20.20.2\n', stderr: '' } };
    }
    if (method === 'DELETE') {
      live.delete(path.split('/').pop()!);
      return { status: 200, body: {} };
    }
    return { status: 404, body: {} };
  };
  return { call, log, live };
}

describe('parseSpawnParts', () => {
  it('defaults to every part and accepts exec-burst', () => {
    expect([...parseSpawnParts(undefined)]).toEqual(['create', 'node', 'burst', 'exec-burst', 'checkpoint', 'cpu']);
    expect([...parseSpawnParts('burst, exec-burst')]).toEqual(['burst', 'exec-burst']);
  });

  it('refuses an unknown part, naming it', () => {
    expect(() => parseSpawnParts('burst,exec_burst')).toThrow(/unknown part "exec_burst"/);
  });
});

describe('benchSpawn exec-burst', () => {
  it('creates every sandbox before the timed execs, runs one node -v in each and deletes them all', async () => {
    const api = fakeApi();
    const out = await benchSpawn({ n: 1, burst: 25, parts: new Set(['exec-burst']), call: api.call });
    const firstExec = api.log.findIndex((l) => l.endsWith('/exec/run'));
    const creates = api.log.filter((l) => l === 'POST /api/sandboxes');
    expect(creates).toHaveLength(25);
    expect(api.log.lastIndexOf('POST /api/sandboxes')).toBeLessThan(firstExec);
    expect(api.log.filter((l) => l.endsWith('/exec/run'))).toHaveLength(25);
    expect(api.live.size).toBe(0);
    const r = out.exec_burst as { n: number; failures: number; per_exec_ms: { p50: number | null } };
    expect(r.n).toBe(25);
    expect(r.failures).toBe(0);
    expect(typeof r.per_exec_ms.p50).toBe('number');
  });

  it('counts a failed exec with its error instead of throwing, and still deletes every sandbox', async () => {
    const api = fakeApi(new Set([3]));
    const out = await benchSpawn({ n: 1, burst: 10, parts: new Set(['exec-burst']), call: api.call });
    const r = out.exec_burst as { failures: number; first_error?: string };
    expect(r.failures).toBe(1);
    expect(r.first_error).toMatch(/sb-3: 500/);
    expect(api.live.size).toBe(0);
  });
});
