import os from 'node:os';
import { trace, traceNow } from '../lib/trace';
import { findStackRoot, poolMemory, stackCpuMs } from './bench-cpu';

/** One JSON request to the API: bench.ts's node:http client (kept-alive connections). */
export type BenchCall = (method: string, path: string, body?: unknown) => Promise<{ status: number; body: any }>;

/** The parts of `npm run bench -- spawn`, for `--only`. */
export const SPAWN_PARTS = ['create', 'node', 'burst', 'exec-burst', 'checkpoint', 'cpu'] as const;
export type SpawnPart = (typeof SPAWN_PARTS)[number];

/** Parses `--only a,b` (default: every part); throws on an unknown part. */
export function parseSpawnParts(only: string | undefined): Set<SpawnPart> {
  if (only === undefined || only.trim() === '') return new Set(SPAWN_PARTS);
  const parts = only
    .split(',')
    .map((p) => p.trim())
    .filter(Boolean);
  for (const p of parts) {
    if (!(SPAWN_PARTS as readonly string[]).includes(p)) throw new Error(`--only: unknown part "${p}" (parts: ${SPAWN_PARTS.join(', ')})`);
  }
  return new Set(parts as SpawnPart[]);
}

const NODE_V = { cmd: 'node', args: ['-v'] };

/**
 * `npm run bench -- spawn [--n N] [--burst B] [--only create,node,burst,checkpoint]`, against a
 * running stack. Every request goes through the one client `call` (bench.ts's node:http client),
 * so all figures of a run are measured the same way. Parts:
 *  - `create` (create_ms): POST /api/sandboxes (a sandbox from the base image), n times in
 *    sequence, each sandbox deleted (untimed) before the next.
 *  - `node` (create_node_ms): POST /api/sandboxes, then POST /api/sandboxes/{id}/exec/run of
 *    `node -v`, timed until the answer with its output arrives; stdout must start with `v`.
 *    n times in sequence, each sandbox deleted (untimed). exec_node_ms is the exec/run part alone.
 *  - `burst`: B (default 100) of those create → `node -v` at once. wall_ms from the first request
 *    to the last answer; per_sandbox_ms (create → output) and create_ms over the sandboxes that
 *    succeeded; failures counted (with the first error), not thrown. Then all are deleted (untimed).
 *    `cpu`: the stack's CPU over the burst (as for `cpu`, no idle subtracted), per sandbox and by process,
 *    when the stack runs on this machine: set against wall_ms × cores, it tells whether the burst waited on CPU.
 *  - `exec-burst`: the exec half of a burst alone, as if creating cost nothing: B sandboxes are
 *    created first (10 at a time, untimed), then B `node -v` run at once, one in each. wall_ms and
 *    per_exec_ms as above. What a burst would take if sandboxes were ready ahead (a pool).
 *  - `checkpoint` (spawn_{empty,1mb,100mb}_ms): POST /api/sandboxes/from-checkpoint/{id} from an
 *    empty, a 1 MB and a 100 MB checkpoint (made by snapshot builds that write random bytes).
 *  - `cpu` (cpu_per_lifecycle_ms): the CPU of the whole stack (every process below `npm start`'s
 *    root, sandboxes included; see bench-cpu.ts) over n lifecycles in sequence (create → `node -v`
 *    → delete, after two warm-ups), divided by n; `idle_ms_per_s` is the stack's CPU with nothing to
 *    do, measured for 3 s before (heartbeats, Temporal's timers), and `net` subtracts it. Then, after
 *    3 s for the pool to refill, `pool`: the idle spares and their memory (see poolMemory). Needs
 *    /proc of the stack (same machine; --stack-pid, or the one scripts/stack.js on the API's port).
 * The sequential parts are latency, not throughput: one sandbox exists at a time, and the first
 * two rounds of each are warm-up (connections and caches), not counted.
 */
/** The stack's CPU between two readings: total ms, ms per sandbox and ms by process (those ≥ 5 ms). */
function cpuSince(before: ReturnType<typeof stackCpuMs>, after: ReturnType<typeof stackCpuMs>, n: number) {
  const byProcess = Object.fromEntries(
    Object.entries(after.byName)
      .map(([name, ms]) => [name, Math.round(ms - (before.byName[name] ?? 0))] as const)
      .filter(([, ms]) => ms >= 5)
      .sort((x, y) => y[1] - x[1]),
  );
  const total = after.total - before.total;
  return { total_ms: Math.round(total), per_sandbox_ms: n ? Math.round((total / n) * 10) / 10 : null, by_process: byProcess };
}

