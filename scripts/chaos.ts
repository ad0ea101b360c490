import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { batchSessionId } from '../lib/batch-ids';
import { sandboxIdForSession } from '../lib/naming';
import { countRuns, defaultAuditLogPath } from '../sandbox';
import { defaultScratchDir } from '../sandbox';
import type { BaseProcName as ProcName } from './launcher';
import { STACK_FILE, N_SESSIONS, N_BATCH, CONCURRENCY, SEED, KILL_PLAN, sleep, initialStack, HOST_URL, hostToken, readStack } from './chaos/config';
import { hostDirs, PRODUCTION } from './chaos/config';
import { httpStats, agent, once, call } from './chaos/client';
import { AGENT_SCRIPT, SHORT_TIMEOUT_S, makeTask, runSession, runBatch, type Kind, type SessionRecord } from './chaos/workload';
import { closeTemporal, killLoop, type KillRecord } from './chaos/kills';

/**
 * `npm run chaos`: sessions and a batch against a running `npm start` stack while its processes are
 * killed with SIGKILL, then checks that nothing was lost, run twice or left behind. Prints one JSON
 * line; exits 1 when a check fails. Not part of `npm test`.
 *
 *   DATA_DIR=… npm run chaos -- [--sessions 300] [--batch 300] [--c 30] [--kills worker=5,host=2,api=2,mongo=1,temporal=1] [--seed N]
 *   DATA_DIR=.data/production npm run chaos -- --profile production …   (against npm run start:production)
 *
 * It reads `<DATA_DIR>/stack.json` (written by npm start's supervisor) for the processes' pids and
 * addresses, and `<DATA_DIR>/audit/entrypoints.ndjson` (the sandbox host's entrypoint audit log)
 * to count how many times each session's agent was started. `--kills none` runs the workload and
 * the checks without killing anything.
 */
// ---------------------------------------------------------------------------------------------
// The checks after the run.

/** Entrypoint runs per session id, from the sandbox host's audit log: distinct runs its helpers claimed (see countRuns). */
function runsPerSession(): Map<string, number> {
  const files = process.env.SANDBOX_AUDIT_LOG ? [process.env.SANDBOX_AUDIT_LOG] : hostDirs().map((d) => defaultAuditLogPath(d));
  return countRuns(
    files
      .filter((f) => !PRODUCTION || fs.existsSync(f))
      .map((f) => fs.readFileSync(f, 'utf8'))
      .join('\n'),
  );
}

interface Leftovers {
  hostList: string[];
  cgroups: string[];
  mounts: string[];
  dirs: string[];
  scratch: string[];
}

/** What is left of the given sandboxes (and of killed hosts' spare inits) on this machine. */
async function leftovers(sandboxIds: Set<string>, deadHostPids: number[]): Promise<Leftovers> {
  const out: Leftovers = { hostList: [], cgroups: [], mounts: [], dirs: [], scratch: [] };
  for (const url of PRODUCTION ? (readStack()?.hostUrls ?? [HOST_URL]) : [HOST_URL]) {
    const a = await once('GET', `${url}/sandboxes`, undefined, { authorization: `Bearer ${hostToken()}` }, 10_000).catch(() => null);
    if (a?.status === 200) out.hostList.push(...(a.json as { id: string }[]).map((s) => s.id).filter((id) => sandboxIds.has(id)));
    else out.hostList.push(`(host list of ${url} unavailable: ${a?.status ?? 'no answer'})`);
  }
  for (const c of ['memory', 'pids', 'cpu', 'cpuacct', 'freezer']) {
    const dir = path.join('/sys/fs/cgroup', c, 'sap');
    for (const name of fs.existsSync(dir) ? fs.readdirSync(dir) : []) {
      if (sandboxIds.has(name) || deadHostPids.some((p) => name.startsWith(`spare-${p}-`))) out.cgroups.push(`${c}/sap/${name}`);
    }
  }
  const mountinfo = fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n');
  for (const dir of hostDirs()) {
    const scratch =
      process.env.SANDBOX_SCRATCH_DIR && process.env.SANDBOX_SCRATCH_DIR !== 'off' ? path.resolve(process.env.SANDBOX_SCRATCH_DIR) : defaultScratchDir(dir);
    for (const l of mountinfo) if (l.includes(path.join(dir, 'sandboxes')) || l.includes(scratch)) out.mounts.push(l);
    const sbDir = path.join(dir, 'sandboxes');
    for (const name of fs.existsSync(sbDir) ? fs.readdirSync(sbDir) : []) if (sandboxIds.has(name)) out.dirs.push(name);
    for (const name of fs.existsSync(scratch) ? fs.readdirSync(scratch) : []) if (sandboxIds.has(name)) out.scratch.push(name);
  }
  return out;
}

