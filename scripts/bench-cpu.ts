import { readdirSync, readFileSync } from 'node:fs';

/**
 * The CPU a stack spends, from /proc: every process descending from the stack's root (`npm start`'s
 * `node dist/scripts/stack.js`: API, worker, sandbox host and its spawner, Temporal, FerretDB, and
 * the sandboxes' own processes, which all descend from the host), utime + stime + cutime + cstime
 * (a process that has ended is in its parent's cutime/cstime once reaped). In clock ticks.
 */
const TICK_MS = 1000 / 100; // USER_HZ: 100 on Linux

/** pid → parent pid, and comm, of every process now. */
function processTable(): Map<number, { ppid: number; comm: string; ticks: number }> {
  const out = new Map<number, { ppid: number; comm: string; ticks: number }>();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'latin1');
      const close = stat.lastIndexOf(')');
      let comm = stat.slice(stat.indexOf('(') + 1, close);
      // node processes by their script (api, worker, host …), not all as "node".
      if (comm === 'node') comm = `node ${(readFileSync(`/proc/${name}/cmdline`, 'latin1').split('\0')[1] ?? '').split('/').slice(-2).join('/')}`;
      // After ") ": state(3) ppid(4) … utime(14) stime(15) cutime(16) cstime(17).
      const f = stat.slice(close + 2).split(' ');
      const ticks = Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
      out.set(Number(name), { ppid: Number(f[1]), comm, ticks });
    } catch {
      /* gone meanwhile */
    }
  }
  return out;
}

/** The root and every process below it. */
export function stackPids(root: number): number[] {
  const table = processTable();
  const children = new Map<number, number[]>();
  for (const [pid, p] of table) children.set(p.ppid, [...(children.get(p.ppid) ?? []), pid]);
  const out: number[] = [];
  const todo = [root];
  while (todo.length) {
    const pid = todo.pop()!;
    if (!table.has(pid)) continue;
    out.push(pid);
    todo.push(...(children.get(pid) ?? []));
  }
  return out;
}

/** CPU of the stack below `root` so far, in ms, in total and per process name. */
export function stackCpuMs(root: number): { total: number; byName: Record<string, number> } {
  const table = processTable();
  const pids = new Set(stackPids(root));
  let total = 0;
  const byName: Record<string, number> = {};
  for (const pid of pids) {
    const p = table.get(pid);
    if (!p) continue;
    total += p.ticks * TICK_MS;
    byName[p.comm] = (byName[p.comm] ?? 0) + p.ticks * TICK_MS;
  }
  return { total, byName };
}

/**
 * The stack's root: `pid` when given, else the one process running scripts/stack.js whose PORT
 * (default 8080) is the API URL's port. Throws when none or several match.
 */
export function findStackRoot(apiUrl: string, pid?: number): number {
  if (pid) return pid;
  const port = new URL(apiUrl).port || '80';
  const found: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (!readFileSync(`/proc/${name}/cmdline`, 'latin1').includes('scripts/stack.js')) continue;
      const env = readFileSync(`/proc/${name}/environ`, 'latin1').split('\0');
      const p = env.find((e) => e.startsWith('PORT='))?.slice(5) || '8080';
      if (p === port) found.push(Number(name));
    } catch {
      /* gone, or not ours to read */
    }
  }
  if (found.length !== 1) throw new Error(`cpu: ${found.length} stacks (scripts/stack.js) answer on port ${port}; give --stack-pid`);
  return found[0]!;
}

/**
 * The idle pool of the stack's sandbox hosts: spare init helpers (cgroups `sap/spare-<host pid>-…`
 * of a process of the stack) — how many, the memory their cgroups are charged (memory.usage_in_bytes)
 * and their processes' proportional set size (Pss of /proc/<pid>/smaps_rollup), in KiB.
 */
export function poolMemory(root: number): { spares: number; cgroup_kib: number; pss_kib: number } {
  const pids = new Set(stackPids(root).map(String));
  let spares = 0;
  let charged = 0;
  let pss = 0;
  for (const name of readdirSync('/sys/fs/cgroup/memory/sap')) {
    const m = /^spare-(\d+)-/.exec(name);
    if (!m || !pids.has(m[1]!)) continue;
    spares++;
    try {
      charged += Number(readFileSync(`/sys/fs/cgroup/memory/sap/${name}/memory.usage_in_bytes`, 'utf8')) / 1024;
      for (const pid of readFileSync(`/sys/fs/cgroup/memory/sap/${name}/cgroup.procs`, 'utf8').split('\n').filter(Boolean)) {
        const kib = /^Pss:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'))?.[1];
        pss += Number(kib ?? 0);
      }
    } catch {
      /* claimed meanwhile */
    }
  }
  return { spares, cgroup_kib: Math.round(charged), pss_kib: pss };
}

/** CPU per session (ms) of each process name between two stackCpuMs readings, and of the whole stack; names under 0.1 ms left out. */
export function cpuPerSession(a: ReturnType<typeof stackCpuMs>, b: ReturnType<typeof stackCpuMs>, n: number): Record<string, number> {
  const out: Record<string, number> = { total: Math.round(((b.total - a.total) / n) * 10) / 10 };
  for (const [name, ms] of Object.entries(b.byName)) {
    const per = Math.round(((ms - (a.byName[name] ?? 0)) / n) * 10) / 10;
    if (per >= 0.1) out[name] = per;
  }
  return out;
}