export async function benchSpawn(opts: {
  n: number;
  burst: number;
  parts: Set<SpawnPart>;
  call: BenchCall;
  apiUrl?: string;
  stackPid?: number;
}): Promise<Record<string, unknown>> {
  const { call } = opts;
  if (!Number.isInteger(opts.n) || opts.n < 1) throw new Error(`--n: must be a positive integer (got ${opts.n})`);
  if (!Number.isInteger(opts.burst) || opts.burst < 0) throw new Error(`--burst: must be an integer >= 0 (got ${opts.burst})`);
  const stats = (xs: number[]) => {
    if (xs.length === 0) return { p50: null, p95: null };
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

  const create = async (path = '/api/sandboxes'): Promise<string> => {
    const r = await call('POST', path, {});
    if (r.status !== 201) throw new Error(`create: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body.sandboxID as string;
  };
  /** `node -v` in sandbox `id`; throws unless it answers 200 with exit 0 and a stdout starting with `v`. */
  const nodeV = async (id: string): Promise<void> => {
    const r = await call('POST', `/api/sandboxes/${id}/exec/run`, NODE_V);
    if (r.status !== 200) throw new Error(`exec/run node -v in ${id}: ${r.status} ${JSON.stringify(r.body)}`);
    const out = r.body as { exitCode: number; stdout: string; stderr: string };
    if (out.exitCode !== 0 || typeof out.stdout !== 'string' || !out.stdout.startsWith('v')) {
      throw new Error(`node -v in ${id}: exit ${out.exitCode}, stdout ${JSON.stringify(out.stdout)}, stderr ${JSON.stringify(out.stderr)}`);
    }
  };
  const destroy = async (id: string): Promise<void> => {
    const r = await call('DELETE', `/api/sandboxes/${id}`);
    if (r.status !== 200) throw new Error(`delete ${id}: ${r.status} ${JSON.stringify(r.body)}`);
  };

  /** Times `n` creates made by `make` (plus two warm-ups), deleting each sandbox after it is measured. */
  const measure = async (make: () => Promise<string>): Promise<number[]> => {
    const out: number[] = [];
    for (let i = 0; i < opts.n + 2; i++) {
      const t0 = performance.now();
      const id = await make();
      const ms = performance.now() - t0;
      if (i >= 2) out.push(ms);
      await destroy(id);
    }
    return out;
  };

  const result: Record<string, unknown> = { bench: 'spawn', n: opts.n, cores: os.cpus().length, loadavg: os.loadavg().map((l) => Math.round(l * 100) / 100) };

  if (opts.parts.has('create')) result.create_ms = stats(await measure(() => create()));

  if (opts.parts.has('node')) {
    const total: number[] = [];
    const exec: number[] = [];
    for (let i = 0; i < opts.n + 2; i++) {
      const t0 = performance.now();
      const id = await create();
      const t1 = performance.now();
      await nodeV(id);
      const t2 = performance.now();
      if (i >= 2) {
        total.push(t2 - t0);
        exec.push(t2 - t1);
      }
      await destroy(id);
    }
    result.create_node_ms = stats(total);
    result.exec_node_ms = stats(exec);
  }

  /**
   * Runs `one(i)` for i < n, all at once; each answers its latency in ms (and may record more).
   * Failures are counted with the first error, not thrown.
   */
  const atOnce = async (n: number, one: (i: number) => Promise<number>) => {
    const latencies: number[] = [];
    let failures = 0;
    let firstError: string | undefined;
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: n }, async (_x, i) => {
        try {
          latencies.push(await one(i));
        } catch (err) {
          failures++;
          firstError ??= err instanceof Error ? err.message : String(err);
        }
      }),
    );
    const wall = performance.now() - t0;
    return { wall_ms: Math.round(wall * 10) / 10, latencies, failures, ...(firstError ? { first_error: firstError.slice(0, 500) } : {}) };
  };
  /** Untimed clean-up, a few at a time; answers how many deletes failed. */
  const destroyAll = async (ids: string[]): Promise<number> => {
    let failed = 0;
    for (let i = 0; i < ids.length; i += 10) {
      await Promise.all(ids.slice(i, i + 10).map((id) => destroy(id).catch(() => void failed++)));
    }
    return failed;
  };
  /** One at-once part's figures: `latencies` holds its per-request statistics (per_sandbox_ms …). */
  const burstSummary = (run: Omit<Awaited<ReturnType<typeof atOnce>>, 'latencies'>, latencies: Record<string, unknown>, deleteFailures: number) => ({
    n: opts.burst,
    wall_ms: run.wall_ms,
    ...latencies,
    failures: run.failures,
    ...(run.first_error ? { first_error: run.first_error } : {}),
    ...(deleteFailures ? { delete_failures: deleteFailures } : {}),
  });

  if (opts.parts.has('burst') && opts.burst > 0) {
    // The stack's CPU over the burst, when its processes are on this machine: is the burst bound by it?
    let burstRoot: number | null = null;
    try {
      burstRoot = findStackRoot(opts.apiUrl ?? 'http://127.0.0.1:8080', opts.stackPid);
    } catch {
      /* another machine's stack: no CPU figure */
    }
    const ids: string[] = [];
    const creates: number[] = [];
    const cpu0 = burstRoot === null ? null : stackCpuMs(burstRoot);
    const { latencies, ...run } = await atOnce(opts.burst, async () => {
      const at0 = traceNow();
      const s0 = performance.now();
      const id = await create();
      trace(id, 'client:send', at0);
      trace(id, 'client:created');
      ids.push(id);
      creates.push(performance.now() - s0);
      await nodeV(id);
      trace(id, 'client:ran');
      return performance.now() - s0;
    });
    const cpu = cpu0 && burstRoot !== null ? cpuSince(cpu0, stackCpuMs(burstRoot), ids.length) : undefined;
    result.burst = burstSummary(run, { per_sandbox_ms: stats(latencies), create_ms: stats(creates), ...(cpu ? { cpu } : {}) }, await destroyAll(ids));
  }

  if (opts.parts.has('exec-burst') && opts.burst > 0) {
    const ids: string[] = [];
    for (let i = 0; i < opts.burst; i += 10) {
      ids.push(...(await Promise.all(Array.from({ length: Math.min(10, opts.burst - i) }, () => create()))));
    }
    await new Promise((res) => setTimeout(res, 1000)); // the creates' own work settles first
    const { latencies, ...run } = await atOnce(ids.length, async (i) => {
      const s0 = performance.now();
      await nodeV(ids[i]!);
      return performance.now() - s0;
    });
    result.exec_burst = burstSummary(run, { per_exec_ms: stats(latencies) }, await destroyAll(ids));
  }

  if (opts.parts.has('cpu')) {
    const root = findStackRoot(opts.apiUrl ?? 'http://127.0.0.1:8080', opts.stackPid);
    const lifecycle = async () => {
      const id = await create();
      await nodeV(id);
      await destroy(id);
    };
    for (let i = 0; i < 2; i++) await lifecycle();
    await new Promise((res) => setTimeout(res, 2000)); // the pool refills, the warm-ups' work settles
    const idle0 = stackCpuMs(root);
    const i0 = performance.now();
    await new Promise((res) => setTimeout(res, 3000));
    const idlePerMs = (stackCpuMs(root).total - idle0.total) / (performance.now() - i0);
    const before = stackCpuMs(root);
    const t0 = performance.now();
    for (let i = 0; i < opts.n; i++) await lifecycle();
    await new Promise((res) => setTimeout(res, 1000)); // the last refill and deletes' work end inside the window
    const after = stackCpuMs(root);
    const elapsed = performance.now() - t0;
    const raw = (after.total - before.total) / opts.n;
    const byName = Object.entries(after.byName)
      .map(([name, ms]) => [name, Math.round(((ms - (before.byName[name] ?? 0)) / opts.n) * 10) / 10] as const)
      .filter(([, ms]) => ms >= 0.5)
      .sort((a, b) => b[1] - a[1]);
    await new Promise((res) => setTimeout(res, 2000));
    result.cpu_per_lifecycle_ms = {
      n: opts.n,
      raw: Math.round(raw * 10) / 10,
      idle_ms_per_s: Math.round(idlePerMs * 1000 * 10) / 10,
      net: Math.round((raw - (idlePerMs * elapsed) / opts.n) * 10) / 10,
      by_process: Object.fromEntries(byName),
    };
    result.pool = poolMemory(root);
  }

  if (opts.parts.has('checkpoint')) {
    for (const [label, mb] of [
      ['empty', 0],
      ['1mb', 1],
      ['100mb', 100],
    ] as const) {
      const { checkpointId, snapshot } = await checkpointOf(mb);
      result[`spawn_${label}_ms`] = stats(await measure(() => create(`/api/sandboxes/from-checkpoint/${checkpointId}`)));
      await call('DELETE', `/api/snapshots/${snapshot}`);
    }
  }
  return result;
}
