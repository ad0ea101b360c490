import type { Client } from '@temporalio/client';
import { temporal } from '@temporalio/proto';
import { optionalTsToMs } from '@temporalio/common/lib/time';
import type { Store } from '../../store';
import { listRecentHosts } from '../../store/hosts';
import type { HostDirectory } from '../hosts/hosts';

/** One check of /readyz: `ok`, or a message saying what is missing, plus details for the body. */
export interface CheckResult {
  ok: boolean;
  message: string;
  details?: Record<string, unknown>;
}

export interface ReadinessReport {
  ok: boolean;
  checks: { mongo: CheckResult; temporal: CheckResult; worker: CheckResult; host: CheckResult };
}

/** A poller Temporal lists on a task queue: who, and when it last started a poll. */
export interface PollerSeen {
  identity: string;
  lastAccessMs: number;
}

/** A worker heartbeat Temporal keeps (ListWorkers): who, its status, and when it was sent. */
export interface HeartbeatSeen {
  identity: string;
  running: boolean;
  atMs: number;
}

/**
 * Whether some worker polls the queue, from what Temporal remembers. Temporal keeps a poller in its
 * list for minutes after the worker died, and a live idle worker refreshes its entry only when it
 * starts a new long poll; a worker's heartbeat is refreshed on a fixed interval. So a worker counts as
 * alive when its newest heartbeat (RUNNING) or one of its polls is younger than `maxAgeMs`, unless its
 * newest heartbeat says it is shutting down (a worker stopped with SIGTERM says so before it goes).
 * `heartbeats` is null when the server does not offer them (then pollers alone decide).
 */
export function judgeWorkers(input: { pollers: PollerSeen[]; heartbeats: HeartbeatSeen[] | null; nowMs: number; maxAgeMs: number }): {
  alive: string[];
  lastSeenMsAgo: number | null;
  stopping: string[];
} {
  const { nowMs, maxAgeMs } = input;
  const newestBeat = new Map<string, HeartbeatSeen>();
  for (const hb of input.heartbeats ?? []) {
    const prev = newestBeat.get(hb.identity);
    if (!prev || hb.atMs > prev.atMs) newestBeat.set(hb.identity, hb);
  }
  const lastSeen = new Map<string, number>();
  const see = (identity: string, atMs: number) => lastSeen.set(identity, Math.max(atMs, lastSeen.get(identity) ?? 0));
  for (const p of input.pollers) see(p.identity, p.lastAccessMs);
  for (const hb of newestBeat.values()) if (hb.running) see(hb.identity, hb.atMs);

  const alive: string[] = [];
  const stopping: string[] = [];
  let newest: number | null = null;
  for (const [identity, atMs] of lastSeen) {
    const beat = newestBeat.get(identity);
    if (beat && !beat.running) {
      stopping.push(identity);
      continue;
    }
    newest = Math.max(newest ?? 0, atMs);
    if (nowMs - atMs <= maxAgeMs) alive.push(identity);
  }
  return { alive: alive.sort(), lastSeenMsAgo: newest === null ? null : Math.max(0, nowMs - newest), stopping: stopping.sort() };
}