const leftoverCount = (l: Leftovers) => l.hostList.length + l.cgroups.length + l.mounts.length + l.dirs.length + l.scratch.length;

function summary(xs: number[]): { n: number; median_ms: number | null; max_ms: number | null; all_ms: number[] } {
  const s = [...xs].sort((a, b) => a - b);
  return { n: s.length, median_ms: s.length ? s[Math.floor((s.length - 1) / 2)]! : null, max_ms: s.length ? s[s.length - 1]! : null, all_ms: xs };
}

async function main(): Promise<void> {
  const killing = Object.values(KILL_PLAN).some((n) => n > 0);
  if (killing && !initialStack) throw new Error(`${STACK_FILE} not found: run against npm start (with its supervisor), or pass --kills none`);
  const t0 = Date.now();
  const runId = `${Date.now().toString(36)}${SEED.toString(36)}`;
  const work = `chaos-${runId}`;
  const slow = `chaos-${runId}-slow`;
  for (const [id, timeoutSeconds] of [
    [work, 60],
    [slow, SHORT_TIMEOUT_S],
  ] as const) {
    const a = await call('POST', '/v1/agents', { id, core: 'bash', entrypoint: ['bash', '-c', AGENT_SCRIPT], timeoutSeconds });
    if (a.status !== 201 && a.status !== 409) throw new Error(`create agent ${id}: ${a.status} ${a.text}`);
  }

  const kills: KillRecord[] = [];
  const deadHostPids: number[] = [];
  let killsDone = !killing;
  const killer = killing
    ? killLoop(kills, deadHostPids).finally(() => {
        killsDone = true;
      })
    : Promise.resolve();

  // At least N_SESSIONS sessions, and more while kills remain, CONCURRENCY at a time; the batch beside them.
  const sessions: SessionRecord[] = [];
  const batch = runBatch(work, runId);
  const mix: [Kind, number][] = [
    ['quick', 0.4],
    ['sleep', 0.3],
    ['fail', 0.2],
    ['timeout', 0.1],
  ];
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (sessions.length < N_SESSIONS || !killsDone) {
        const n = sessions.length;
        const task = makeTask(n, `s-${runId}`, mix);
        const rec: SessionRecord = { n, task, agentId: task.kind === 'timeout' ? slow : work };
        sessions.push(rec);
        await runSession(rec, runId).catch((err) => {
          rec.lost = `client gave up: ${(err as Error).message}`;
        });
      }
    }),
  );
  const [b] = await Promise.all([batch, killer]);
  const workloadS = (Date.now() - t0) / 1000;

  // Runs per session from the audit log: each session once; each batch item once per attempt it deserved.
  const runs = runsPerSession();
  const duplicates: { session: string; runs: number }[] = [];
  const neverRan: string[] = [];
  const expectRuns = (id: string, want: number) => {
    const got = runs.get(id) ?? 0;
    if (got > want) duplicates.push({ session: id, runs: got });
    if (got < want) neverRan.push(id);
  };
  for (const s of sessions) if (s.id) expectRuns(s.id, 1);
  const sandboxIds = new Set<string>(sessions.filter((s) => s.id).map((s) => sandboxIdForSession(s.id!)));
  for (let i = 0; i < N_BATCH; i++) {
    for (let a = 1; a <= 3; a++) {
      const id = batchSessionId(b.id, i, a);
      expectRuns(id, a <= b.expectedAttempts[i]! ? 1 : 0);
      sandboxIds.add(sandboxIdForSession(id));
    }
  }

  // Sandboxes are destroyed just after a session's ending is recorded, and the worker's reaper
  // sweeps what a crash left: wait (bounded) for the count to reach zero.
  let left = await leftovers(sandboxIds, deadHostPids);
  const leftDeadline = Date.now() + 120_000;
  while (leftoverCount(left) > 0 && Date.now() < leftDeadline) {
    await sleep(2000);
    left = await leftovers(sandboxIds, deadHostPids);
  }
  await closeTemporal();

  const byKind: Record<string, number> = {};
  for (const s of sessions) byKind[s.task.kind] = (byKind[s.task.kind] ?? 0) + 1;
  const lost = sessions.filter((s) => s.lost);
  const wrong = sessions.filter((s) => s.wrong);
  const recovery: Record<string, ReturnType<typeof summary>> = {};
  for (const name of Object.keys(KILL_PLAN) as ProcName[]) {
    const ks = kills.filter((k) => k.name === name);
    if (ks.length) recovery[name] = summary(ks.filter((k) => k.recoveryMs !== null).map((k) => k.recoveryMs!));
  }
  const notRecovered = kills.filter((k) => k.recoveryMs === null).length;
  const http500 = httpStats.serverErrors.filter((e) => e.status === 500).length;
  const batchLost = b.missing.length;
  const ok =
    lost.length === 0 &&
    wrong.length === 0 &&
    duplicates.length === 0 &&
    neverRan.length === 0 &&
    leftoverCount(left) === 0 &&
    httpStats.serverErrors.length === 0 &&
    httpStats.bad503Bodies === 0 &&
    b.lines === N_BATCH &&
    b.status === 'completed' &&
    batchLost === 0 &&
    b.duplicateLines.length === 0 &&
    b.wrong.length === 0 &&
    notRecovered === 0 &&
    kills.length === Object.values(KILL_PLAN).reduce((x, y) => x + y, 0);

  const out = {
    chaos: ok ? 'pass' : 'FAIL',
    cores: os.cpus().length,
    seed: SEED,
    seconds: Math.round(workloadS),
    concurrency: CONCURRENCY,
    sessions: {
      total: sessions.length,
      by_kind: byKind,
      lost: lost.length,
      wrong: wrong.length,
      samples: [...lost, ...wrong].slice(0, 10).map((s) => ({ n: s.n, kind: s.task.kind, id: s.id, lost: s.lost, wrong: s.wrong })),
    },
    batch: {
      id: b.id,
      items: N_BATCH,
      status: b.status,
      counts: b.counts,
      results_file: b.linesFile,
      lines: b.lines,
      missing: batchLost,
      duplicate_lines: b.duplicateLines.length,
      wrong: b.wrong.length,
      samples: b.wrong.slice(0, 10),
    },
    runs: {
      recorded: [...runs.values()].reduce((x, y) => x + y, 0),
      duplicates: duplicates.length,
      never_ran: neverRan.length,
      samples: [...duplicates.slice(0, 10), ...neverRan.slice(0, 10)],
    },
    kills: Object.fromEntries(Object.keys(KILL_PLAN).map((n) => [n, kills.filter((k) => k.name === n).length])),
    not_recovered: notRecovered,
    recovery,
    leftovers: {
      total: leftoverCount(left),
      host_list: left.hostList.length,
      cgroups: left.cgroups.length,
      mounts: left.mounts.length,
      dirs: left.dirs.length,
      scratch: left.scratch.length,
      samples: [...left.hostList, ...left.cgroups, ...left.dirs, ...left.scratch, ...left.mounts].slice(0, 10),
    },
    http: {
      requests: httpStats.requests,
      retries: httpStats.retries,
      connection_errors: httpStats.connectionErrors,
      by_status: httpStats.byStatus,
      http_500: http500,
      other_5xx: httpStats.serverErrors.length - http500,
      bad_503_bodies: httpStats.bad503Bodies,
      samples_5xx: httpStats.serverErrors.slice(0, 10),
    },
  };
  process.stdout.write(`${JSON.stringify(out)}\n`);
  agent.destroy();
  process.exit(ok ? 0 : 1);
}

main().catch((err) => {
  process.stderr.write(`chaos: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(2);
});
