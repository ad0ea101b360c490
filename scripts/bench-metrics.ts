import type { BenchCall } from './bench-spawn';

/** The median and 95th percentile of some durations (ms), rounded to 0.1 ms. */
function stats(ms: number[]): { p50: number; p95: number } {
  const s = [...ms].sort((a, b) => a - b);
  const at = (p: number) => Math.round((s[Math.min(s.length - 1, Math.floor(p * s.length))] ?? 0) * 10) / 10;
  return { p50: at(0.5), p95: at(0.95) };
}

/**
 * `npm run bench -- metrics [--n 200]`: latency of GET /api/sandboxes/{id}/metrics (one sandbox, in
 * sequence; the first call, which samples the CPU for 100 ms, is reported apart) and of
 * POST /api/sandboxes/{id}/scale (memory alternating between 256 and 512 MB, CPU between 1 and 0.5).
 * Deletes its sandbox.
 */
export async function benchMetrics(opts: { n: number; call: BenchCall }): Promise<Record<string, unknown>> {
  const r = await opts.call('POST', '/api/sandboxes', { memoryMB: 512, cpuCount: 1 });
  if (r.status !== 201) throw new Error(`create: ${r.status} ${JSON.stringify(r.body)}`);
  const id = r.body.sandboxID as string;
  try {
    const timed = async (method: string, path: string, body?: unknown): Promise<number> => {
      const t0 = process.hrtime.bigint();
      const res = await opts.call(method, path, body);
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      if (res.status !== 200) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(res.body)}`);
      return ms;
    };
    const first = await timed('GET', `/api/sandboxes/${id}/metrics`);
    const metrics: number[] = [];
    for (let i = 0; i < opts.n; i++) metrics.push(await timed('GET', `/api/sandboxes/${id}/metrics`));
    const scale: number[] = [];
    for (let i = 0; i < Math.max(4, Math.floor(opts.n / 4)); i++) {
      scale.push(await timed('POST', `/api/sandboxes/${id}/scale`, i % 2 ? { memoryMB: 512, cpuCount: 1 } : { memoryMB: 256, cpuCount: 0.5 }));
    }
    return {
      bench: 'metrics',
      n: opts.n,
      metrics_first_ms: Math.round(first * 10) / 10,
      metrics_ms: stats(metrics),
      scale_n: scale.length,
      scale_ms: stats(scale),
    };
  } finally {
    await opts.call('DELETE', `/api/sandboxes/${id}`).catch(() => undefined);
  }
}