/** Rejects with `what timed out` when `p` takes longer than `ms` (a hung dependency must not hang /readyz). */
async function within<T>(ms: number, what: string, p: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what} did not answer within ${ms} ms`)), ms))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

const errText = (err: unknown): string => (err instanceof Error ? err.message : String(err));
const { TaskQueueType, TaskQueueKind, WorkerStatus } = temporal.api.enums.v1;

/** How long each dependency may take to answer a readiness probe. */
const PROBE_TIMEOUT_MS = 3_000;
/** Registered sandbox hosts probed at most. */
const MAX_HOSTS = 20;

/**
 * The API's readiness: MongoDB answers, Temporal answers, some worker polls the shared task queue,
 * and a sandbox host answers. One evaluation is shared by every probe for `cacheMs`, so a burst of
 * /readyz calls costs one round trip to each dependency.
 */
export class Readiness {
  private cached: { at: number; report: Promise<ReadinessReport> } | undefined;

  constructor(
    private readonly deps: {
      store: Store;
      temporal: Client;
      hosts: HostDirectory;
      namespace: string;
      taskQueue: string;
      /** A worker unseen for longer than this is taken for gone. */
      workerMaxAgeMs: number;
      cacheMs?: number;
    },
  ) {}

  check(): Promise<ReadinessReport> {
    const now = Date.now();
    if (this.cached && now - this.cached.at < (this.deps.cacheMs ?? 1_500)) return this.cached.report;
    const report = this.evaluate();
    this.cached = { at: now, report };
    return report;
  }

  private async evaluate(): Promise<ReadinessReport> {
    const settle = (p: Promise<CheckResult>): Promise<CheckResult> => p.catch((err) => ({ ok: false, message: errText(err) }));
    const [mongo, temporalCheck, worker, host] = await Promise.all([
      settle(within(PROBE_TIMEOUT_MS, 'mongo', this.deps.store.ping()).then(() => ({ ok: true, message: 'ok' }))),
      settle(this.temporalCall(() => this.deps.temporal.workflowService.getSystemInfo({})).then(() => ({ ok: true, message: 'ok' }))),
      settle(this.workerCheck()),
      settle(this.hostCheck()),
    ]);
    const checks = { mongo, temporal: temporalCheck, worker, host };
    return { ok: Object.values(checks).every((c) => c.ok), checks };
  }

  private temporalCall<T>(fn: () => Promise<T>): Promise<T> {
    return this.deps.temporal.connection.withDeadline(Date.now() + PROBE_TIMEOUT_MS, fn);
  }

  private async workerCheck(): Promise<CheckResult> {
    const { namespace, taskQueue, workerMaxAgeMs } = this.deps;
    const svc = this.deps.temporal.workflowService;
    const describe = (taskQueueType: temporal.api.enums.v1.TaskQueueType) =>
      this.temporalCall(() => svc.describeTaskQueue({ namespace, taskQueue: { name: taskQueue, kind: TaskQueueKind.TASK_QUEUE_KIND_NORMAL }, taskQueueType }));
    const [wf, act, listed] = await Promise.all([
      describe(TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
      describe(TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
      // Worker heartbeats need a recent server; without them the pollers decide alone.
      this.temporalCall(() => svc.listWorkers({ namespace, pageSize: 100, query: `TaskQueue = '${taskQueue}'` })).catch(() => null),
    ]);
    const pollers: PollerSeen[] = [...wf.pollers, ...act.pollers].map((p) => ({
      identity: p.identity ?? '',
      lastAccessMs: optionalTsToMs(p.lastAccessTime) ?? 0,
    }));
    const heartbeats: HeartbeatSeen[] | null = listed
      ? listed.workersInfo.flatMap((w) => {
          const hb = w.workerHeartbeat;
          if (!hb || hb.taskQueue !== taskQueue) return [];
          return [
            { identity: hb.workerIdentity ?? '', running: hb.status === WorkerStatus.WORKER_STATUS_RUNNING, atMs: optionalTsToMs(hb.heartbeatTime) ?? 0 },
          ];
        })
      : null;
    const judged = judgeWorkers({ pollers, heartbeats, nowMs: Date.now(), maxAgeMs: workerMaxAgeMs });
    const details = { taskQueue, alive: judged.alive, stopping: judged.stopping, lastSeenMsAgo: judged.lastSeenMsAgo, heartbeats: heartbeats !== null };
    if (judged.alive.length) return { ok: true, message: 'ok', details };
    const seen = judged.lastSeenMsAgo === null ? 'none seen' : `last seen ${Math.round(judged.lastSeenMsAgo / 1000)} s ago`;
    const stopping = judged.stopping.length ? `; shutting down: ${judged.stopping.join(', ')}` : '';
    return { ok: false, message: `no worker is polling task queue ${taskQueue} (${seen}${stopping})`, details };
  }

  private async hostCheck(): Promise<CheckResult> {
    const docs = await within(PROBE_TIMEOUT_MS, 'mongo', listRecentHosts(this.deps.store, MAX_HOSTS));
    if (!docs.length) return { ok: false, message: 'no sandbox host is registered (a worker registers its host when it starts)' };
    const answers = await Promise.all(
      docs.map(async (doc) => {
        try {
          const client = await this.deps.hosts.get(doc._id);
          await client.health({ signal: AbortSignal.timeout(PROBE_TIMEOUT_MS) });
          return { hostId: doc._id, ok: true as const };
        } catch (err) {
          return { hostId: doc._id, ok: false as const, error: errText(err) };
        }
      }),
    );
    const details = { hosts: Object.fromEntries(answers.map((a) => [a.hostId, a.ok ? 'ok' : `error: ${a.error}`])) };
    // Any answering host can take new sandboxes; the details show the others.
    if (answers.some((a) => a.ok)) return { ok: true, message: 'ok', details };
    const down = answers.map((a) => `${a.hostId} (${a.ok ? 'ok' : a.error})`).join(', ');
    return { ok: false, message: `sandbox host does not answer: ${down}`, details };
  }
}

/** The 503 message: each failing check, by name. */
export function notReadyMessage(report: ReadinessReport): string {
  const failing = Object.entries(report.checks).filter(([, c]) => !c.ok);
  return `not ready: ${failing.map(([name, c]) => `${name}: ${c.message}`).join('; ')}`;
}
