import os from 'node:os';

/**
 * `npm run bench -- spawn [--n N]`: latency of POST /api/sandboxes (a sandbox from the base image),
 * and of POST /api/sandboxes/from-checkpoint/{id} from an empty, a 1 MB and a 100 MB checkpoint
 * (made by snapshot builds that write random bytes). Each sandbox is deleted after it is measured,
 * so only one exists at a time. Sequential: this is latency, not throughput.
 */
export async function benchSpawn(opts: { url: string; key: string; n: number }): Promise<Record<string, unknown>> {
  const call = async (method: string, path: string, body?: unknown): Promise<{ status: number; body: any }> => {
    const res = await fetch(`${opts.url}${path}`, {
      method,
      headers: { 'x-api-key': opts.key, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: res.status, body: await res.json() };
  };
  const stats = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    const at = (p: number) => Math.round(s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]! * 10) / 10;
    return { p50: at(50), p95: at(95) };
  };

  /** A checkpoint holding `mb` MB of random bytes (0: nothing), made by a snapshot build. */
  const checkpointOf = async (mb: number): Promise<{ checkpointId: string; snapshot: string }> => {
    const name = `bench-spawn-${mb}mb-${Date.now().toString(36)}`;
    const steps = mb > 0 ? [{ type: 'run', args: { commands: [`mkdir -p /data && head -c ${mb}M /dev/urandom > /data/blob`] } }] : [];
    const r = await call('POST', '/api/snapshots', { name, image: { steps } });
    if (r.status !== 202) throw new Error(`snapshot: ${r.status} ${JSON.stringify(r.body)}`);
    for (;;) {
      await new Promise((res) => setTimeout(res, 250));
      const g = await call('GET', `/api/snapshots/${name}`);
      if (g.body.status === 'ready') return { checkpointId: g.body.checkpointId, snapshot: name };
      if (g.body.status === 'failed') throw new Error(`snapshot ${name}: ${g.body.error}`);
    }
  };

  /** Times `n` creates made by `make`, deleting each sandbox after it is measured. */
  const measure = async (make: () => Promise<{ status: number; body: any }>): Promise<number[]> => {
    const out: number[] = [];
    for (let i = 0; i < opts.n + 2; i++) {
      const t0 = performance.now();
      const r = await make();
      const ms = performance.now() - t0;
      if (r.status !== 201) throw new Error(`create: ${r.status} ${JSON.stringify(r.body)}`);
      if (i >= 2) out.push(ms); // the first two warm up connections and caches
      await call('DELETE', `/api/sandboxes/${r.body.sandboxID}`);
    }
    return out;
  };

  const create = await measure(() => call('POST', '/api/sandboxes', {}));
  const result: Record<string, unknown> = { bench: 'spawn', n: opts.n, cores: os.cpus().length, create_ms: stats(create) };
  for (const [label, mb] of [['empty', 0], ['1mb', 1], ['100mb', 100]] as const) {
    const { checkpointId, snapshot } = await checkpointOf(mb);
    result[`spawn_${label}_ms`] = stats(await measure(() => call('POST', `/api/sandboxes/from-checkpoint/${checkpointId}`, {})));
    await call('DELETE', `/api/snapshots/${snapshot}`);
  }
  return result;
}
