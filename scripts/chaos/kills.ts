/** `npm run chaos`'s kills: SIGKILLs the stack's processes one at a time and waits for each to come back. */
import net from 'node:net';
import type { BaseProcName as ProcName } from '../launcher';
import {
  STACK_FILE,
  TASK_QUEUE,
  KILL_PLAN,
  SAME_PROCESS_SPACING_MS,
  RECOVERY_LIMIT_MS,
  rand,
  between,
  sleep,
  readStack,
  API,
  TEMPORAL_ADDRESS,
} from './config';
import { once } from './client';

// ---------------------------------------------------------------------------------------------
// The kills.

export function alive(pid: number | undefined): boolean {
  if (!pid) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

export async function httpOk(url: string, headers: Record<string, string> = {}): Promise<boolean> {
  try {
    const a = await once('GET', url, undefined, headers, 3000);
    return a.status === 200;
  } catch {
    return false;
  }
}

/** The connection workerPolls asks Temporal through; closeTemporal ends it. */
let temporalConnection: import('@temporalio/client').Connection | null = null;

/** True when a worker with this pid has polled the shared task queue since `sinceMs` (Temporal's DescribeTaskQueue). */
export async function workerPolls(pid: number, sinceMs: number): Promise<boolean> {
  const { Connection } = await import('@temporalio/client');
  try {
    temporalConnection ??= await Connection.connect({ address: TEMPORAL_ADDRESS, connectTimeout: 2000 });
    const r = await temporalConnection.withDeadline(Date.now() + 3000, () =>
      temporalConnection!.workflowService.describeTaskQueue({
        namespace: process.env.TEMPORAL_NAMESPACE ?? 'default',
        taskQueue: { name: TASK_QUEUE, kind: 1 },
        taskQueueType: 1,
      }),
    );
    return (r.pollers ?? []).some((p) => {
      const seen = p.lastAccessTime?.seconds ? Number(p.lastAccessTime.seconds) * 1000 + Math.floor((p.lastAccessTime.nanos ?? 0) / 1e6) : 0;
      return p.identity?.startsWith(`${pid}@`) && seen >= sinceMs;
    });
  } catch {
    await temporalConnection?.close().catch(() => undefined);
    temporalConnection = null;
    return false;
  }
}

export const tcpOpen = (url: string) =>
  new Promise<boolean>((resolve) => {
    const u = new URL(url);
    const s = net.connect(Number(u.port), u.hostname);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });

/**
 * True once the killed process has been replaced (a new pid in stack.json, alive) and the stack
 * answers again: the API's /readyz, plus the replaced process's own readiness (the host's
 * /healthz; a worker with the new pid polling the task queue; FerretDB's port).
 */
export async function recovered(name: ProcName, oldPid: number, killedAt: number): Promise<boolean> {
  const st = readStack();
  const pid = st?.pids[name];
  if (!st || !pid || pid === oldPid || !alive(pid)) return false;
  if (!(await httpOk(`${API}/readyz`))) return false;
  switch (name) {
    case 'api':
      return true;
    case 'host':
      return httpOk(`${st.hostUrl}/healthz`);
    case 'mongo':
      return tcpOpen(st.mongoUrl.replace(/^mongodb/, 'http'));
    case 'worker':
      return workerPolls(pid, killedAt);
    case 'temporal':
      return workerPolls(st.pids.worker ?? 0, killedAt);
  }
}

export interface KillRecord {
  name: ProcName;
  pid: number;
  at: string;
  recoveryMs: number | null;
}

/** The whole stack is up: every pid alive and the API ready. */
export async function stackReady(): Promise<boolean> {
  const st = readStack();
  if (!st) return false;
  for (const n of ['temporal', 'mongo', 'host', 'worker', 'api'] as ProcName[]) if (!alive(st.pids[n])) return false;
  return httpOk(`${API}/readyz`);
}

/** Kills each process as often as KILL_PLAN says, in a random order at random moments, one at a time. */
export async function killLoop(kills: KillRecord[], deadHostPids: number[]): Promise<void> {
  const order: ProcName[] = [];
  for (const [name, n] of Object.entries(KILL_PLAN) as [ProcName, number][]) for (let i = 0; i < n; i++) order.push(name);
  for (let i = order.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  const lastKill: Partial<Record<ProcName, number>> = {};
  await sleep(3000);
  while (order.length > 0) {
    // The next process that may be killed now; if none may yet, wait for the earliest.
    const now = Date.now();
    const pick = order.findIndex((n) => now - (lastKill[n] ?? 0) >= SAME_PROCESS_SPACING_MS);
    if (pick < 0) {
      await sleep(Math.min(...order.map((n) => SAME_PROCESS_SPACING_MS - (now - (lastKill[n] ?? 0)))));
      continue;
    }
    const name = order.splice(pick, 1)[0]!;
    await sleep(between(1000, 6000));
    const readyBy = Date.now() + RECOVERY_LIMIT_MS;
    while (!(await stackReady()) && Date.now() < readyBy) await sleep(200);
    const pid = readStack()?.pids[name];
    if (!pid || !alive(pid)) throw new Error(`no live ${name} process in ${STACK_FILE}`);
    const killedAt = Date.now();
    process.kill(pid, 'SIGKILL');
    if (name === 'host') deadHostPids.push(pid);
    lastKill[name] = killedAt;
    const rec: KillRecord = { name, pid, at: new Date(killedAt).toISOString(), recoveryMs: null };
    kills.push(rec);
    while (Date.now() - killedAt < RECOVERY_LIMIT_MS) {
      if (await recovered(name, pid, killedAt)) {
        rec.recoveryMs = Date.now() - killedAt;
        break;
      }
      await sleep(100);
    }
    process.stderr.write(`chaos: killed ${name} (pid ${pid}); ${rec.recoveryMs === null ? 'NOT recovered' : `back in ${rec.recoveryMs} ms`}\n`);
  }
}

/** Closes the connection to Temporal workerPolls opened, if any. */
export async function closeTemporal(): Promise<void> {
  await temporalConnection?.close().catch(() => undefined);
}
